"""Lina's popularity-based two-phase expert scheduling for MoE inference (thesis ch. 4, spec B3).

Expert popularity is skewed, so one expert per GPU leaves the devices of unpopular experts idle
while the popular ones straggle. Per MoE layer Lina gives expert e about n_e = N * pop(e) devices
(eq. 4.1): popular experts are replicated, unpopular ones share a device (FFD packing, at most 4
experts per device). Phase 1 places by an *estimate* of the batch's popularity before the gate
runs, so the weight swap overlaps compute; phase 2 checks the real gate output and re-places only
if the top-2 experts differ, because a popular expert packed as "unpopular" is slower than no
scheduling at all. The estimate comes from the path table Psi (`LinaPathPredictor`): tokens that
shared an expert in layer i tend to share one in layer i+1 (`path_persistence`), and because the
path needs l = 3 layers of history, Lina starts at the 4th layer.

Everything here is CPU-exact (spec B6): the estimator, eq. 4.1, FFD, the phase-2 trigger and its
rate, measured on real routing traces by `measure`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpu.traffic import Placement
from ground.errors import UsageError
from predictor import Predictor, RoutingTrace, build_tables, make_predictor, sample_batches

__all__ = [
    "FIRST_LAYER",
    "MAX_PER_GPU",
    "PHASE2_TOP",
    "LinaError",
    "LinaLayer",
    "estimate_counts",
    "ffd_placement",
    "fit_estimator",
    "measure",
    "path_persistence",
    "path_persistence_by_layer",
    "reschedule_rate",
    "schedule_batch",
    "static_placement",
]

MAX_PER_GPU = 4  # the thesis packs at most 4 experts on one device
FIRST_LAYER = 3  # path length l = 3: Lina schedules from the 4th MoE layer on
PHASE2_TOP = 2  # phase 2 compares the top-2k experts, k = 1 at inference
_EPS = 1e-9  # float slack: 0.7 + 0.2 + 0.1 must still fit one device


class LinaError(UsageError, ValueError):
    """Bad input to Lina's scheduler: a `UsageError` for the CLI, a `ValueError` for callers."""


def path_persistence_by_layer(trace: RoutingTrace, k: int) -> np.ndarray:
    """(L-1,) share of tokens whose top-1 expert at layer i+1 is in its group's local top-k.

    A group is the tokens with the same top-1 expert at layer i; its local top-k are the k
    experts its tokens pick most often (top-1) at layer i+1. The hits of a group are the sum of
    the k largest entries of its row of the (i, i+1) transition counts, whichever way ties fall.
    """
    if k < 1:
        raise LinaError(f"k must be at least 1, got {k}.", "pass k = 1 or 2 (the thesis's).")
    if trace.num_layers < 2 or trace.num_tokens == 0:
        raise LinaError(
            f"path persistence needs two MoE layers and some tokens; the trace has "
            f"{trace.num_layers} layers and {trace.num_tokens} tokens.",
            "profile a model with at least two MoE layers.",
        )
    e = trace.num_experts
    top1 = trace.experts[:, :, 0].astype(np.int64)
    pairs = top1[:-1] * e + top1[1:] + (np.arange(trace.num_layers - 1) * e * e)[:, None]
    counts = np.bincount(pairs.ravel(), minlength=(trace.num_layers - 1) * e * e)
    transitions = np.sort(counts.reshape(-1, e, e), axis=2)  # (L-1, group, next), ascending
    return transitions[:, :, -k:].sum(axis=(1, 2)) / trace.num_tokens


def path_persistence(trace: RoutingTrace, k: int) -> float:
    """The thesis's pattern statistic (41.94 % for k=1, 54.59 % for k=2 on its models).

    Token-weighted over all groups and layer pairs, i.e. the mean of
    `path_persistence_by_layer` (every layer pair holds the same tokens). It bounds how well a
    token's previous expert predicts its next one, which is what Lina's estimator relies on.
    """
    return float(path_persistence_by_layer(trace, k).mean())


def _check_fits(experts: int, gpus: int, max_per_gpu: int) -> None:
    if gpus < 1 or max_per_gpu < 1:
        raise LinaError(
            f"gpus ({gpus}) and max_per_gpu ({max_per_gpu}) must be at least 1.",
            "pass a positive number of GPUs.",
        )
    if experts > max_per_gpu * gpus:
        need = math.ceil(experts / max_per_gpu)
        raise LinaError(
            f"{experts} experts do not fit on {gpus} GPUs of at most {max_per_gpu} experts each.",
            f"use at least {need} GPUs (or allow more experts per GPU).",
        )


