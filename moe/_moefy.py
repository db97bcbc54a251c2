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

Quality recovery (`MoefyOptions`; any of them also refines the groups, below):

* **Groups for top-k**: after k-means, neurons are reassigned (balanced) to the group where they
  add the most mass to the tokens that route to it, alternating with the routing, which raises
  the mass the k routed groups capture (k-means only groups neurons that fire together).
* **Shared expert**: the neurons of largest total mass on the fit split are always on.
* **Output-fitted router**: each token's label is the set of experts chosen greedily to minimise
  the error of the routed FFN's output against the dense FFN's (with the correction, if any),
  instead of the groups of largest mass; adaptive rules learn soft labels (each expert's share
  of the error it removes alone) so that their probabilities mean something.
* **Least-squares correction**: with routing fixed, the output projections of the shared and
  routed neurons, a bias per expert (added when it is routed) and one per layer are refitted by
  ridge regression so that the routed FFN best matches the dense FFN on the fit tokens: the
  routed neurons learn to stand in for the ones a token skips. Closed form, one solve per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from moe._experts import ExpertBank, Router, SharedExpert, activations
from moe._families import DenseFFN
from moe._options import MoefyOptions, TopK

__all__ = ["LayerFit", "MoefiedLayer", "moefy_ffn", "moefy_layer"]

_KMEANS_ITERS = 12
_REFINE_ITERS = 4
_LBFGS_STEPS = 60
_L2 = 1e-4
_CHUNK = 4096  # tokens at a time where per-expert output vectors are materialised


@dataclass(frozen=True)
class LayerFit:
    """How well the fitted router does on its fitting tokens (reported by `moelambda profile`).

    Attributes:
        router_accuracy: Share of tokens whose routed set equals their label set (fixed k: the k
            groups of largest mass, or the greedy output set; adaptive: the label's top expert).
        mass_captured: Activation mass in the routed experts over the mass in the same number of
            best experts.
        ffn_rel_error: ||MoE FFN - dense FFN|| / ||dense FFN|| over the fitting tokens.
    """

    router_accuracy: float
    mass_captured: float
    ffn_rel_error: float


@dataclass
class MoefiedLayer:
    """One MoEfied FFN: its experts, gate, optional always-on part and fit quality."""

    bank: ExpertBank
    router: Router
    shared: SharedExpert | None
    fit: LayerFit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        idx, weights, _ = self.router(x)
        y = self.bank.sparse(x, idx, weights)
        return y if self.shared is None else y + self.shared(x)


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


def _group_mass(contribution: torch.Tensor, assign: np.ndarray, experts: int) -> torch.Tensor:
    """(n, E) activation mass of each group for each token."""
    return torch.stack(
        [
            contribution[:, torch.from_numpy(np.flatnonzero(assign == g))].sum(dim=1)
            for g in range(experts)
        ],
        dim=1,
    )


def _refine_groups(contribution: torch.Tensor, assign: np.ndarray, k: int) -> np.ndarray:
    """Alternate: route each token to its k groups of largest mass, then move each neuron
    (balanced) to the group whose routed tokens it adds the most mass to."""
    experts = int(assign.max()) + 1
    capacity = contribution.shape[1] // experts
    for _ in range(_REFINE_ITERS):
        mass = _group_mass(contribution, assign, experts)
        routed = torch.zeros_like(mass).scatter_(1, mass.topk(k, dim=1).indices, 1.0)
        gain = (routed.T @ contribution).T.numpy()  # (neurons, E)
        new = _balanced_assign(-gain, capacity)
        if np.array_equal(new, assign):
            break
        assign = new
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


def _hard_target(score: torch.Tensor, k: int) -> torch.Tensor:
    """1/k on each token's k best experts: MoEfication's label."""
    return torch.zeros_like(score).scatter_(1, score.topk(k, dim=1).indices, 1.0 / k)


def _soft_target(score: torch.Tensor) -> torch.Tensor:
    """Scores as a distribution, so that an adaptive rule's thresholds read real shares."""
    score = score.clamp_min(0.0)
    total = score.sum(dim=1, keepdim=True)
    uniform = torch.full_like(score, 1.0 / score.shape[1])
    return torch.where(total > 0, score / total.clamp_min(1e-30), uniform)


