"""A seeded synthetic Lyra workload: training jobs and the inference cluster's diurnal demand.

The thesis's traces (ByteDance, Oct 2020) are proprietary (spec §A4), so this generator is
calibrated to the statistics the spec states instead (§A1, §A3):

* 50,390 jobs in 15 days on 443 x 8 V100 (3,544 GPUs); Baseline GPU usage 0.72-0.82, so the
  offered load is a fixed share (`LOAD`) of the training cluster's GPU-seconds;
* 21 % of jobs fungible (may run on T4), about 5 % elastic (a subset of the fungible ones: the
  ResNet/VGG/BERT/GNMT jobs), elastic jobs hold 36 % of the GPU-time and run 14.2 h on average
  at their largest size; 2 GPUs per elastic worker (the Fig. 3.3 measurements);
* run times "from minutes to days": log-normal, clipped to [2 min, 5 days] [A];
* the inference cluster (520 x 8 T4 = 4,160 GPUs) moves between 42 % and 95 % utilisation,
  mean ~65 %, a ~4 h peak at night and the trough before dawn, sampled every 5 minutes.

Everything derives from one `numpy.random.Generator(seed)`, so a seed gives the same trace.
An explicit hourly inference demand (GPUs per hour, e.g. `inference_demand_from_gpu_plan`)
replaces the generated curve; each hour's value holds for its twelve 5-minute ticks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ground.errors import UsageError

__all__ = [
    "ELASTIC_GPU_SHARE",
    "ELASTIC_SHARE",
    "FUNGIBLE_SHARE",
    "INFER_GPUS",
    "LOAD",
    "TICK_S",
    "TRAIN_GPUS",
    "LyraTrace",
    "diurnal_utilisation",
    "generate_trace",
    "inference_demand_from_gpu_plan",
]

SERVER_GPUS = 8
TRAIN_SERVERS, INFER_SERVERS = 443, 520
TRAIN_GPUS, INFER_GPUS = TRAIN_SERVERS * SERVER_GPUS, INFER_SERVERS * SERVER_GPUS
TICK_S = 300.0  # the inference samples and the orchestrator's period (§A2.1)
FUNGIBLE_SHARE, ELASTIC_SHARE, ELASTIC_GPU_SHARE = 0.21, 0.05, 0.36
LOAD = 0.85  # offered GPU-seconds / training capacity: Baseline then uses ~0.8 (spec: 0.72-0.82)
ELASTIC_GPUS_PER_WORKER = 2
MIN_S, MAX_S = 120.0, 5 * 86400.0

# Inelastic GPU demand (1 to 64 GPUs) [A]: most jobs are small, a few span 8 servers.
_DEMANDS = np.array([1, 2, 4, 8, 16, 32, 64])
_DEMAND_P = np.array([0.46, 0.15, 0.12, 0.17, 0.06, 0.03, 0.01])
_WMAX = np.array([2, 4, 8])  # elastic w_max in workers; w_min = w_max / 2 [A]
_WMAX_P = np.array([0.2, 0.45, 0.35])
# Hourly anchors of the inference utilisation (hour of day -> fraction) [A, shaped to §A1]:
# trough 0.42 at 05:00, 4 h peak of 0.95 from 20:00 to 23:00, mean 0.65.
_ANCHOR_H = np.array([0, 2, 4, 5, 7, 9, 12, 15, 17, 19, 20, 23, 24])
_ANCHOR_U = np.array(
    [0.80, 0.56, 0.45, 0.42, 0.46, 0.53, 0.57, 0.58, 0.64, 0.86, 0.95, 0.95, 0.80]
)


@dataclass(frozen=True)
class LyraTrace:
    """Jobs as parallel arrays (index = job id, sorted by submission) plus the inference load.

    `workers` is what the job asked for (w_max for an elastic job); `duration` its run time on
    V100 at that size (the "min running time" of an elastic job), so its work is
    `workers * duration` worker-seconds (§A1). `inference_gpus` is the T4 GPUs inference uses
    in each 5-minute tick.
    """

    submit: np.ndarray
    gpus_per_worker: np.ndarray
    workers: np.ndarray
    w_min: np.ndarray
    duration: np.ndarray
    fungible: np.ndarray
    elastic: np.ndarray
    inference_gpus: np.ndarray
    days: float

    @property
    def jobs(self) -> int:
        return int(self.submit.size)

    @property
    def demand(self) -> np.ndarray:
        """GPUs each job asks for."""
        return self.gpus_per_worker * self.workers


def diurnal_utilisation(days: float, rng: np.random.Generator | None = None) -> np.ndarray:
    """The inference cluster's utilisation every 5 minutes over `days` (§A1's curve).

    Days differ by a few percent and 5-minute bursts of ~0.5 % sit on top, so the 2 % headroom
    (§A2.1) matters; with `rng=None` the curve is the bare average day.
    """
    ticks = int(math.ceil(days * 86400 / TICK_S))
    hours = np.arange(ticks) * TICK_S / 3600
    u = np.interp(hours % 24, _ANCHOR_H, _ANCHOR_U)
    if rng is not None:
        day_scale = rng.normal(1.0, 0.015, int(math.ceil(days)) + 1)
        u = u * day_scale[(hours // 24).astype(int)] + rng.normal(0.0, 0.006, ticks)
    return np.clip(u, 0.0, 1.0)


def _check(days: float, jobs: int) -> None:
    if not (math.isfinite(days) and days > 0):
        raise UsageError(f"days must be positive, not {days}.", "pass e.g. days=15.")
    if jobs < 1:
        raise UsageError(f"jobs must be at least 1, not {jobs}.", "pass e.g. jobs=50000.")


def _inference_from_hourly(hourly: np.ndarray, days: float) -> np.ndarray:
    """5-minute T4 demand from an hourly array: each value holds for its hour, and 24 values
    stand for a typical day that repeats."""
    hourly = np.asarray(hourly, dtype=float)
    need = int(math.ceil(days * 24))
    if hourly.ndim != 1 or hourly.size == 0 or not np.all(np.isfinite(hourly)):
        raise UsageError(
            "inference_demand must be a 1-D array of finite GPU counts.",
            "pass one value per hour, e.g. from inference_demand_from_gpu_plan(...).",
        )
    if hourly.size == 24:
        hourly = np.tile(hourly, need // 24 + 1)
    if hourly.size < need:
        raise UsageError(
            f"inference_demand holds {hourly.size} hours; {days} days need {need} (or 24).",
            "pass one value per hour of the simulated days, or 24 values for a typical day.",
        )
    if hourly.min() < 0 or hourly.max() > INFER_GPUS:
        raise UsageError(
            f"inference_demand must lie in [0, {INFER_GPUS}] GPUs (the inference cluster).",
            "clip the demand or scale the request rate down.",
        )
    ticks = int(math.ceil(days * 86400 / TICK_S))
    return hourly[(np.arange(ticks) * TICK_S // 3600).astype(int)]


def _arrivals(rng: np.random.Generator, days: float, jobs: int) -> np.ndarray:
    """Submission times from a diurnal intensity (busy working hours, quieter weekends) [A]:
    inverse-CDF sampling gives exactly `jobs` arrivals."""
    grid = np.linspace(0.0, days * 86400, int(days * 24 * 12) + 2)
    hour = grid / 3600 % 24
    weekday = (grid // 86400) % 7 < 5
    rate = (1.0 + 0.7 * np.sin((hour - 9) / 24 * 2 * np.pi)) * np.where(weekday, 1.0, 0.7)
    cdf = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2)])
    return np.sort(np.interp(rng.random(jobs) * cdf[-1], cdf, grid))


def generate_trace(
    *,
    days: float = 15,
    jobs: int = 50_000,
    seed: int = 0,
    inference_demand: np.ndarray | None = None,
    load: float = LOAD,
) -> LyraTrace:
    """A trace calibrated to §A3 (see the module docstring); deterministic for a seed. `load`
    (offered GPU-seconds / training capacity) lets short traces be as congested as long ones."""
    _check(days, jobs)
    if not 0 < load <= 2:
        raise UsageError(f"load must be in (0, 2], not {load}.", "pass e.g. load=0.85.")
    rng = np.random.default_rng(seed)
    submit = _arrivals(rng, days, jobs)
    fungible = rng.random(jobs) < FUNGIBLE_SHARE
    elastic = fungible & (rng.random(jobs) < ELASTIC_SHARE / FUNGIBLE_SHARE)
    demand = rng.choice(_DEMANDS, size=jobs, p=_DEMAND_P)
    gpw = np.minimum(demand, SERVER_GPUS)
    workers = demand // gpw
    wmax = rng.choice(_WMAX, size=jobs, p=_WMAX_P)
    gpw = np.where(elastic, ELASTIC_GPUS_PER_WORKER, gpw)
    workers = np.where(elastic, wmax, workers)
    w_min = np.where(elastic, np.maximum(wmax // 2, 1), workers)
    duration = np.exp(rng.normal(0.0, 2.8, jobs))  # heavy tail: minutes to days
    duration = np.where(elastic, np.exp(rng.normal(0.0, 0.6, jobs)), duration)
    duration = _scale_to_load(duration, gpw * workers, elastic, load * TRAIN_GPUS * days * 86400)
    if inference_demand is None:
        inference = diurnal_utilisation(days, rng) * INFER_GPUS
    else:
        inference = _inference_from_hourly(inference_demand, days)
    return LyraTrace(submit, gpw, workers, w_min, duration, fungible, elastic, inference, days)


def _scale_to_load(
    duration: np.ndarray, demand: np.ndarray, elastic: np.ndarray, total: float
) -> np.ndarray:
    """Scale run times so all jobs together offer `total` GPU-seconds (the load's share of the
    training cluster) and elastic jobs hold 36 % of them (a few passes because clipping moves
    the totals). With the default w_max mix elastic jobs then run ~14.2 h on average (§A3)."""
    out = duration.copy()
    share = ELASTIC_GPU_SHARE if elastic.any() and (~elastic).any() else float(elastic.all())
    for group, target in ((elastic, share * total), (~elastic, (1 - share) * total)):
        for _ in range(8):
            work = float((out * demand)[group].sum())
            if work <= 0:
                break
            out[group] = np.clip(out[group] * target / work, MIN_S, MAX_S)
    return out


def inference_demand_from_gpu_plan(
    plan: object, hourly_rps: np.ndarray, max_utilisation: float = 0.8
) -> np.ndarray:
    """Hourly inference GPU demand of an MoE deployment at a (diurnal) request rate.

    `plan` is a `gpu.compare.GpuOption` or a `gpu.plan.GpuPlan` (one copy of the model on
    `plan.gpus` GPUs serving a batch in `latency_s` / `total_s`); the copies needed per hour
    come from `GpuOption.copies`, the project's own rate-to-copies rule, so the Lyra inference
    cluster sees the same GPU count the GPU backend would provision.
    """
    from gpu.compare import GpuOption
    from gpu.plan import GpuPlan

    if isinstance(plan, GpuPlan):
        plan = GpuOption(plan.gpu_types[0], plan.gpus, plan.total_s, 0.0)
    if not isinstance(plan, GpuOption):
        raise UsageError(
            f"plan must be a GpuOption or GpuPlan, not {type(plan).__name__}.",
            "pass gpu.compare.gpu_options(...)[i] or gpu.plan.GpuPlan.load(path).",
        )
    rates = np.asarray(hourly_rps, dtype=float)
    if rates.ndim != 1 or np.any(~np.isfinite(rates)) or np.any(rates < 0):
        raise UsageError(
            "hourly_rps must be a 1-D array of non-negative request rates.",
            "pass one rate per hour.",
        )
    copies = np.array([plan.copies(r, max_utilisation) if r > 0 else 0 for r in rates])
    return copies * plan.gpus