def _fit_slots(whole: np.ndarray, rest: np.ndarray, slots: int) -> None:
    """Shrink the replica items (in place) until every expert can have a slot.

    Each whole replica, each remainder and each expert without an estimate takes one of the
    `slots` = gpus * max_per_gpu, which can overflow only with more than max_per_gpu - 1
    experts per GPU (3 for the thesis). Then fold the smallest remainders into their expert's
    whole replicas, and after that drop a replica of the most replicated expert (its load
    spreads over the others).
    """
    while whole.sum() + np.count_nonzero((rest > 0) | (whole == 0)) > slots:
        foldable = np.flatnonzero((whole > 0) & (rest > 0))
        if foldable.size:
            rest[foldable[np.argmin(rest[foldable])]] = 0.0
        else:
            whole[np.argmax(whole)] -= 1  # every expert has a slot, so the max is >= 2


def ffd_placement(devices: np.ndarray, gpus: int, max_per_gpu: int = MAX_PER_GPU) -> Placement:
    """Place experts on GPUs by their expected device counts n_e (eq. 4.1), by FFD.

    Expert e gets floor(n_e) devices of its own and a remainder item n_e - floor(n_e); the
    remainders are first-fit-decreasing packed into unit-capacity devices (at most `max_per_gpu`
    experts each), which uses the fewest devices for the unpopular experts. A remainder that
    fits no device once all `gpus` are open goes to the least-loaded one. Experts without an
    estimate (n_e = 0) are spread evenly over the devices still free, else the least-loaded.
    Ties go to the lower expert or device index, so the result is deterministic.

    Args:
        devices: (E,) n_e >= 0 with sum(n_e) <= gpus (eq. 4.1 sums to N).
        gpus: Devices available.
        max_per_gpu: Most experts hosted by one device.

    Returns:
        Per GPU, the (expert, share) pairs it hosts, by expert: share is the fraction of the
        expert's tokens that replica takes, proportional to the capacity it was given (the
        shares of an expert sum to 1). A GPU may host nothing.

    Raises:
        LinaError: n_e is not a finite non-negative vector summing to at most `gpus`, or the
            experts do not fit `gpus * max_per_gpu` slots.
    """
    n = np.asarray(devices, dtype=float)
    if n.ndim != 1 or n.size == 0 or not np.isfinite(n).all() or (n < 0).any():
        raise LinaError(
            f"devices must be a non-empty 1-D array of finite n_e >= 0, got {n!r}.",
            "pass N * popularity per expert (eq. 4.1).",
        )
    _check_fits(n.size, gpus, max_per_gpu)
    if n.sum() > gpus * (1 + _EPS):
        raise LinaError(
            f"the experts ask for {n.sum():.6g} devices but there are only {gpus}.",
            "scale n_e to sum to the number of GPUs (n_e = N * popularity).",
        )
    whole = np.floor(n + _EPS).astype(np.int64)
    rest = np.where(n - whole > _EPS, n - whole, 0.0)
    _fit_slots(whole, rest, max_per_gpu * gpus)

    capacity: list[dict[int, float]] = [{} for _ in range(gpus)]
    load = np.zeros(gpus)
    opened = 0  # devices 0..opened-1 hold something; the rest are free

    def put(device: int, expert: int, size: float) -> None:
        capacity[device][expert] = capacity[device].get(expert, 0.0) + size
        load[device] += size

    def least_loaded(expert: int) -> int:
        room = [d for d in range(gpus) if len(capacity[d]) < max_per_gpu or expert in capacity[d]]
        return min(room, key=lambda d: (load[d], len(capacity[d]), d))

    replicated = np.flatnonzero(whole > 0)
    size = (n[replicated] - rest[replicated]) / whole[replicated]  # 1 unless folded
    for i in np.lexsort((replicated, -size)):
        for _ in range(whole[replicated[i]]):
            put(opened, int(replicated[i]), float(size[i]))
            opened += 1
    remainders = np.flatnonzero(rest > 0)
    for expert in remainders[np.lexsort((remainders, -rest[remainders]))]:
        item = float(rest[expert])
        fits = [
            d
            for d in range(opened)
            if load[d] + item <= 1 + _EPS and len(capacity[d]) < max_per_gpu
        ]
        if fits:
            put(fits[0], int(expert), item)
        elif opened < gpus:
            put(opened, int(expert), item)
            opened += 1
        else:
            put(least_loaded(int(expert)), int(expert), item)
    free = range(opened, gpus)
    for expert in np.flatnonzero((whole == 0) & (rest == 0)):
        room = [d for d in free if len(capacity[d]) < max_per_gpu]
        if room:
            put(min(room, key=lambda d: (len(capacity[d]), d)), int(expert), 0.0)
        else:
            put(least_loaded(int(expert)), int(expert), 0.0)

    total = np.zeros(n.size)
    for hosted in capacity:
        for expert, cap in hosted.items():
            total[expert] += cap
    return [
        [
            (expert, float(cap / total[expert]) if total[expert] > 0 else 1.0)
            for expert, cap in sorted(hosted.items())
        ]
        for hosted in capacity
    ]


