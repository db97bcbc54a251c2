"""Weight export: one safetensors file per stage, laid out as the functions read them from S3.

Layout under the export directory (the same relative keys go under the weights prefix in S3):

    manifest.json                  model identity, stage list, byte sizes (the planner's P_{e,i})
    config/                        the Hugging Face config and tokenizer files
    head.safetensors               embeddings
    layers/LL/layer.safetensors    the previous layer's combine (if any), block LL and its gate
    layers/LL/experts/EE.safetensors
    tail.safetensors               the last layer's combine, final norm and task head

A layer function runs the previous layer's combine because it is the one that gathers the expert
outputs of that layer; the tail does the same for the last layer. A layer's shared expert (and
its correction bias) sits in its layer file: the layer function runs it on every token.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from ground.files import write_atomically
from ground.manifest import (
    HEAD_KEY,
    MANIFEST_VERSION,
    TAIL_KEY,
    Manifest,
    StageEntry,
    expert_key,
    layer_key,
)
from ground.precision import ACTIVATION_DTYPE
from moe._moe_model import MoEModel

__all__ = ["describe_model", "export_model"]


def _prefixed(prefix: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Tied weights (SmolLM2's lm_head is its embedding) must be separate tensors on disk.
    return {
        f"{prefix}.{k}": v.detach().contiguous().clone() for k, v in module.state_dict().items()
    }


def _stage_tensors(model: MoEModel) -> dict[str, dict[str, torch.Tensor]]:
    files = {HEAD_KEY: _prefixed("head", model.head)}
    for layer in range(model.num_layers):
        tensors = _prefixed("block", model.blocks[layer]) | _prefixed(
            "router", model.routers[layer]
        )
        shared = model.shared_expert(layer)
        if shared is not None:
            tensors |= {
                f"shared.{k}": v.detach().contiguous().clone() for k, v in shared.tensors().items()
            }
        if layer > 0:
            tensors |= _prefixed("combine", model.combines[layer - 1])
        files[layer_key(layer)] = tensors
        bank = model.banks[layer]
        for expert in range(model.experts):
            files[expert_key(layer, expert)] = {
                k: v.contiguous().clone() for k, v in bank.expert_tensors(expert).items()
            }
    files[TAIL_KEY] = _prefixed("combine", model.combines[-1]) | _prefixed("tail", model.tail)
    return files


def _entry(key: str, size: int) -> StageEntry:
    if key == HEAD_KEY:
        return StageEntry(role="head", key=key, bytes=size)
    if key == TAIL_KEY:
        return StageEntry(role="tail", key=key, bytes=size)
    parts = key.split("/")
    if parts[2] == "layer.safetensors":
        return StageEntry(role="layer", layer=int(parts[1]), key=key, bytes=size)
    return StageEntry(
        role="expert", layer=int(parts[1]), expert=int(parts[3].split(".")[0]), key=key, bytes=size
    )


def _manifest(model: MoEModel, entries: list[StageEntry]) -> Manifest:
    weights = model.weights
    return Manifest(
        format_version=MANIFEST_VERSION,
        model=model.name,
        model_type=model.family.config.model_type,
        family=model.family.name,
        classes=model.family.classes,
        moefied=model.moefied,
        seed=model.seed,
        num_layers=model.num_layers,
        experts=model.experts,
        top_k=model.top_k,
        weighting=model.routers[0].weighting,
        expert_kind=model.banks[0].kind,
        activation=model.banks[0].act,
        hidden_size=model.hidden_size,
        dtype=ACTIVATION_DTYPE[weights.stack],
        token_bytes_in=model.hidden_size * weights.wire_bytes(),
        token_bytes_out=model.hidden_size * weights.expert_wire_bytes(),
        stages=entries,
        router_fit=[asdict(fit) for fit in model.fits],
        moefy=None if model.options is None else model.options.describe(),
        quality=model.quality,
        weights=weights.label(),
    )


def describe_model(model: MoEModel) -> Manifest:
    """The manifest `export_model` would write, without writing: what the planner needs.

    Sizes count tensor bytes; the files add a safetensors header of well under 1 KB each.
    """
    entries = [
        _entry(key, sum(t.numel() * t.element_size() for t in tensors.values()))
        for key, tensors in _stage_tensors(model).items()
    ]
    return _manifest(model, entries)


def export_model(model: MoEModel, out: str | Path, *, force: bool = False) -> Manifest:
    """Write every stage's weights and the manifest to `out`, atomically.

    Everything is written to a temporary sibling directory that is renamed into place at the end,
    so an interrupted export leaves nothing half-written (see `write_atomically`).

    Raises:
        OutputExistsError: `out` exists and is not empty, and `force` is False.
    """
    manifest: Manifest | None = None

    def write(tmp: Path) -> None:
        nonlocal manifest
        entries = []
        for key, tensors in _stage_tensors(model).items():
            path = tmp / key
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(path))
            entries.append(_entry(key, path.stat().st_size))
        model.family.config.save_pretrained(tmp / "config")
        model.tokenizer.save_pretrained(tmp / "config")
        manifest = _manifest(model, entries)
        (tmp / "manifest.json").write_text(json.dumps(manifest.model_dump(), indent=2) + "\n")

    write_atomically(Path(out), write, force=force)
    assert manifest is not None
    return manifest