def _split_shared(
    contribution: torch.Tensor, shared: float, experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neuron ids of the shared expert (largest total mass) and of the routed ones.

    The routed width is the largest multiple of E within (1 - shared) of the FFN.
    """
    width = contribution.shape[1]
    routed = experts * int((width - round(shared * width)) // experts)
    order = torch.argsort(contribution.sum(dim=0), descending=True, stable=True)
    shared_ids = torch.sort(order[: width - routed]).values
    routed_ids = torch.sort(order[width - routed :]).values
    return shared_ids, routed_ids


def _selection(router: Router, x: torch.Tensor) -> torch.Tensor:
    """(n, E) 0/1: the experts the router picks for each token."""
    idx, _, _ = router(x)
    chosen = torch.zeros(x.shape[0], router.num_experts + 1)
    chosen.scatter_(1, idx, 1.0)
    return chosen[:, :-1]


class _Layout:
    """Where each neuron sits: shared, or in which routed group (column order of the fit)."""

    def __init__(self, shared: torch.Tensor, groups: list[torch.Tensor]) -> None:
        self.shared = shared
        self.groups = groups
        self.order = torch.cat([shared, *groups])  # feature column -> neuron
        self.group_of_column = torch.cat(
            [torch.full((len(shared),), -1)]
            + [torch.full((len(g),), i) for i, g in enumerate(groups)]
        )

    @property
    def experts(self) -> int:
        return len(self.groups)

    def prior(self, w_out: torch.Tensor) -> torch.Tensor:
        """The dense FFN as a solution of the fit: its output columns, zero biases."""
        zeros = torch.zeros(self.experts + 1, w_out.shape[0])
        return torch.cat([w_out[:, self.order].T, zeros])

    def features(self, acts: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """[shared acts, routed acts masked by routing, routed-expert indicators, 1]."""
        on = torch.cat([torch.ones(acts.shape[0], 1), chosen], dim=1)[:, self.group_of_column + 1]
        return torch.cat([acts[:, self.order] * on, chosen, torch.ones(acts.shape[0], 1)], dim=1)


def _ridge(
    features: torch.Tensor, target: torch.Tensor, prior: torch.Tensor, ridge: float
) -> torch.Tensor:
    """argmin_W ||features W - target||^2 + lam ||W - prior||^2, lam = `ridge` times the
    features' mean energy: shrinking toward the dense weights (not toward zero) keeps the
    correction exact where nothing is missing, so a token routed to every expert still gets the
    dense FFN.

    The Gram matrix is summed in float32 (the ridge term dominates its rounding) and solved in
    float64.
    """
    gram = (features.T @ features).double()
    lam = ridge * gram.diagonal().mean()
    gram += lam * torch.eye(gram.shape[0], dtype=gram.dtype)
    rhs = (features.T @ target).double() + lam * prior.double()
    return torch.linalg.solve(gram, rhs).float()


def _corrected_parts(
    solution: torch.Tensor, layout: _Layout
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a correction into per-expert output projections (h, f_e), expert biases (E, h),
    the shared output projection (h, f_s) and the layer bias (h,)."""
    rows = solution.T  # (h, columns)
    widths = [len(layout.shared)] + [len(g) for g in layout.groups]
    blocks = list(rows[:, : sum(widths)].split(widths, dim=1))
    width = sum(widths)
    return (
        [b.contiguous() for b in blocks[1:]],
        rows[:, width : width + layout.experts].T.contiguous(),
        blocks[0].contiguous(),
        rows[:, -1].contiguous(),
    )


def _expert_outputs(
    acts: torch.Tensor, layout: _Layout, w_out: list[torch.Tensor], b_out: torch.Tensor | None
) -> torch.Tensor:
    """(n, E, h) each routed expert's output for every token, as if it were routed."""
    outs = [
        nn.functional.linear(acts[:, g], w, None if b_out is None else b_out[i])
        for i, (g, w) in enumerate(zip(layout.groups, w_out, strict=True))
    ]
    return torch.stack(outs, dim=1)


def _output_target(residual: torch.Tensor, outputs: torch.Tensor, rule: TopK) -> torch.Tensor:
    """Router labels from the outputs: which experts reproduce `residual` (dense minus the
    always-on part) best.

    Fixed k: the k experts chosen greedily, each step the one that lowers the squared error
    most. Adaptive: each expert's error reduction when taken alone, as a distribution.
    """
    if rule.adaptive:
        alone = residual.pow(2).sum(-1, keepdim=True) - (residual[:, None] - outputs).pow(2).sum(
            -1
        )
        return _soft_target(alone)
    n, experts, _ = outputs.shape
    taken = torch.zeros(n, experts, dtype=torch.bool)
    current = torch.zeros_like(residual)
    for _ in range(rule.k):
        err = (residual[:, None] - current[:, None] - outputs).pow(2).sum(-1)
        best = err.masked_fill(taken, float("inf")).argmin(dim=1)
        taken[torch.arange(n), best] = True
        current = current + outputs[torch.arange(n), best]
    return taken.float() / rule.k


def moefy_layer(ffn: DenseFFN, x: torch.Tensor, options: MoefyOptions) -> MoefiedLayer:
    """Split one dense FFN into experts (and a shared part) and fit its gate, per `options`.

    Args:
        ffn: The dense FFN's tensors.
        x: (n, h) FFN inputs collected on real text (the fit split).
        options: The MoEfication; `options.is_original` reproduces MoEfication as it was.
    """
    x = x.float()
    experts, rule, seed = options.experts, options.top_k, options.seed
    with torch.no_grad():
        acts = activations(x, ffn.w_in, ffn.b_in, ffn.kind, ffn.act)
        contribution = acts.abs() * ffn.w_out.norm(dim=0)
        dense = nn.functional.linear(acts, ffn.w_out)
    width = acts.shape[1]
    shared_ids, routed_ids = _split_shared(contribution, options.shared, experts)
    routed_mass = contribution[:, routed_ids]
    assign = _cluster_neurons(routed_mass.T.numpy(), experts, np.random.default_rng(seed))
    if not options.is_original:
        reference_k = rule.k if rule.rule == "fixed" else max(1, rule.k // 2)
        assign = _refine_groups(routed_mass, assign, reference_k)
    groups = [routed_ids[torch.from_numpy(np.flatnonzero(assign == g))] for g in range(experts)]
    layout = _Layout(shared_ids, groups)
    mass = _group_mass(routed_mass, assign, experts)
    target = _soft_target(mass) if rule.adaptive else _hard_target(mass, rule.k)
    router = Router(_fit_router(x, target, seed), top_k=rule, weighting="unit")

    with torch.no_grad():
        w_out = [ffn.w_out[:, g] for g in groups]
        b_out: torch.Tensor | None = None
        shared_w_out, layer_bias = ffn.w_out[:, shared_ids], torch.zeros(ffn.w_out.shape[0])
        if options.correction:
            chosen = _selection(router, x)
            fitted = _ridge(
                layout.features(acts, chosen), dense, layout.prior(ffn.w_out), options.ridge
            )
            w_out, b_out, shared_w_out, layer_bias = _corrected_parts(fitted, layout)
        if options.router == "output":
            base = nn.functional.linear(acts[:, shared_ids], shared_w_out, layer_bias)
            target = torch.cat(
                [
                    _output_target(
                        (dense - base)[s : s + _CHUNK],
                        _expert_outputs(acts[s : s + _CHUNK], layout, w_out, b_out),
                        rule,
                    )
                    for s in range(0, x.shape[0], _CHUNK)
                ]
            )
            router = Router(_fit_router(x, target, seed), top_k=rule, weighting="unit")
            if options.correction:
                chosen = _selection(router, x)
                fitted = _ridge(
                    layout.features(acts, chosen), dense, layout.prior(ffn.w_out), options.ridge
                )
                w_out, b_out, shared_w_out, layer_bias = _corrected_parts(fitted, layout)

    if ffn.kind == "glu":
        rows = [torch.cat([g, g + width]) for g in groups]
        shared_rows = torch.cat([shared_ids, shared_ids + width])
    else:
        rows, shared_rows = groups, shared_ids
    bank = ExpertBank(
        torch.stack([ffn.w_in[r] for r in rows]).contiguous(),
        None if ffn.b_in is None else torch.stack([ffn.b_in[g] for g in groups]).contiguous(),
        torch.stack(w_out).contiguous(),
        kind=ffn.kind,
        act=ffn.act,
        b_out=b_out,
    )
    shared = None
    if len(shared_ids) or options.correction:
        shared = SharedExpert(
            ffn.w_in[shared_rows].contiguous(),
            None if ffn.b_in is None else ffn.b_in[shared_ids].contiguous(),
            shared_w_out.contiguous(),
            layer_bias,
            kind=ffn.kind,
            act=ffn.act,
        )
    layer = MoefiedLayer(bank, router, shared, LayerFit(0.0, 0.0, 0.0))
    layer.fit = _fit_quality(layer, x, target, mass, dense)
    return layer


def _fit_quality(
    layer: MoefiedLayer,
    x: torch.Tensor,
    target: torch.Tensor,
    mass: torch.Tensor,
    dense: torch.Tensor,
) -> LayerFit:
    with torch.no_grad():
        chosen = _selection(layer.router, x)
        per_token = chosen.sum(dim=1).long()
        if layer.router.rule.adaptive:
            same = chosen.gather(1, target.argmax(dim=1, keepdim=True)).squeeze(1) > 0
        else:
            same = ((target > 0).float() == chosen).all(dim=1)
        best = mass.sort(dim=1, descending=True).values.cumsum(dim=1)
        best_k = best.gather(1, (per_token - 1).clamp_min(0)[:, None]).sum()
        y = layer(x)
    return LayerFit(
        router_accuracy=float(same.float().mean()),
        mass_captured=float((mass * chosen).sum() / best_k.clamp_min(1e-30)),
        ffn_rel_error=float((y - dense).norm() / dense.norm()),
    )


def moefy_ffn(
    ffn: DenseFFN, x: torch.Tensor, *, experts: int, top_k: int, seed: int
) -> tuple[ExpertBank, Router, LayerFit]:
    """MoEfication as it was before quality recovery: `moefy_layer` with the default options."""
    layer = moefy_layer(ffn, x, MoefyOptions(experts=experts, top_k=TopK(k=top_k), seed=seed))
    return layer.bank, layer.router, layer.fit
