"""Layer-local distillation: each MoEfied layer learns to reproduce its dense FFN, alone.

End-to-end distillation (`moe._distil`) backpropagates through every layer and the vocabulary:
for SmolLM2 (30 layers, a 49,152-token vocabulary) a step takes 12 to 14 s on 2 cores, so the
thousands of steps it needs take hours. Here each layer is trained on its own, right after it is
MoEfied (`moe._model._fit_sequential`), on the FFN inputs the MoEfied layers before it produce:

* the target is the dense FFN's output on those inputs, the loss its squared error over the
  target's mean energy (the relative error `LayerFit.ffn_rel_error` reports, squared);
* the experts' input and output weights, their biases and the shared expert learn; the gate does
  not (its top-k choice has no gradient), so the routing of every fit token is computed once;
* a step is `LOCAL_BATCH` fit tokens through one FFN, forward and backward: about 40 times less
  work than an end-to-end step of 16 windows of 128 tokens through 30 layers and the vocabulary.

Memory is bounded by one layer's inputs and targets (two (n, h) float32 tensors) beside the
model. A layer is checkpointed as soon as it is done (`moe._model`), so a conversion stopped
part way resumes at the next layer.

The learning rate was set, not tuned: no sweep has been run on the validation part yet
(docs/model.md says what the recipe reaches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from moe._moefy import MoefiedLayer

__all__ = ["LOCAL_RECIPE", "LocalFit", "train_layer"]

LOCAL_LR = 1e-3
LOCAL_BATCH = 2048
# What a cached model trained this way depends on beyond its options (part of the cache key).
LOCAL_RECIPE = {"lr": LOCAL_LR, "batch": LOCAL_BATCH, "schedule": "cosine", "loss": "rel mse"}


@dataclass(frozen=True)
class LocalFit:
    """A layer's relative squared error on its fit tokens before and after training."""

    before: float
    after: float


def _parameters(layer: MoefiedLayer) -> list[torch.nn.Parameter]:
    bank = layer.bank
    params = [p for p in (bank.w_in, bank.b_in, bank.w_out, bank.b_out) if p is not None]
    if layer.shared is not None:
        params += [p for p in layer.shared.parameters() if p.numel()]
    return params


def _error(layer: MoefiedLayer, x: torch.Tensor, target: torch.Tensor, chunk: int = 8192) -> float:
    """Relative squared error of the whole layer (gate included) over `x`."""
    with torch.no_grad():
        err = sum(
            (layer(x[s : s + chunk]) - target[s : s + chunk]).pow(2).sum().item()
            for s in range(0, x.shape[0], chunk)
        )
        return float(err / target.pow(2).sum().clamp_min(1e-30).item())


def train_layer(
    layer: MoefiedLayer, x: torch.Tensor, target: torch.Tensor, *, steps: int, seed: int
) -> LocalFit:
    """Train `layer`'s experts (in place) for `steps` Adam steps to reproduce `target`.

    Args:
        layer: The MoEfied layer, its gate fitted (and kept).
        x: (n, h) its inputs on the fit tokens, as the served model gives them.
        target: (n, h) the dense FFN's output on `x`.
        steps: Optimiser steps of `LOCAL_BATCH` tokens each, drawn with a seeded generator.
        seed: Seeds the draw.
    """
    before = _error(layer, x, target)
    with torch.no_grad():
        idx, weights, _ = layer.router(x)
    scale = target.pow(2).mean().clamp_min(1e-30)
    params = _parameters(layer)
    optimizer = torch.optim.Adam(params, lr=LOCAL_LR)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1))
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            for _ in range(steps):
                pick = torch.randint(0, x.shape[0], (LOCAL_BATCH,), generator=generator)
                y = layer.bank.sparse(x[pick], idx[pick], weights[pick])
                if layer.shared is not None:
                    y = y + layer.shared(x[pick])
                loss = (y - target[pick]).pow(2).mean() / scale
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
    finally:
        for p in params:
            p.requires_grad_(False)
    return LocalFit(before=before, after=_error(layer, x, target))
