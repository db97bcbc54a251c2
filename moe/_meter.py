"""What a conversion costs: its wall time and the process's peak resident memory while it ran.

Cost is part of a MoEfication's result (a recipe that needs 11 hours is not one a user runs), so
every conversion is metered and the numbers travel in the model's quality block
(`Quality.convert_s`, `Quality.convert_peak_rss_mib`), measured on the machine that converted it.

Before an option is converted its cost is estimated (`estimate_convert_s`) from rates measured
on this project's 2-core machine, so `moelambda choose --max-convert-minutes` can skip what would
not convert in time; once converted, the measured cost is what counts (`conversion_cost`).

Both are measured by `ConversionMeter` (`moe._conversion_meter`), re-exported here for the
script that measures the rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe._conversion_meter import ConversionMeter
from moe._options import MoefyOptions
from moe._registry import ModelSource, resolve_model

__all__ = ["ConversionCost", "ConversionMeter", "conversion_cost", "estimate_convert_s"]

# Conversion rates measured on this project's 2-core machine (docs/model.md says how).
RATES_FILE = Path(__file__).parent / "data" / "convert_rates.json"


@dataclass(frozen=True)
class ConversionCost:
    """What converting an option costs: measured when it was converted (it is cached), else
    estimated from `RATES_FILE`."""

    seconds: float
    peak_rss_mib: float | None
    measured: bool

    @property
    def minutes(self) -> float:
        return self.seconds / 60.0


def _rates() -> dict[str, Any]:
    return json.loads(RATES_FILE.read_text())


def _work(source: ModelSource) -> float | None:
    """Layers x hidden x FFN width of a model directory (None when its config says less)."""
    try:
        config = json.loads((source.path / "config.json").read_text())
        return float(
            config["num_hidden_layers"] * config["hidden_size"] * config["intermediate_size"]
        )
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def estimate_convert_s(model: str, options: MoefyOptions) -> float:
    """Seconds converting `options` of `model` takes on the machine `RATES_FILE` was measured
    on: a fixed part, the fit text's forward and fits, layer-local steps and distillation
    steps, each at its measured rate. A model not in the file is scaled from the reference
    model by its layers x hidden x FFN width (an estimate; the measured time is recorded once
    it is converted)."""
    rates = _rates()
    models = rates["models"]
    if model in models:
        rate, scale = models[model], 1.0
    else:
        rate = models[rates["reference"]]
        work = _work(resolve_model(model))
        scale = 1.0 if work is None else work / float(rate["work"])
    return scale * (
        rate["base_s"]
        + rate["fit_s_per_1k_tokens"] * options.fit_tokens / 1000
        + rate["local_s_per_step"] * options.local_steps
        + rate["distil_s_per_step"] * options.distil_steps
    )


def conversion_cost(model: str, options: MoefyOptions) -> ConversionCost:
    """The recorded cost of `options` when the model cache holds it with one, else the
    estimate (`estimate_convert_s`)."""
    from moe._cache import cached_export_dir

    entry = cached_export_dir(
        model, experts=options.experts, top_k=options.top_k.k, options=options
    )
    if entry is not None:
        quality = json.loads((entry / "manifest.json").read_text()).get("quality") or {}
        if quality.get("convert_s") is not None:
            return ConversionCost(
                float(quality["convert_s"]), quality.get("convert_peak_rss_mib"), measured=True
            )
    return ConversionCost(estimate_convert_s(model, options), None, measured=False)