def static_placement(experts: int, gpus: int) -> Placement:
    """The placement without Lina: expert e alone on GPU e mod gpus (DeepSpeed's layout)."""
    return [[(e, 1.0) for e in range(g, experts, gpus)] for g in range(gpus)]


@dataclass(frozen=True, eq=False)
class LinaLayer:
    """Lina's decision for one MoE layer of one batch.

    `placement` is the final one (phase 2's if `rescheduled`); `estimated` and `actual` are the
    (E,) token counts it was decided from and checked against. `scheduled` is False for the
    layers before Lina starts (static placement, never rescheduled).
    """

    layer: int
    placement: Placement
    estimated: np.ndarray
    actual: np.ndarray
    rescheduled: bool
    scheduled: bool = True


def _ranking(counts: np.ndarray, top: int) -> np.ndarray:
    """The `top` experts by count, best first; ties to the lower expert index."""
    return np.argsort(-counts, kind="stable")[:top]


def _place_by_counts(counts: np.ndarray, gpus: int) -> Placement:
    """Eq. 4.1 then FFD: n_e = gpus * counts / sum(counts)."""
    total = counts.sum()
    devices = gpus * counts / total if total > 0 else np.zeros_like(counts, dtype=float)
    return ffd_placement(devices, gpus)


def schedule_batch(
    estimate: np.ndarray,
    actual: np.ndarray,
    gpus: int,
    *,
    first_layer: int = FIRST_LAYER,
    ordered: bool = True,
) -> list[LinaLayer]:
    """Lina's two phases for every MoE layer of one batch.

    Layers before `first_layer` keep the static placement (no path to estimate from yet).
    From there, phase 1 places by the estimate normalised to `gpus` devices (the estimator's
    scale, e.g. Psi's top-k mass, does not matter); phase 2 compares the top-2 experts of the
    estimate and of the actual counts, as ordered lists (`ordered`, the default) or as sets,
    and if they differ re-places by the actual counts.

    Args:
        estimate, actual: (L, E) tokens per expert of this batch, estimated and real.
        gpus: Devices per layer.
        first_layer: First MoE layer Lina schedules (0-based; 3 = the thesis's 4th layer).
        ordered: Compare the top-2 lists in order (True) or as sets.

    Raises:
        LinaError: The counts are not two (L, E) arrays of the same shape with finite values
            >= 0, `first_layer` is negative, or the experts do not fit the GPUs.
    """
    est = np.asarray(estimate, dtype=float)
    act = np.asarray(actual, dtype=float)
    for name, counts in (("estimate", est), ("actual", act)):
        if counts.ndim != 2 or not np.isfinite(counts).all() or (counts < 0).any():
            raise LinaError(
                f"{name} must be an (L, E) array of finite token counts >= 0.",
                "pass Prediction.counts and RoutingTrace.popularity() of the same batch.",
            )
    if est.shape != act.shape:
        raise LinaError(
            f"estimate {est.shape} and actual {act.shape} differ in shape.",
            "estimate and count the same batch of the same model.",
        )
    if first_layer < 0:
        raise LinaError(f"first_layer {first_layer} is negative.", "pass 0 or more.")
    layers, experts = est.shape
    _check_fits(experts, gpus, MAX_PER_GPU)
    out = []
    for layer in range(layers):
        if layer < first_layer:
            placement = static_placement(experts, gpus)
            out.append(LinaLayer(layer, placement, est[layer], act[layer], False, False))
            continue
        guess, real = _ranking(est[layer], PHASE2_TOP), _ranking(act[layer], PHASE2_TOP)
        same = np.array_equal(guess, real) if ordered else set(guess) == set(real)
        placement = _place_by_counts(act[layer] if not same else est[layer], gpus)
        out.append(LinaLayer(layer, placement, est[layer], act[layer], not same))
    return out


def reschedule_rate(layers_by_batch: list[list[LinaLayer]]) -> float:
    """Share of scheduled layers (over all batches) where phase 2 re-placed the experts.

    The thesis reports ~23 %; each costs a blocking ~6.2 ms instead of 1.45 ms.

    Raises:
        LinaError: No layer was scheduled (the model has no more than `first_layer` layers).
    """
    flags = [layer.rescheduled for batch in layers_by_batch for layer in batch if layer.scheduled]
    if not flags:
        raise LinaError(
            "no MoE layer was scheduled by Lina, so there is no reschedule rate.",
            "use a model with more MoE layers than first_layer, or a smaller first_layer.",
        )
    return float(np.mean(flags))


