"""Rubick's performance model (paper Sec. 4): iteration time of a (model, plan, resources).

Two forms are kept because they disagree and both matter:

- `iteration_time` is the paper's Eq. (1): forward, backward overlapped with the DP
  all-reduce through the power-mean operator, TP/PP traffic on the critical path, the
  optimizer and (for ZeRO-Offload) the offload traffic, plus a constant.
- `artifact_iteration_ms` is the form the public artifact schedules with (DP-family plans
  only): the offload time is *added* with a fitted constant instead of power-mean
  overlapped, and `k_swap` is paid by every plan. Its constants (`MODELS`) were fitted by
  the artifact's authors on their A800 profiles, so the scheduler uses this form to see the
  throughput curves the published numbers were produced with.

`fit` recovers the seven constants from profiled samples the way the paper describes
(minimise the sum of RMSLEs of the backward+sync, optimizer and iteration times).
Times are in milliseconds and parameter sizes in MiB of parameters, the artifact's units.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
import scipy.optimize

__all__ = [
    "DP_PLANS",
    "MODELS",
    "Constants",
    "GpuCurve",
    "ModelSpec",
    "artifact_iteration_ms",
    "fit",
    "gpu_curve",
    "iteration_time",
    "overlap",
]

#: The DP-family plans in the artifact's enumeration order ({GA, GC} x {offload, ZeRO, none});
#: ties go to the first, as the artifact keeps the first maximum.
DP_PLANS: tuple[tuple[str, str], ...] = tuple(
    product(("ga", "gc"), ("zero-offload", "zero-dp", ""))
)
_ZERO_TYPE = {"": 0, "zero-offload": 1, "zero-dp": 2}


@dataclass(frozen=True)
class Constants:
    """The seven fittable constants of Table 1, in the artifact's parameter order."""

    k_bwd: float
    k_sync: float
    k_opt: float
    k_opt_off: float
    k_const: float
    k_off: float
    k_swap: float

    def array(self) -> np.ndarray:
        return np.array(
            [
                self.k_bwd,
                self.k_sync,
                self.k_opt,
                self.k_opt_off,
                self.k_const,
                self.k_off,
                self.k_swap,
            ]
        )


@dataclass(frozen=True)
class ModelSpec:
    """One model type as the artifact's scheduler knows it (`sched/models/*.py`).

    `forward_ms` is the profiled single-GPU forward time of the global batch `batch`;
    `max_atom` is the largest per-GPU micro-batch each memory-saving mode fits in GPU memory
    (`{mode: (with GC, without GC)}`), the artifact's memory-feasibility oracle;
    `base_throughput` normalises slopes (samples/s of the user's usual configuration).
    """

    name: str
    batch: int
    forward_ms: float
    params_mib: float
    b_pcie: float
    b_nvlink: float
    constants: Constants
    max_atom: dict[str, tuple[int, int]]
    base_throughput: float
    three_d: bool = False  # LLaMA: placed by whole 3D placements; its DP curve only orders it

    def forward_at(self, gpus: int) -> float:
        """Forward time per GPU: linear in the per-GPU batch, except BERT, whose profiles
        scale sub-linearly and for which the artifact hard-codes the measured speed-ups."""
        if self.name == "bert":
            return self.forward_ms / {2: 1.8, 4: 3.2, 8: 5.8}.get(gpus, 1.0)
        return self.forward_ms / gpus


def _spec(name, batch, forward, params, pcie, nvlink, k, atom, base, three_d=False):
    return ModelSpec(
        name, batch, forward, params / 2**20, pcie, nvlink, Constants(*k), atom, base, three_d
    )


def _atom(dp: int, zero: int, offload: int, gc: int | None = None) -> dict[str, tuple[int, int]]:
    return {
        "DP": (dp if gc is None else gc, dp),
        "zero-dp": (0, zero),
        "zero-offload": (0, offload),
    }


