"""GPU-cluster schedulers on training traces: ElasticFlow, EDF, Tiresias, Gandiva (the
ElasticFlow artifact's traces), Rubick (its workloads) and Lyra (a generated trace).

The commands' functions: `simulate_scheduler` and `compare_schedulers` (`cluster.replay`,
which also has `replay`, one scheduler by name on one trace, and the scheduler registry), and
`bench_cluster` and `bench_lyra` (`cluster.bench`).
"""

from __future__ import annotations

from cluster.bench import bench_cluster, bench_lyra
from cluster.replay import (
    SCHEDULERS,
    LyraOptions,
    compare_schedulers,
    plot_comparison,
    replay,
    simulate_scheduler,
)

__all__ = [
    "SCHEDULERS",
    "LyraOptions",
    "bench_cluster",
    "bench_lyra",
    "compare_schedulers",
    "plot_comparison",
    "replay",
    "simulate_scheduler",
]