def fit_estimator(profile: RoutingTrace, estimator: str) -> Predictor:
    """The popularity estimator `estimator` fitted on the profiling trace.

    "lina-path" is the thesis's path table; any other `predictor.METHODS` name works too.

    Raises:
        UsageError: No method has that name.
    """
    return make_predictor(estimator).fit(build_tables(profile), profile)


def estimate_counts(profile: RoutingTrace, batch: RoutingTrace, estimator: str) -> np.ndarray:
    """(L, E) estimated tokens per expert of `batch`, by `estimator` fitted on `profile`.

    Raises:
        LinaError: The traces come from models of different shape.
        UsageError: No method has that name.
    """
    _check_same_model(profile, batch)
    return fit_estimator(profile, estimator).predict(batch).counts


def _check_same_model(profile: RoutingTrace, batch: RoutingTrace) -> None:
    mine = (profile.num_layers, profile.num_experts, profile.top_k)
    theirs = (batch.num_layers, batch.num_experts, batch.top_k)
    if mine != theirs:
        raise LinaError(
            f"the profile trace has (layers, experts, top-k) {mine}, the batch {theirs}.",
            "profile and evaluate the same model with the same --experts and --top-k.",
        )


def _max_load_ratio(placement: Placement, actual: np.ndarray) -> float:
    """Busiest device's tokens over the perfectly balanced share: the layer's straggler."""
    loads = [sum(share * actual[e] for e, share in hosted) for hosted in placement]
    return float(max(loads) * len(placement) / actual.sum()) if actual.sum() > 0 else 1.0


def measure(
    profile: RoutingTrace,
    held_out: RoutingTrace,
    gpus: int,
    batch_tokens: int,
    batches: int,
    estimator: str,
    seed: int = 0,
) -> dict[str, object]:
    """Lina on real routing: path persistence and the phase-2 rate over held-out batches.

    Path persistence is that of all of `held_out`. Fits `estimator` on `profile` once, then
    for `batches` random batches of `batch_tokens` tokens (whole windows of `held_out`,
    `predictor.sample_batches`) runs both phases. Also reports, over the scheduled layers, the
    busiest GPU's load relative to a perfect balance (the all-to-all and FFN straggler) for the
    static layout, phase 1 alone (no fine-tuning) and both phases, using each layer's real
    counts.

    Raises:
        LinaError: The traces differ in shape, or the model has no layer Lina schedules.
        UsageError: `batch_tokens` is not whole windows of `held_out`, or `estimator` unknown.
    """
    _check_same_model(profile, held_out)
    _check_fits(held_out.num_experts, gpus, MAX_PER_GPU)
    predictor = fit_estimator(profile, estimator)
    splits = sample_batches(held_out, eval_tokens=batch_tokens, repeats=batches, seed=seed)
    ordered, unordered = [], []
    ratios: dict[str, list[float]] = {"static": [], "phase1_only": [], "two_phase": []}
    static = static_placement(held_out.num_experts, gpus)
    for split in splits:
        estimate = predictor.predict(split.held_out).counts
        actual = split.held_out.popularity()
        layers = schedule_batch(estimate, actual, gpus)
        ordered.append(layers)
        unordered.append(schedule_batch(estimate, actual, gpus, ordered=False))
        for layer in layers:
            if layer.scheduled:
                phase1 = _place_by_counts(layer.estimated, gpus)
                ratios["static"].append(_max_load_ratio(static, layer.actual))
                ratios["phase1_only"].append(_max_load_ratio(phase1, layer.actual))
                ratios["two_phase"].append(_max_load_ratio(layer.placement, layer.actual))
    per_layer = np.mean([[layer.rescheduled for layer in batch] for batch in ordered], axis=0)
    return {
        "estimator": estimator,
        "gpus": gpus,
        "experts": held_out.num_experts,
        "top_k": held_out.top_k,
        "batch_tokens": batch_tokens,
        "batches": batches,
        "first_layer": FIRST_LAYER,
        "path_persistence_k1": round(path_persistence(held_out, 1), 4),
        "path_persistence_k2": round(path_persistence(held_out, 2), 4),
        "path_persistence_k1_per_layer": _rounded(path_persistence_by_layer(held_out, 1)),
        "path_persistence_k2_per_layer": _rounded(path_persistence_by_layer(held_out, 2)),
        "reschedule_rate": round(reschedule_rate(ordered), 4),
        "reschedule_rate_sets": round(reschedule_rate(unordered), 4),
        "reschedule_rate_per_layer": _rounded(per_layer[FIRST_LAYER:]),
        "max_load_ratio": {name: round(float(np.mean(v)), 4) for name, v in ratios.items()},
    }


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]
