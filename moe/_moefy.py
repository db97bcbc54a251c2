"""MoEfication: turn each dense FFN into E experts plus a linear gate.

Following MoEfication (Zhang et al., 2022), the FFN's intermediate neurons are partitioned into E
equal groups of neurons that fire together, and a router is trained to predict, for each token,
which groups carry the most activation mass. Because the groups partition the FFN, running every
expert and adding the outputs reproduces the dense FFN exactly; top-k routing keeps the k groups
the router expects to matter most.

Choices, and why:

* **Split by co-activation**: neurons are clustered (balanced k-means, cosine distance) on their
  activation magnitudes over real text. Neurons that fire on the same tokens land in the same
  expert, which concentrates each token's mass in few experts, so routing is meaningful.
* **Activation mass** of group g for token t: sum over its neurons of ``|a_tn| * ||W_out[:, n]||``,
  the size of the neuron's contribution to the output.
* **Router**: a linear layer (with bias) on the FFN input, trained with softmax cross-entropy to
  put 1/k of its probability on each of the k groups with the largest mass (full-batch L-BFGS).
  It is the gate the serving path runs before the experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers.activations import ACT2FN

from moe._experts import ExpertBank, Router
from moe._families import DenseFFN

__all__ = ["LayerFit", "moefy_ffn"]

_KMEANS_ITERS = 12
_LBFGS_STEPS = 60
_L2 = 1e-4


@dataclass(frozen=True)
class LayerFit:
    """How well the fitted router does on its fitting tokens (reported by `moelambda profile`).

    Attributes:
        router_accuracy: Share of tokens whose routed top-k set equals the k groups of largest
            activation mass.
        mass_captured: Activation mass in the routed experts over the mass in the best k experts.
        ffn_rel_error: ||MoE FFN - dense FFN|| / ||dense FFN|| over the fitting tokens.
    """

    router_accuracy: float
    mass_captured: float
    ffn_rel_error: float


def _activations(ffn: DenseFFN, x: torch.Tensor) -> torch.Tensor:
    hidden = nn.functional.linear(x, ffn.w_in, ffn.b_in)
    if ffn.kind == "glu":
        gate, up = hidden.chunk(2, dim=-1)
        return ACT2FN[ffn.act](gate) * up
    return ACT2FN[ffn.act](hidden)


def _balanced_assign(dist: np.ndarray, capacity: int) -> np.ndarray:
    """Assign each row to a column, each column taking exactly `capacity` rows.

    Greedy over (row, column) pairs in order of distance: near-optimal and fast for the few
    thousand neurons of an FFN (this runs once per layer at conversion, not per token).
    """
    rows, cols = dist.shape
    order = np.argsort(dist, axis=None, kind="stable")
    assign = np.full(rows, -1)
    room = np.full(cols, capacity)
    for flat in order:
        r, c = divmod(int(flat), cols)
        if assign[r] < 0 and room[c] > 0:
            assign[r] = c
            room[c] -= 1
    return assign


def _cluster_neurons(features: np.ndarray, experts: int, rng: np.random.Generator) -> np.ndarray:
    """Balanced spherical k-means of neurons (rows of `features`) into equal groups."""
    features = np.ascontiguousarray(features, dtype=np.float32)
    unit = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    capacity = unit.shape[0] // experts
    centroids = unit[rng.choice(unit.shape[0], size=experts, replace=False)]
    assign = np.zeros(unit.shape[0], dtype=int)
    for _ in range(_KMEANS_ITERS):
        new = _balanced_assign(1.0 - unit @ centroids.T, capacity)
        if np.array_equal(new, assign):
            break
        assign = new
        for g in range(experts):
            c = unit[assign == g].mean(axis=0)
            centroids[g] = c / max(np.linalg.norm(c), 1e-12)
    return assign


def _fit_router(x: torch.Tensor, target: torch.Tensor, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(x.shape[1], target.shape[1])
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    optimizer = torch.optim.LBFGS(
        linear.parameters(), max_iter=_LBFGS_STEPS, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logp = torch.log_softmax(linear(x), dim=-1)
        loss = -(target * logp).sum(dim=1).mean() + _L2 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    linear.requires_grad_(False)
    return linear


def moefy_ffn(
    ffn: DenseFFN, x: torch.Tensor, *, experts: int, top_k: int, seed: int
) -> tuple[ExpertBank, Router, LayerFit]:
    """Split one dense FFN into `experts` experts and fit its top-`top_k` linear gate.

    Args:
        ffn: The dense FFN's tensors.
        x: (n, h) FFN inputs collected from the dense model on real text.
        experts: Number of experts E; must divide the FFN width.
        top_k: Experts per token.
        seed: Seeds the clustering and the router fit, so the same seed gives the same model.
    """
    x = x.float()
    with torch.no_grad():
        acts = _activations(ffn, x)
        contribution = acts.abs() * ffn.w_out.norm(dim=0)
    width = acts.shape[1]
    assign = _cluster_neurons(contribution.T.numpy(), experts, np.random.default_rng(seed))
    groups = [torch.from_numpy(np.flatnonzero(assign == g)) for g in range(experts)]

    if ffn.kind == "glu":
        rows = [torch.cat([g, g + width]) for g in groups]
    else:
        rows = groups
    w_in = torch.stack([ffn.w_in[r] for r in rows]).contiguous()
    b_in = None if ffn.b_in is None else torch.stack([ffn.b_in[g] for g in groups]).contiguous()
    w_out = torch.stack([ffn.w_out[:, g] for g in groups]).contiguous()
    bank = ExpertBank(w_in, b_in, w_out, kind=ffn.kind, act=ffn.act)

    mass = torch.stack([contribution[:, g].sum(dim=1) for g in groups], dim=1)
    best = torch.topk(mass, top_k, dim=1).indices
    target = torch.zeros_like(mass).scatter_(1, best, 1.0 / top_k)
    router = Router(_fit_router(x, target, seed), top_k=top_k, weighting="unit")

    with torch.no_grad():
        idx, weights, _ = router(x)
        same = torch.sort(idx, dim=1).values == torch.sort(best, dim=1).values
        routed_mass = mass.gather(1, idx).sum()
        dense = nn.functional.linear(acts, ffn.w_out)
        sparse = bank.sparse(x, idx, weights)
    fit = LayerFit(
        router_accuracy=float(same.all(dim=1).float().mean()),
        mass_captured=float(routed_mass / mass.gather(1, best).sum()),
        ffn_rel_error=float((sparse - dense).norm() / dense.norm()),
    )
    return bank, router, fit