# Constants fitted by the artifact's authors (commit 80e85248), in the order k_bwd, k_sync,
# k_opt, k_opt_off, k_const, k_off, k_swap. LLaMA's are placeholders the artifact never uses.
_LLAMA_K = (2.0, 10.0, 0.03, 1e-8, 1.0492757598487223, 1.1192066928294584, 1000.0)
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _spec(
            "vit",
            64,
            40,
            85952456,
            6.1646901221266655,
            29.7451292741858,
            (
                1.0,
                13.54749257672695,
                0.09786337059659733,
                1e-08,
                5.201298157965654,
                15.692686524178942,
                21.647413513688274,
            ),
            _atom(64, 64, 64),
            64 / 0.049219,
        ),
        _spec(
            "roberta",
            64,
            480,
            355412057,
            7.9107385391936935,
            50.303643979067175,
            (
                1.7226216091452244,
                1.205493103963666,
                1e-08,
                2.200462132207284,
                15.73715000699807,
                16.635258404842535,
                32.9530767089104,
            ),
            _atom(64, 64, 64),
            64 / 0.234,
        ),
        _spec(
            "bert",
            32,
            225,
            336297858,
            64,
            119.4879085392442,
            (
                1.7762507345127174,
                1.1410390978600897,
                1e-08,
                4.400603962116795,
                15.257464643432971,
                37.288983000053264,
                26.221881110226107,
            ),
            _atom(32, 32, 32),
            32 / 0.15768,
        ),
        _spec(
            "t5",
            16,
            410,
            1240809472,
            64.0,
            161.02246829023724,
            (
                1.2754324551852874,
                1.0,
                1e-08,
                3.4538198406863163,
                11.616030890964971,
                224.86968171631415,
                61.68023191529816,
            ),
            _atom(16, 16, 16),
            16 / 0.3207,
        ),
        _spec(
            "gpt2",
            16,
            1100,
            1557686400,
            59.720964902105614,
            144.83763732303515,
            (
                2.2955055547729417,
                71.21658539688131,
                0.05217141753878825,
                4.877226916846699,
                1.786485024931732,
                0.027912731457899787,
                51.48938818523304,
            ),
            _atom(16, 16, 16),
            16 / 0.62556,
        ),
        _spec("llama7", 8, 1000, 6738423808, 0.96, 150, _LLAMA_K, _atom(0, 2, 8), 8 / 9.4, True),
        _spec(
            "llama30", 4, 1000, 6738423808, 0.96, 150, _LLAMA_K, _atom(0, 2, 8), 4 / 2.759, True
        ),
    )
}


def overlap(x: np.ndarray | float, y: np.ndarray | float, k: np.ndarray | float) -> np.ndarray:
    """The overlap operator `(x^k + y^k)^(1/k)`: k = 1 adds, k -> inf takes the max.

    Computed as `max * (1 + (min/max)^k)^(1/k)` so that the artifact's large fitted k
    (e.g. 71 for GPT-2) cannot overflow."""
    x, y, k = np.broadcast_arrays(*map(np.asarray, (x, y, k)))
    hi, lo = np.maximum(x, y), np.minimum(x, y)
    ratio = np.divide(lo, hi, out=np.zeros(hi.shape), where=hi > 0)
    return hi * (1.0 + ratio**k) ** (1.0 / k)


def iteration_time(
    c: Constants,
    *,
    t_fwd: float,
    params: float,
    d: int = 1,
    t: int = 1,
    p: int = 1,
    m: int = 1,
    a: int = 1,
    gc: bool = False,
    zero: str = "",
    cpus: int = 1,
    batch: float = 1.0,
    seq_hid: float = 0.0,
    b_dp: float = 1.0,
    b_tp: float = 1.0,
    b_pp: float = 1.0,
    b_pcie: float = 1.0,
) -> float:
    """Eq. (1) of the paper, `T_iter = T_cc + T_oo + k_const`, for a d x t x p plan.

    `t_fwd` is the forward time of one micro-batch step on this plan's shard (already scaled
    to the per-GPU batch); with p > 1 it is the per-stage time and is stretched by the
    pipeline's fill (`m + p - 1` slots). `seq_hid` is `s*h*l` (TP/PP traffic); `b_*` are the
    bottleneck bandwidths of each kind of traffic. `zero` is "", "zero-dp" or "zero-offload".
    """
    g = d * t * p
    fwd = t_fwd * (m + p - 1) / p if p > 1 else t_fwd
    bwd = c.k_bwd * fwd + (fwd if gc else 0.0)
    comm_dp = params * 2 * (d - 1) / g / b_dp if d > 1 else 0.0
    comm_tp = 8 * (t - 1) * batch * seq_hid / (d * t) / b_tp if t > 1 else 0.0
    comm_pp = 2 * p * batch * seq_hid / (d * t) / b_pp if p > 1 else 0.0
    sync = float(overlap(bwd, comm_dp, c.k_sync))
    t_cc = a * fwd + (a - 1) * bwd + sync + comm_tp + comm_pp
    if zero == "zero-offload":
        t_off = params / (d * b_pcie)
        t_opt = c.k_opt_off * params / (d * cpus)
        t_oo = float(overlap(comm_dp, t_off, c.k_off) + overlap(t_opt, t_off, c.k_swap))
    else:
        t_oo = c.k_opt * params / (d if zero == "zero-dp" else t * p)
    return t_cc + t_oo + c.k_const


