"""The planner benchmark (`moelambda bench planner`): every solver on one instance at a loose,
a medium and a tight SLO, so the exact solver's speed and optimality are measured against ODS
and the MILP on the same run; and the quality benchmark (`moelambda bench quality`): each
MoEfication option's quality against the dense model beside its bill."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError
from ground.progress import Status, quiet
from planner.baselines import lambdaml
from planner.build import instance_for
from planner.calibration import load_calibration
from planner.compute import expert_compute_s
from planner.exact import solve_exact, solve_frontier
from planner.instance import Instance, Method
from planner.milp import solve_milp_mixed
from planner.ods import solve_ods
from planner.packing import balanced_groups, group_sizes, pack
from planner.shapes import load_shape, shape_counts

if TYPE_CHECKING:
    from predictor import RoutingTrace

__all__ = [
    "BENCH_OPTIONS",
    "FLOORS",
    "HALF_FLOPS",
    "baselines",
    "bench_planner",
    "bench_quality",
    "packed_exact",
    "paper_instance",
    "quality_grid",
    "shape_instance",
]


# The options `bench quality` compares per model: MoEfication as it was, then quality recovery
# at about half the dense FFN's FLOPs, then the least FLOPs that keep the stated floor.
BENCH_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "minilm": [
        {"experts": 4, "top_k": "2"},
        {"experts": 8, "top_k": "2"},
        {"experts": 8, "top_k": "4"},
        {"experts": 8, "top_k": "4", "correction": True, "fit_tokens": 131072},
        {"experts": 8, "top_k": "4", "correction": True, "router": "output", "fit_tokens": 131072},
        {"experts": 8, "top_k": "2", "shared": 0.25, "correction": True, "fit_tokens": 131072},
        # About 45 minutes of distillation on 2 cores the first time (then cached).
        {
            "experts": 8,
            "top_k": "4",
            "correction": True,
            "fit_tokens": 131072,
            "distil_steps": 3000,
        },
        {"experts": 8, "top_k": "6", "correction": True, "fit_tokens": 131072},
    ],
    # Before issue 38's recovery (8,192 fit tokens), then what its experiments chose on the
    # validation part (docs/model.md): the correction on 32,768 fit tokens at three quarters of
    # the FLOPs, without training, and the layer-local recipe at half.
    "smollm2": [
        {"experts": 8, "top_k": "4", "correction": True},
        {"experts": 8, "top_k": "6", "correction": True, "fit_tokens": 32768},
        {
            "experts": 8,
            "top_k": "4",
            "correction": True,
            "fit_tokens": 32768,
            "local_steps": 100,
        },
    ],
}
# Issue 38's targets for decoders: the best option (on validation text) of those within a
# FLOPs share, with no training or within a conversion time, and its test perplexity ratio.
DECODER_TARGETS: list[dict[str, Any]] = [
    {
        "name": "training-free, FFN FLOPs <= 0.75",
        "max_flops": 0.75,
        "training": False,
        "max_convert_minutes": None,
        "max_ppl_ratio": 1.25,
    },
    {
        "name": "FFN FLOPs <= 0.5, converted within 60 minutes",
        "max_flops": 0.5,
        "training": True,
        "max_convert_minutes": 60,
        "max_ppl_ratio": 1.5,
    },
]
# `bench quality --corpus FILE`: the options at half the FFN FLOPs, without and with
# distillation, each fitted on the embedded text and on the user's (`fit_comparison`).
USER_TEXT_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "minilm": [
        {"experts": 8, "top_k": "4", "correction": True, "fit_tokens": 131072},
        # 1,000 steps, not BENCH_OPTIONS' 3,000: about 2 s a step on this 2-core machine.
        {
            "experts": 8,
            "top_k": "4",
            "correction": True,
            "fit_tokens": 131072,
            "distil_steps": 1000,
        },
    ],
    "smollm2": [{"experts": 8, "top_k": "4", "correction": True}],
}
FLOORS = {"minilm": ("cosine_mean", 0.97), "smollm2": ("ppl_ratio", 1.05)}
HALF_FLOPS = 0.5


def paper_instance(
    trace: RoutingTrace, tokens: int, layers: int = 12
) -> tuple[Instance, dict[str, Any]]:
    """12 MoE layers (or fewer) x 16 experts of a BERT-base-sized model, with real skewed
    popularity.

    The popularity shares come from real MiniLM routing with 16 experts (its 6 layers, then the
    same 6 with the expert order reversed, for 12); the sizes from BERT-base (hidden 768, FFN
    3,072 in 16 experts of 192 neurons).
    """
    if trace.num_experts != 16:
        raise UsageError(
            f"the benchmark needs a 16-expert trace; this one has {trace.num_experts}.",
            "profile with --experts 16, or leave --traces out.",
        )
    shares = trace.popularity() / (trace.num_tokens * trace.top_k)
    shares = np.vstack([shares, shares[:, ::-1]])[:layers]
    counts = np.round(shares * tokens * 2)
    hidden, width = 768, 3072 // 16
    expert_bytes = (2 * hidden * width + width + hidden) * 4
    layer_bytes = (4 * hidden * hidden + 4 * hidden + 4 * hidden + hidden * 16) * 4
    cal = load_calibration()
    compute = expert_compute_s(cal, 2.0 * expert_bytes / 4)
    layer_compute = expert_compute_s(cal, 2.0 * layer_bytes / 4)
    nonmoe = float(np.interp(1769, np.asarray(cal.memory_options_mb, float), layer_compute))
    inst = Instance.build(
        counts,
        cal,
        expert_bytes=np.full(counts.shape, float(expert_bytes)),
        token_bytes=hidden * 4,
        compute_s=compute,
        nonmoe_compute_s=nonmoe,
        tokens=tokens,
    )
    facts = {
        "layers": layers,
        "experts": 16,
        "memory_options": len(cal.memory_options_mb),
        "max_replicas": cal.max_replicas,
        "tokens": tokens,
        "betas": len(inst.betas),
        "expert_bytes": expert_bytes,
        "busiest_expert_share": round(float(shares.max()), 4),
        "counts_from": trace.meta.get("corpus"),
    }
    return inst, facts


def shape_instance(shape: str, popularity: str, tokens: int) -> tuple[Instance, dict[str, Any]]:
    """The planning instance of a model shape (no weights) and what describes it."""

    described = load_shape(shape)
    counts, label = shape_counts(described, tokens, popularity)
    cal = load_calibration()
    inst = instance_for(described.manifest(), counts, cal, tokens=tokens)
    facts = {
        "shape": described.name,
        "layers": inst.layers,
        "experts": inst.experts,
        "top_k": described.top_k,
        "memory_options": len(cal.memory_options_mb),
        "max_replicas": cal.max_replicas,
        "tokens": tokens,
        "betas": len(inst.betas),
        "expert_bytes": int(inst.expert_bytes.max()),
        "busiest_expert_share": round(float(counts.max() / (tokens * described.top_k)), 4),
        "counts_from": label,
    }
    return inst, facts


def packed_exact(inst: Instance, slo_s: float) -> dict[str, Any]:
    """`plan --pack auto` with the exact solver at one SLO: the cost of each number of experts
    per function (None: no plan), the cheapest, and the seconds all of them took."""
    started = time.perf_counter()
    by_size: dict[str, float | None] = {}
    for size in group_sizes(inst.experts):
        packed = inst if size == 1 else pack(inst, balanced_groups(inst.counts, size))
        solution = solve_exact(packed, slo_s)
        by_size[str(size)] = None if solution is None else solution.cost
    found = {k: v for k, v in by_size.items() if v is not None}
    best = min(found, key=lambda k: found[k]) if found else None
    return {
        "experts_per_function": None if best is None else int(best),
        "cost_usd": None if best is None else found[best],
        "by_size": by_size,
        "seconds": round(time.perf_counter() - started, 4),
    }


def baselines(inst: Instance, slo_s: float) -> dict[str, float | None]:
    """Costs of LambdaML and of each uniform method (exact, so fast) at one SLO."""
    found = {"lambdaml": lambdaml(inst, slo_s)}
    for method in Method:
        found[f"uniform-{method.label}"] = solve_exact(inst, slo_s, (method,))
    return {name: None if s is None else s.cost for name, s in found.items()}


def bench_planner(
    inst: Instance,
    facts: dict[str, Any],
    *,
    time_limit_s: float = 60.0,
    exact_only: bool = False,
    status: Status = quiet,
) -> dict[str, Any]:
    """Solve `inst` at a loose, a medium and a tight SLO with every solver (the exact one only
    with `exact_only`: ODS and the MILP take minutes at real-model scale), with packing and the
    baselines; the summary `moelambda bench planner` prints. `status` wraps each step (a
    spinner in the CLI)."""
    with status("building the frontier"):
        frontier = solve_frontier(inst)
    cheapest = frontier.best(None)
    fastest = frontier.min_latency()
    slos = {
        "loose": cheapest.latency,
        "medium": (cheapest.latency + fastest) / 2,
        "tight": fastest * 1.02,
    }
    results = []
    totals = {"exact": 0.0, "ods": 0.0, "packed": 0.0}
    for label, slo_s in slos.items():
        entry: dict[str, Any] = {"label": label, "slo_s": round(slo_s, 6), "solvers": {}}
        with status(f"{label} SLO {slo_s:.3f} s: exact, ODS, MILP"):
            solvers = (
                ("exact", lambda s=slo_s: solve_exact(inst, s)),
                ("ods", lambda s=slo_s: solve_ods(inst, s, time_limit_s=time_limit_s)),
                ("milp", lambda s=slo_s: solve_milp_mixed(inst, s, time_limit_s=time_limit_s)),
            )
            for name, solve in solvers[:1] if exact_only else solvers:
                started = time.perf_counter()
                solution = solve()
                seconds = time.perf_counter() - started
                row: dict[str, Any] = {
                    "seconds": round(seconds, 4),
                    "feasible": solution is not None,
                }
                if solution is not None:
                    row["cost_usd"] = solution.cost
                    row["latency_s"] = round(solution.latency, 6)
                if name == "milp":
                    row["optimal"] = bool(solution is not None and solution.optimal)
                if name in totals:
                    totals[name] += seconds
                entry["solvers"][name] = row
        solvers = entry["solvers"]
        with status(f"{label} SLO {slo_s:.3f} s: packed"):
            entry["packed"] = packed_exact(inst, slo_s)
        totals["packed"] += entry["packed"]["seconds"]
        entry["baselines_usd"] = baselines(inst, slo_s)
        exact_cost = solvers["exact"].get("cost_usd")
        if exact_cost is not None and not exact_only:
            ods = solvers["ods"].get("cost_usd")
            entry["exact_vs_ods"] = None if ods is None else round(exact_cost / ods, 6)
            milp = solvers["milp"]
            if milp.get("optimal"):
                entry["exact_equals_milp"] = (
                    abs(milp["cost_usd"] - exact_cost) <= 1e-6 * exact_cost
                )
        results.append(entry)
    summary = {
        "instance": facts,
        "frontier_points": int(frontier.cost_usd.size),
        "slos": results,
        "exact_total_s": round(totals["exact"], 4),
        "exact_target_s": 0.25 if not exact_only else 5.0,
        "packed_total_s": round(totals["packed"], 4),
        "packed_never_worse": all(
            entry["packed"]["cost_usd"] <= entry["solvers"]["exact"]["cost_usd"] * (1 + 1e-9)
            for entry in results
            if entry["solvers"]["exact"]["feasible"]
        ),
    }
    if not exact_only:
        summary |= {
            "ods_total_s": round(totals["ods"], 4),
            "exact_speedup_vs_ods": round(totals["ods"] / max(totals["exact"], 1e-9), 1),
            "speedup_target": 20.0,
            "paper_ods_s": 2.27,
        }
    return summary


def bench_quality(
    models: str = "minilm,smollm2",
    tokens: int = 10240,
    *,
    seeds: tuple[int, ...] = (0, 1),
    cached_only: bool = False,
    corpus: str = "wiki",
    status: Status = quiet,
) -> dict[str, Any]:
    """Each MoEfication option of `BENCH_OPTIONS` against the dense model, with its bill.

    With a `corpus` of the user's (a file), the options are `USER_TEXT_OPTIONS`, each fitted on
    the embedded text and on the corpus's fit part, all judged on the corpus's test part (and
    chosen on its validation part); `fit_comparison` sets each pair side by side.

    Per model and seed (`quality_by_seed`): quality on 16,384 tokens of the corpus's test part,
    FFN FLOPs share and the bill of a batch of `tokens` (the cheapest plan, exact solver) per
    option (`planner.choose.choose`); the best option at no more than `HALF_FLOPS` of the dense
    FFN's FLOPs, chosen on the validation part and reported on the test part, against the
    target (MiniLM: mean cosine >= 0.97 and 10-neighbour overlap >= 0.80; SmolLM2: perplexity
    ratio <= 1.05); the cheapest option keeping `FLOORS`; and the seconds `quality` takes on
    MiniLM once cached.

    Example::

        report = bench_quality("minilm", tokens=10240, seeds=(0,))
        print(report["models"]["minilm"]["seeds"][0]["chosen_for_floor"])

    Args:
        models: Comma-separated: minilm, smollm2.
        tokens: Tokens per planned batch.
        seeds: MoEfication seeds (each also seeds its quality windows); the second shows how
            much of a number is the seed's.
        cached_only: Leave out each option not in the model cache yet (a distilled MiniLM
            option converts in about 48 minutes on 2 cores, one with the correction on 131,072
            fit tokens in several), naming it under `not_converted`.
        corpus: "wiki", or a text/JSONL file of the user's (see above).
        status: Wraps each model's options (a spinner in the CLI); gets an `update`.

    Returns:
        The report `moelambda bench quality --json` prints.
    """
    from moe import dense_reference, load_corpus, load_model, measure_quality
    from moe._cache import cached_export_dir
    from planner.choose import Floor

    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in BENCH_OPTIONS]
    if unknown or not names:
        raise UsageError(
            f"--models {models!r}: {', '.join(unknown) or 'nothing'} is not benchmarked.",
            f"pass some of {', '.join(BENCH_OPTIONS)}.",
        )
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UsageError(f"--seeds {seeds} is not a list of distinct seeds.", "pass e.g. 0,1.")
    report: dict[str, Any] = {"tokens": tokens, "corpus": corpus, "models": {}}
    if corpus != "wiki":  # a missing or unreadable file is said before any conversion
        report["corpus_sha256"] = load_corpus(corpus).sha256
    for name in names:
        metric, value = FLOORS[name]
        floor = Floor(metric, value)
        runs = []
        for seed in seeds:
            grid = quality_grid(name, seed, corpus)
            left_out = [
                o
                for o in grid
                if cached_only
                and cached_export_dir(name, experts=o.experts, top_k=o.top_k.k, options=o) is None
            ]
            grid = [o for o in grid if o not in left_out]
            with status(f"{name}, seed {seed}: {len(grid)} options") as shown:
                run = quality_by_seed(name, grid, floor, tokens, seed, shown.update, corpus)
            run |= {"not_converted": [o.label() for o in left_out]}
            if corpus != "wiki":
                run["fit_comparison"] = fit_comparison(run["options"])
            runs.append(run)
        report["models"][name] = {"floor": {"metric": metric, "value": value}, "seeds": runs}
    if "minilm" in names and corpus == "wiki":
        model = load_model("minilm", options=quality_grid("minilm", seeds[0])[0])
        started = time.perf_counter()
        measure_quality(model, dense_reference("minilm"), load_corpus("wiki"), tokens=16384)
        seconds = time.perf_counter() - started
        report["quality_16384_tokens_s"] = round(seconds, 2)
        report["quality_target_s"] = 60
        report["quality_within_target"] = seconds <= 60
    return report


def quality_by_seed(
    model: str,
    grid: list[Any],
    floor: Any,
    tokens: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
    corpus: str = "wiki",
) -> dict[str, Any]:
    """One seed of `bench_quality`: every option's row, and the best at half the FLOPs chosen
    on validation quality, its test quality reported (`planner.choose.Floor` `floor`)."""
    from planner.choose import choose

    selection = choose(
        model, grid, floor, corpus=corpus, tokens=tokens, seed=seed, progress=progress
    )
    rows = [r.describe() for r in selection.results]
    half = [r for r in rows if r["expert_flops_share"] <= HALF_FLOPS + 1e-9]
    if not half:
        raise UsageError(
            f"no option of the {model} grid runs at most {HALF_FLOPS:.0%} of the FFN FLOPs.",
            "add one to BENCH_OPTIONS.",
        )
    if floor.metric == "cosine_mean":
        best = max(half, key=lambda r: r["validation_quality"]["cosine_mean"])
        meets = (
            best["quality"]["cosine_mean"] >= 0.97
            and best["quality"]["neighbour_overlap_10"] >= 0.80
        )
    else:
        best = min(half, key=lambda r: r["validation_quality"]["ppl_ratio"])
        meets = best["quality"]["ppl_ratio"] <= 1.05
    chosen = None if selection.chosen is None else rows[selection.chosen]
    targets = (
        [] if floor.metric == "cosine_mean" else [decoder_target(t, rows) for t in DECODER_TARGETS]
    )
    return {
        "seed": seed,
        "targets": targets,
        "options": rows,
        "best_at_half_flops": best["label"],
        "best_at_half_flops_quality": best["quality"],
        "half_flops_target_met": meets,
        "chosen_for_floor": None if chosen is None else chosen["label"],
        "chosen_bill_usd": None if chosen is None else chosen["bill_usd"],
    }


def decoder_target(target: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best option (lowest validation perplexity ratio) of `rows` within `target`'s FLOPs
    share, trained or not, and conversion time, with its test ratio against the target."""

    def eligible(row: dict[str, Any]) -> bool:
        moefy, minutes = row["moefy"], (row.get("convert_s") or 0.0) / 60
        trained = bool(moefy.get("distil_steps") or moefy.get("local_steps"))
        budget = target["max_convert_minutes"]
        return (
            row["expert_flops_share"] <= target["max_flops"] + 1e-9
            and (target["training"] or not trained)
            and (budget is None or (row.get("convert_s") is not None and minutes <= budget))
        )

    candidates = [r for r in rows if eligible(r)]
    best = min(candidates, key=lambda r: r["validation_quality"]["ppl_ratio"], default=None)
    ratio = None if best is None else best["quality"]["ppl_ratio"]
    return {
        **target,
        "best": None if best is None else best["label"],
        "ppl_ratio": ratio,
        "validation_ppl_ratio": None if best is None else best["validation_quality"]["ppl_ratio"],
        "convert_s": None if best is None else best.get("convert_s"),
        "met": ratio is not None and ratio <= target["max_ppl_ratio"],
    }


