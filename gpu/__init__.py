"""GPU-cluster backend: the same MoE model on GPUs instead of Lambda functions.

Aurora's expert placement and contention-free all-to-all schedule (`gpu.aurora`), Lina's
popularity-based expert scheduling (`gpu.lina`), a cluster catalogue with prices (`gpu.cluster`),
per-layer routing matrices from real traces (`gpu.traffic`), the plan document (`gpu.plan`), a real
multi-process run on torch.distributed (`gpu.run`) and the serverless-vs-GPU comparison
(`gpu.compare`). The commands' functions are in `gpu.api`, exported here (`run_plan`, which
imports torch, on first use). Specs: ../shared/specs/aurora.md and
lyra-lina-adaptive-gating.md part B.
"""

from __future__ import annotations

from gpu.api import (
    SCHEDULERS,
    Comparison,
    bench_aurora,
    check_gpu_plan,
    colocation,
    compare_serverless_gpu,
    lina_statistics,
    plan_deployment,
)

__all__ = [
    "SCHEDULERS",
    "Comparison",
    "bench_aurora",
    "check_gpu_plan",
    "colocation",
    "compare_serverless_gpu",
    "lina_statistics",
    "plan_deployment",
    "run_plan",
]


def __getattr__(name: str) -> object:
    if name == "run_plan":  # torch loads only when the run is asked for
        from gpu.run import run_plan

        return run_plan
    raise AttributeError(f"module 'gpu' has no attribute '{name}'")
