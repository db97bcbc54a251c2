"""Per-layer checkpoints of a conversion, so that a stopped one resumes where it stopped.

A conversion with layer-local training takes tens of minutes; a laptop that sleeps or a killed
job must not lose it. `moe._model._fit_sequential` saves each finished layer at once (its
experts, gate, shared part and fit, and the seconds the conversion had taken) to
``<entry>.partial/layer-LL.pt`` beside the cache entry, and reads back the layers it finds there.
A file is written to a temporary name and renamed, so a layer is there whole or not at all; the
options are stored with it and a file of other options is ignored (the directory is named by
the cache key, so that takes a hand-made copy). The directory is removed once the model is
cached (`moe._cache.load_model`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from moe._experts import ExpertBank, Router, SharedExpert
from moe._moefy import LayerFit, MoefiedLayer
from moe._options import MoefyOptions

__all__ = ["checkpoint_seconds", "load_layers", "save_layer"]


def _file(directory: Path, index: int) -> Path:
    return directory / f"layer-{index:02d}.pt"


def _optional(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


def save_layer(
    directory: Path, index: int, layer: MoefiedLayer, options: MoefyOptions, seconds: float
) -> None:
    """Write layer `index` (and the conversion's `seconds` so far) to `directory`."""
    bank, router, shared = layer.bank, layer.router, layer.shared
    state: dict[str, Any] = {
        "options": options.model_dump_json(),
        "seconds": float(seconds),
        "kind": bank.kind,
        "act": bank.act,
        "w_in": bank.w_in.detach().clone(),
        "b_in": _optional(bank.b_in),
        "w_out": bank.w_out.detach().clone(),
        "b_out": _optional(bank.b_out),
        "router_weight": router.linear.weight.detach().clone(),
        "router_bias": _optional(router.linear.bias),
        "fit": [layer.fit.router_accuracy, layer.fit.mass_captured, layer.fit.ffn_rel_error],
        "shared": None
        if shared is None
        else {
            "w_in": shared.w_in.detach().clone(),
            "b_in": _optional(shared.b_in),
            "w_out": shared.w_out.detach().clone(),
            "b_out": shared.b_out.detach().clone(),
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = _file(directory, index)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _layer(state: dict[str, Any], options: MoefyOptions) -> MoefiedLayer:
    weight = state["router_weight"]
    linear = torch.nn.Linear(
        weight.shape[1], weight.shape[0], bias=state["router_bias"] is not None
    )
    with torch.no_grad():
        linear.weight.copy_(weight)
        if state["router_bias"] is not None:
            linear.bias.copy_(state["router_bias"])
    linear.requires_grad_(False)
    bank = ExpertBank(
        state["w_in"],
        state["b_in"],
        state["w_out"],
        kind=state["kind"],
        act=state["act"],
        b_out=state["b_out"],
    )
    part = state["shared"]
    shared = (
        None
        if part is None
        else SharedExpert(
            part["w_in"],
            part["b_in"],
            part["w_out"],
            part["b_out"],
            kind=state["kind"],
            act=state["act"],
        )
    )
    router = Router(linear, top_k=options.top_k, weighting="unit")
    return MoefiedLayer(bank, router, shared, LayerFit(*state["fit"]))


def _states(directory: Path, options: MoefyOptions) -> list[dict[str, Any]]:
    """The saved states of layers 0, 1, ... up to the first missing one (or one of other
    options, or unreadable: it is fitted again)."""
    states = []
    while (path := _file(directory, len(states))).is_file():
        try:
            state = torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged file is refitted, never trusted
            break
        if state.get("options") != options.model_dump_json():
            break
        states.append(state)
    return states


def load_layers(directory: Path, options: MoefyOptions) -> list[MoefiedLayer]:
    """The layers of `options` saved in `directory`, in order (empty when there are none)."""
    return [_layer(state, options) for state in _states(directory, options)]


def checkpoint_seconds(directory: Path, options: MoefyOptions) -> float:
    """Seconds the conversion had taken when its last saved layer was written (0 if none)."""
    states = _states(directory, options)
    return float(states[-1]["seconds"]) if states else 0.0