def quality_grid(name: str, seed: int = 0, corpus: str = "wiki") -> list[Any]:
    """The `moe.MoefyOptions` of `BENCH_OPTIONS[name]`, MoEfied with `seed`; for a `corpus` of
    the user's, those of `USER_TEXT_OPTIONS[name]`, each fitted on the embedded text and on
    `corpus`."""
    from moe import MoefyOptions
    from moe._options import parse_top_k

    if corpus == "wiki":
        return [
            MoefyOptions(**{**o, "top_k": parse_top_k(o["top_k"], o["experts"]), "seed": seed})
            for o in BENCH_OPTIONS[name]
        ]
    return [
        MoefyOptions(
            **{**o, "top_k": parse_top_k(o["top_k"], o["experts"]), "seed": seed},
            fit_corpus=fit,
        )
        for o in USER_TEXT_OPTIONS[name]
        for fit in ("wiki", corpus)
    ]


def fit_comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each option fitted on the embedded text beside the same option fitted on the judged
    text, both on the judged text's test part: what fitting on the user's text gains."""
    pairs: dict[str, dict[str, Any]] = {}
    for row in rows:
        same = {k: v for k, v in row["moefy"].items() if not k.startswith("fit_corpus")}
        entry = pairs.setdefault(json.dumps(same, sort_keys=True), {"moefy": same})
        side = "user" if row["fitted_on_judged_text"] else "wiki"
        entry[side] = {
            key: row["quality"].get(key)
            for key in (
                "cosine_mean",
                "cosine_p05",
                "neighbour_overlap_10",
                "ppl_ratio",
                "next_token_agreement",
                "expert_flops_share",
            )
            if row["quality"].get(key) is not None
        }
    return list(pairs.values())
