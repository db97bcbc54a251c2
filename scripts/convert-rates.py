"""Measure the conversion rates `moe/data/convert_rates.json` holds, on this machine.

    python scripts/convert-rates.py [--models smollm2,minilm] [--write]

Per model, three conversions (nothing cached, no quality measured), each timed:
E = 8, k = 4 with the correction on 2,048 and on 8,192 fit tokens (the fixed part and the rate
per 1,000 fit tokens), then 2,048 fit tokens with 20 layer-local steps (a step's rate over the
first). Prints the rates; `--write` stores them in the file, which `moelambda choose
--max-convert-minutes` estimates unconverted options from (update its `source` note by hand).
A distillation step is not timed here: a short run is dominated by its 20 validation checks;
its rate comes from a long run (docs/model.md). About 6 minutes for SmolLM2 and 1 for MiniLM
on 2 cores.
"""

from __future__ import annotations

import argparse
import json

from moe._meter import RATES_FILE, ConversionMeter
from moe._model import build_model, moefy_options

SMALL, LARGE, LOCAL = 2048, 8192, 20


def _seconds(model: str, **options: int) -> float:
    with ConversionMeter() as meter:
        build_model(
            model,
            options=moefy_options(8, 4, correction=True, **options),  # type: ignore[arg-type]
            quality_tokens=0,
        )
    print(f"  {model} {options}: {meter.seconds:.1f} s", flush=True)
    return meter.seconds


def rates(model: str) -> dict[str, float]:
    small = _seconds(model, fit_tokens=SMALL)
    large = _seconds(model, fit_tokens=LARGE)
    per_1k = (large - small) / ((LARGE - SMALL) / 1000)
    local = _seconds(model, fit_tokens=SMALL, local_steps=LOCAL)
    return {
        "base_s": round(small - per_1k * SMALL / 1000, 1),
        "fit_s_per_1k_tokens": round(per_1k, 2),
        "local_s_per_step": round((local - small) / LOCAL, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,minilm")
    parser.add_argument("--write", action="store_true", help=f"store them in {RATES_FILE}")
    args = parser.parse_args()
    data = json.loads(RATES_FILE.read_text())
    for model in args.models.split(","):
        measured = rates(model)
        print(model, json.dumps(measured), flush=True)
        data["models"].setdefault(model, {}).update(measured)
    if args.write:
        RATES_FILE.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