def artifact_iteration_ms(
    k: np.ndarray,
    fwd: np.ndarray,
    gpus: np.ndarray,
    zero_type: np.ndarray,
    gc: np.ndarray,
    params: float,
    b_nvlink: float,
    b_pcie: float,
    threads: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The artifact's DP-family model, vectorised over samples; `k` is `Constants.array()`.

    Returns (backward+sync, optimizer+swap, iteration) times, the three quantities its
    fitting objective compares with profiles."""
    k_bwd, k_sync, k_opt, k_opt_off, k_const, k_off, k_swap = k
    bwd = k_bwd * fwd
    comm = 8 * params * (gpus - 1) / gpus / b_nvlink
    off = np.where(zero_type == 1, 4 * params / gpus / b_pcie, 0.0)
    sync = overlap(comm, bwd, k_sync) + np.where(zero_type == 1, k_off + off, 0.0)
    opt = np.select(
        [zero_type == 0, zero_type == 1],
        [k_opt * params, k_opt_off * params / (gpus * threads)],
        k_opt * params / gpus,
    )
    swap = opt + k_swap + off
    iteration = np.where(gc, 2.0, 1.0) * fwd + sync + swap + k_const
    return sync, swap, iteration


@dataclass(frozen=True)
class GpuCurve:
    """A model's resource-sensitivity curve over GPUs on one node (A5), index = GPU count.

    `throughput[g]` is the best predicted samples/s reachable with at most g GPUs (-1 where
    nothing runs), `gpus[g]` the count that reaches it and `plan[g]` its (GA/GC, ZeRO) plan.
    A larger count replaces a smaller one only when >1 % better, as in the artifact, so a
    job is never handed GPUs that do not pay."""

    throughput: np.ndarray
    gpus: np.ndarray
    plan: tuple[tuple[str, str] | None, ...]
    exact: tuple[tuple[str, str] | None, ...]  # the best plan on exactly g GPUs, if any fits


def _feasible(spec: ModelSpec, gpus: np.ndarray, plan: tuple[str, str]) -> np.ndarray:
    """GetBestPlan's memory check: the batch splits evenly and the micro-batch fits."""
    atom = spec.batch / gpus
    with_gc, without_gc = spec.max_atom[plan[1] or "DP"]
    limit = with_gc if plan[0] == "gc" else without_gc
    return (atom == np.floor(atom)) & (atom <= limit)


def gpu_curve(spec: ModelSpec, max_gpus: int = 8) -> GpuCurve:
    """Best DP-family plan at each GPU count 1..max_gpus (1 CPU thread, NVLink bandwidth,
    the point of the curve the artifact's policy reads), for every model: the artifact
    computes it for LLaMA too, and its slopes order LLaMA jobs."""
    n = max_gpus + 1
    tp = np.full(n, -1.0)
    best = np.zeros(n, dtype=int)
    plans: list[tuple[str, str] | None] = [None] * n
    g = np.arange(1, n)
    fwd = np.array([spec.forward_at(int(x)) for x in g])
    rates = np.full((len(DP_PLANS), n - 1), -1.0)
    for i, plan in enumerate(DP_PLANS):
        zt = np.full(g.shape, _ZERO_TYPE[plan[1]])
        _, _, it = artifact_iteration_ms(
            spec.constants.array(),
            fwd,
            g,
            zt,
            np.full(g.shape, plan[0] == "gc"),
            spec.params_mib,
            spec.b_nvlink,
            spec.b_pcie,
        )
        rates[i] = np.where(_feasible(spec, g, plan), spec.batch / (it / 1000), -1.0)
    pick = rates.argmax(axis=0)  # first maximum, as the artifact's strict comparison
    exact = (None,) + tuple(DP_PLANS[p] if rates[p, i] > 0 else None for i, p in enumerate(pick))
    for x in g:  # the 1 % monotone rule chains through the counts: a short scan
        own = rates[pick[x - 1], x - 1]
        if x > 1 and tp[x - 1] * 1.01 >= own:
            tp[x], best[x], plans[x] = tp[x - 1], best[x - 1], plans[x - 1]
        else:
            tp[x], best[x], plans[x] = own, x, DP_PLANS[pick[x - 1]]
    return GpuCurve(tp, best, tuple(plans), exact)


_LOWER = np.array([1, 1, 1e-8, 1e-8, 1e-8, 0, 0])
_UPPER = np.array([10] + [np.inf] * 6)


def fit(
    spec: ModelSpec,
    fwd: np.ndarray,
    gpus: np.ndarray,
    zero_type: np.ndarray,
    gc: np.ndarray,
    sync_ms: np.ndarray,
    opt_ms: np.ndarray,
    iter_ms: np.ndarray,
    start: np.ndarray | None = None,
) -> Constants:
    """Fit the seven constants to profiled samples (A3): minimise the sum of the RMSLEs of
    backward+sync, optimizer and iteration time within the artifact's box bounds. At least
    seven samples, three of them ZeRO-Offload, are needed to pin every constant."""
    logs = [np.log(v) for v in (sync_ms, opt_ms, iter_ms)]

    def loss(k: np.ndarray) -> float:
        preds = artifact_iteration_ms(
            k, fwd, gpus, zero_type, gc, spec.params_mib, spec.b_nvlink, spec.b_pcie
        )
        return sum(
            float(np.sqrt(np.mean((np.log(p) - y) ** 2))) for p, y in zip(preds, logs, strict=True)
        )

    x0 = np.array([1.5, 1.1, 1e-3, 1, 1, 1, 1]) if start is None else start
    result = scipy.optimize.minimize(
        loss, x0, method="L-BFGS-B", bounds=list(zip(_LOWER, _UPPER, strict=True))
    )
    return Constants(*result.x)
