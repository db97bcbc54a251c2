"""`moelambda bo` as a call: check the settings, run the comparison over seeds, plot it.

Example (a trace from `moelambda profile`)::

    from planner.bo import BoSettings, compare_strategies
    report = compare_strategies(trace, manifest, load_calibration(), BoSettings(iterations=20))
    print(report["methods"]["multi-eps"]["cost_vs_oracle"])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import InfeasibleError, UsageError
from planner.bo._run import BoSettings, Tuned, run_bo
from planner.bo._seeds import claims, statistics

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.calibration import Calibration
    from predictor import RoutingTrace

__all__ = ["check_bo", "compare_strategies", "plot_convergence"]


def check_bo(
    *,
    iterations: int,
    seeds: int = 1,
    learn_batches: int = 1,
    test_batches: int = 20,
    slo_s: float | None = None,
) -> None:
    """Refuse a comparison that cannot run, before the trace or the model is loaded."""
    if iterations < 1:
        raise UsageError(f"--iterations {iterations} is not positive.", "pass 1 or more.")
    if seeds < 1:
        raise UsageError(f"--seeds {seeds} is not positive.", "pass --seeds 1 or more.")
    for name, value in (("--learn-batches", learn_batches), ("--test-batches", test_batches)):
        if value < 1:
            raise UsageError(f"{name} {value} is not positive.", f"pass {name} 1 or more.")
    if slo_s is not None and not slo_s > 0:
        raise UsageError(f"--slo {slo_s} is not positive.", "pass a positive --slo.")


def compare_strategies(
    trace: RoutingTrace,
    manifest: Manifest,
    calibration: Calibration,
    settings: BoSettings,
    *,
    seeds: int = 1,
    plot: Path | None = None,
    force: bool = False,
    on_trial: Callable[[str, int, float], None] | None = None,
    on_seed: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Tune the predictor with every search strategy and test each on held-out batches, with
    seeds `settings.seed`, `settings.seed + 1`, ... (`run_bo` per seed).

    Example::

        settings = BoSettings(iterations=20, methods=("multi-eps", "none"))
        report = compare_strategies(trace, manifest, load_calibration(), settings, seeds=3)
        print(report["claims"])

    Args:
        trace: The routing trace (`moelambda profile`).
        manifest: The manifest of the model the trace was recorded on.
        calibration: The platform's parameters.
        settings: The comparison's settings (strategies, batches, ε-greedy constants, SLO).
        seeds: Seeds to repeat the comparison with. Defaults to 1.
        plot: Write the first seed's convergence PNG here (`plot_convergence`). Defaults to
            None.
        force: Replace an existing `plot`. Defaults to False.
        on_trial: Called with (strategy, trials done, best cost) after each trial.
        on_seed: Called with the seed's offset before each seed's comparison.

    Returns:
        What `moelambda bo --json` prints: with one seed `run_bo`'s report; with more, the
        seeds, each strategy's mean and spread ("statistics"), a verdict on each of the
        paper's claims and every seed's report ("per_seed").
    """
    check_bo(
        iterations=settings.iterations,
        seeds=seeds,
        learn_batches=settings.learn_batches,
        test_batches=settings.test_batches,
        slo_s=settings.slo_s,
    )
    reports, first = [], None
    for offset in range(seeds):
        if on_seed is not None:
            on_seed(offset)
        run_settings = dataclasses.replace(settings, seed=settings.seed + offset)
        report, searches = run_bo(trace, manifest, calibration, run_settings, on_trial=on_trial)
        reports.append(report)
        first = first or searches
    report = reports[0]
    assert first is not None
    if plot is not None:
        plot_convergence(plot, report, first, force=force)
        report["plot"] = str(plot)
    if seeds == 1:
        return report
    return {
        "seeds": [settings.seed + offset for offset in range(seeds)],
        "statistics": statistics(reports),
        "claims": claims(reports),
        "per_seed": reports,
    }


def plot_convergence(
    path: Path, report: dict[str, Any], searches: dict[str, Tuned], *, force: bool = False
) -> None:
    """Best learning cost per iteration and per second of every strategy, over the oracle's,
    as a PNG at `path` (`run_bo`'s report and searches).

    Example::

        report, searches = run_bo(trace, manifest, load_calibration(), BoSettings())
        plot_convergence(Path("out/bo.png"), report, searches)

    Raises:
        InfeasibleError: No search found a feasible plan.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ground.files import write_file_atomically

    if not any(search.best for search in searches.values()):
        raise InfeasibleError(
            f"no search found a feasible plan at the SLO of {report['slo_s']:.2f} s: the plot "
            "would show nothing.",
            "pass a larger --slo, or leave --plot out.",
        )
    oracle = report["learn_oracle_cost_usd"]
    fig, (by_iter, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, search in searches.items():
        if not search.best:
            continue
        ratio = [b / oracle for b in search.best]
        by_iter.plot(range(1, len(ratio) + 1), ratio, label=name)
        by_time.plot(search.elapsed, ratio, label=name)
    for ax, label in ((by_iter, "iteration"), (by_time, "seconds")):
        ax.axhline(1.0, color="black", lw=0.8, ls="--", label="oracle (real counts)")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    by_iter.set_ylabel("best objective on the learning batches ÷ oracle")
    by_iter.legend()
    setup = report["setup"]
    fig.suptitle(
        f"BO of {setup['predictor']} on {setup['model']} E={setup['experts']} "
        f"k={setup['top_k']}, SLO {report['slo_s']:.2f} s"
    )
    fig.tight_layout()
    try:
        write_file_atomically(
            path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), force=force
        )
    finally:
        plt.close(fig)
