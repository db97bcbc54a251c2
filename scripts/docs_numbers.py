"""The numbers in README.md and docs/ that a benchmark measures, rendered from its JSON output.

A block a `moelambda bench ... --json` run measures sits between two markers,

    <!-- numbers: quality-minilm -->
    | ... |
    <!-- /numbers -->

and is rendered by `RENDERERS[name]` from the JSON kept in docs/measured/ (`SOURCES` names the
command that wrote each file). `tests/test_docs.py` fails when a block differs from its rendering
or names no renderer, so a table cannot drift from the run it cites, and two pages citing the
same run cannot disagree. After re-running a benchmark:

    moelambda bench quality --models minilm --seeds 0,1 --json > docs/measured/bench-quality.json
    python scripts/docs_numbers.py --write     # rewrite every block (README.md, docs/*.md)
    python scripts/docs_numbers.py             # exit 1 and name the stale blocks
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "measured"
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- numbers: ([a-z0-9-]+) -->\n)(.*?)(<!-- /numbers -->)", re.S)
SOURCES = {
    "bench-gpu-lambda.json": "moelambda bench gpu-lambda --json (2026-12-06)",
    "bench-shapes.json": "moelambda bench shapes --plot out/shapes.png --json (2026-12-06)",
    "bench-precision.json": "moelambda bench precision --json (2026-12-06)",
    "bench-generate.json": (
        "moelambda bench generate --smollm2-counts smollm2-counts.json --models "
        "smollm2,olmoe,mixtral --json (2026-12-06; the counts: `predict --counts-out` on a "
        "`profile --model smollm2 --experts 8 --top-k 4 --correction` trace)"
    ),
    "bench-generate-2026-shapes.json": (
        "moelambda bench generate --models gpt-oss-20b,qwen3-30b-a3b --json (2026-12-06)"
    ),
    "bench-stream.json": (
        "moelambda bench stream --plan out/smollm2-stream-8slots.json --requests 24 --rate 0.25 "
        "--json (2026-12-06; the plan: `plan --counts` of a `profile --model smollm2 --experts 8 "
        "--top-k 4 --correction` trace, `--traffic azure-conv --scale 0.1808 --hours 1 "
        "--slo-ttft 30 --slo-tpot 0.25 --slots 8`)"
    ),
    "bench-quality.json": (
        "moelambda bench quality --models minilm --seeds 1,0 --cached-only --json "
        "(2026-11-28; the options it names as not converted were not in the model cache)"
    ),
    "bench-quality-jargon.json": (
        "sh scripts/jargon_text.sh && moelambda bench quality --models minilm --seeds 0 "
        "--corpus out/texts/jargon.txt --cached-only --json (2026-11-28; its four options "
        "converted just before, by `load_model` on the same code, two at a time)"
    ),
}


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _option_name(moefy: dict[str, Any]) -> str:
    """'E8 k4 + correction + 3,000 distillation steps (131,072 fit tokens)'."""
    parts = [f"E{moefy['experts']} k{moefy['top_k']}"]
    if moefy.get("router") == "output":
        parts.append("output router")
    if moefy.get("shared"):
        parts.append(f"shared {moefy['shared']:.0%}".replace("%", " %"))
    name = " ".join(parts)
    if moefy.get("correction"):
        name += " + correction"
    if moefy.get("distil_steps"):
        name += f" + {moefy['distil_steps']:,} distillation steps"
    if moefy.get("fit_tokens", 8192) != 8192:
        name += f" ({moefy['fit_tokens']:,} fit tokens)"
    return name


def _encoder_cells(quality: dict[str, Any]) -> list[str]:
    return [
        f"{quality['cosine_mean']:.3f}",
        f"{quality['cosine_p05']:.3f}",
        f"{quality['neighbour_overlap_10']:.0%}".replace("%", " %"),
    ]


def quality_minilm() -> str:
    """MiniLM's options on the test part, per seed, with the seed-0 bill; the option the
    benchmark picks for the floor (on validation text) in bold."""
    report = _load("bench-quality.json")
    result = report["models"]["minilm"]
    runs = sorted(result["seeds"], key=lambda run: run["seed"])
    seeds = [run["seed"] for run in runs]
    head = ["MiniLM option", "FFN FLOPs"]
    for seed in seeds:
        head += [f"mean cosine (seed {seed})", "p5 cosine", "10-NN kept"]
    head.append(f"bill per {report['tokens']:,} tokens (seed {seeds[0]})")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    dense = ["dense (every expert selected)", "100 %"] + ["1", "1", "100 %"] * len(runs) + ["-"]
    lines.append("| " + " | ".join(dense) + " |")
    chosen = runs[0]["chosen_for_floor"]
    by_label = [{row["label"]: row for row in run["options"]} for run in runs]
    for row in runs[0]["options"]:
        name = _option_name(row["moefy"])
        if row["label"] == chosen:
            name = f"**{name}**"
        cells = [name, f"{row['expert_flops_share']:.0%}".replace("%", " %")]
        for rows in by_label:
            same = rows.get(row["label"])
            cells += ["not run"] * 3 if same is None else _encoder_cells(same["quality"])
        cells.append("no plan" if row["bill_usd"] is None else f"${row['bill_usd']:.6f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def quality_minilm_summary() -> str:
    """One sentence per seed: the best option at half the FLOPs, chosen on validation text,
    and its test numbers against the target."""
    report = _load("bench-quality.json")
    result = report["models"]["minilm"]
    sentences = []
    for run in sorted(result["seeds"], key=lambda run: run["seed"]):
        q = run["best_at_half_flops_quality"]
        verdict = "meets" if run["half_flops_target_met"] else "misses"
        sentences.append(
            f"Seed {run['seed']}: at half the FFN FLOPs the best option on validation text is "
            f"{run['best_at_half_flops']}; on test text it keeps a mean cosine of "
            f"{q['cosine_mean']:.3f} (p5 {q['cosine_p05']:.3f}) and "
            f"{q['neighbour_overlap_10']:.0%}".replace("%", " %")
            + f" of the 10 nearest neighbours, and {verdict} the "
            f"target (0.97 and 80 %). The cheapest option keeping a mean cosine of "
            f"{result['floor']['value']} on validation text is "
            f"{run['chosen_for_floor'] or 'none of those run'}."
            + (
                f" Not run with this seed (not converted yet: `--cached-only`): "
                f"{', '.join(run['not_converted'])}."
                if run.get("not_converted")
                else ""
            )
        )
    if "quality_16384_tokens_s" in report:
        sentences.append(
            f"`quality` takes {report['quality_16384_tokens_s']:.1f} s on 16,384 tokens once "
            f"the model is cached (target {report['quality_target_s']} s)."
        )
    return "\n".join(sentences) + "\n"


def quality_user_text() -> str:
    """Each option of `bench quality --corpus`, fitted on the embedded text and on the user's,
    both judged on the user's test part, per seed."""
    report = _load("bench-quality-jargon.json")
    lines = [
        "| MiniLM option, seed | FFN FLOPs | fitted on wiki: mean cosine | p5 | 10-NN kept "
        "| fitted on this text: mean cosine | p5 | 10-NN kept | bill per "
        f"{report['tokens']:,} tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in sorted(report["models"]["minilm"]["seeds"], key=lambda run: run["seed"]):
        own = {r["label"]: r for r in run["options"] if r["fitted_on_judged_text"]}
        for pair in run["fit_comparison"]:
            cells = [f"{_option_name(pair['moefy'])}, {run['seed']}"]
            flops = (pair.get("user") or pair.get("wiki") or {}).get("expert_flops_share")
            cells.append("-" if flops is None else f"{flops:.0%}".replace("%", " %"))
            for side in ("wiki", "user"):
                q = pair.get(side)
                cells += ["not run"] * 3 if q is None else _encoder_cells(q)
            bill = next(
                (
                    r["bill_usd"]
                    for r in own.values()
                    if {k: v for k, v in r["moefy"].items() if not k.startswith("fit_corpus")}
                    == pair["moefy"]
                ),
                None,
            )
            cells.append("-" if bill is None else f"${bill:.6f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rate(rate: float) -> str:
    return "1/min" if abs(rate - 1 / 60) < 1e-9 else f"{rate:g}/s"


def _hardware_cell(plan: dict[str, Any]) -> str:
    """'stages on 13 x g6e.xlarge: 0.77' or 'misses (p99 178 s): 15.1'."""
    usd = plan.get("per_million_tokens_usd")
    if not plan["feasible"]:
        best = plan.get("best_p99_s")
        return "misses" + (f" (best p99 {best:.1f} s)" if best is not None else "")
    where = plan.get("capacity") if plan["hardware"] == "cpu" else None
    if plan.get("instances"):
        where = f"{plan['instances']} x {plan['instance_type']}"
    shape = plan.get("shape", "") + ("" if plan.get("deployable") else " (no handler)")
    return f"{shape}{f', {where}' if where else ''}: {usd:.3g}"


def gpu_lambda() -> str:
    """`bench gpu-lambda`: per model and rate, each hardware's cheapest plan meeting the SLO,
    its bill per million prompt tokens, beside the managed API's list price."""
    report = _load("bench-gpu-lambda.json")
    lines = [
        "| model | rate | CPU only | GPU only | GPU driver, CPU experts (gpu+cpu) "
        "| cheapest that runs | cheapest as priced | managed API |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in report["models"]:
        api = model["managed_api"]["per_million_input_usd"]
        for run in model["runs"]:
            cells = [model["label"], _rate(run["rate_per_s"])]
            cells += [_hardware_cell(run["plans"][h]) for h in ("cpu", "gpu", "gpu+cpu")]
            cells.append(run["cheapest"] or "none")
            cells.append(run["cheapest_priced"] or "none")
            cells.append("no list price" if api is None else f"{api:g}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def precision() -> str:
    """`bench precision`: per precision MiniLM's batch and the SmolLM2 MoE's decode speeds,
    the weight bytes a token reads, and the planner's TPOT beside the measured one."""
    report = _load("bench-precision.json")
    lines = [
        "| weights | MiniLM tokens/s (batch) | SmolLM2 decode tokens/s, 1 sequence | bytes/token "
        "| 8 sequences | bytes/token | decode vs fp32 (1) | TPOT (1) planned / measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in report["rows"].items():
        one, eight = row["decode"]["1"], row["decode"]["8"]
        planned = one["predicted_tpot_s"]
        cells = [
            name,
            f"{row['minilm_tokens_per_s']:,.0f}",
            f"{one['tokens_per_s']:.1f}",
            f"{one['bytes_per_token'] / 1e6:.0f} MB",
            f"{eight['tokens_per_s']:.1f}",
            f"{eight['bytes_per_token'] / 1e6:.0f} MB",
            f"{row['speed_vs_fp32']['decode_1_speedup']:.2f}x",
            "not priced"
            if planned is None
            else f"{planned * 1e3:.0f} / {one['tpot_s'] * 1e3:.0f} ms",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stream() -> str:
    """`bench stream`: measured against simulated TTFT/TPOT and decode tokens per second, and
    the requests metered against planned."""
    r = _load("bench-stream.json")
    m, s, gap = r["measured"], r["simulated"], r["measured_over_simulated_minus_1"]
    lines = [
        f"{r['requests']} requests at {r['rate_per_s']:g}/s ({r['prompt_tokens']:,} prompt "
        f"and {r['completion_tokens']:,} completion tokens), one worker of {r['slots']} slots, "
        f"{r['wall_s']:.0f} s:",
        "",
        "| | measured | simulated | measured / simulated - 1 |",
        "|---|---|---|---|",
    ]
    for label, key, q in (
        ("TTFT p50 (s)", "ttft_s", "p50"),
        ("TTFT p99 (s)", "ttft_s", "p99"),
        ("TPOT p50 (s)", "tpot_s", "p50"),
        ("TPOT p99 (s)", "tpot_s", "p99"),
    ):
        ratio = m[key][q] / s[key][q] - 1
        lines.append(f"| {label} | {m[key][q]:.3f} | {s[key][q]:.3f} | {ratio:+.0%} |")
    lines.append(
        f"| decode tokens/s | {m['decode_tokens_per_s']:.1f} | {s['decode_tokens_per_s']:.1f} "
        f"| {gap['decode_tokens_per_s']:+.0%} |"
    )
    worker = m["worker"]
    pairs = [
        f"{b} sequence{'s' if b > 1 else ''} {own:.3f} s (table {s['step_s'][b - 1]:.3f})"
        for b, own in enumerate(worker["step_s"], start=1)
        if own is not None and b in (1, 2, 4, 6)
    ]
    lines += [
        "",
        f"The worker's own decode steps this run (median; mean batch "
        f"{worker['mean_decode_batch']:.2f}, simulated {s['mean_decode_batch']:.2f}): "
        + ", ".join(pairs)
        + f"; its prefill {worker['prefill_token_s'] * 1e3:.2f} ms a token (planned "
        f"{s['prefill_token_s'] * 1e3:.2f}).",
    ]
    same = "equal" if r["metered_equals_planned"] else "differ from"
    got = r["requests_metered"]
    lines += [
        "",
        f"Requests metered {same} the plan's: {got['sqs_send']} SendMessage, "
        f"{got['sqs_delete']} DeleteMessage, {got['s3_put']} result PUTs, {got['s3_head']} "
        f"HEADs; polls (not planned exactly): {r['polls_metered']['sqs_receive']:,} "
        f"ReceiveMessage, {r['polls_metered']['s3_get_missing']:,} GETs of a piece not yet "
        "written.",
    ]
    return "\n".join(lines) + "\n"


_GENERATE = ("bench-generate.json", "bench-generate-2026-shapes.json")


def _usd(block: dict[str, Any] | None, times: bool = True) -> str:
    """'2.45 (68 / 0.250)': USD per million output tokens (TTFT p99 / TPOT p99), or why not."""
    if block is None or block.get("per_million_output_usd") is None:
        status = (block or {}).get("status", "-")
        return "not built" if status == "not built" else status
    usd = f"{block['per_million_output_usd']:,.2f}"
    if not times or block.get("ttft_p99_s") is None:
        return usd
    return f"{usd} ({block['ttft_p99_s']:,.1f} / {block['tpot_p99_s']:.3f})"


def _generate_rows() -> list[str]:
    rows = []
    for name in _GENERATE:
        for model in _load(name)["models"]:
            api = model["managed_api"]
            managed = (
                f"{api['per_million_output_usd']:.2f}, {api['provider']}"
                if api.get("list_price")
                else "none listed"
            )
            for run in model["runs"]:
                modal = {g["gpu"]: g for g in run["gpu_serverless"] if g.get("fits")}
                workers = run["worker_cpu"]
                shape = (
                    f" [{workers['workers']} x {workers['slots']} slots]"
                    if workers.get("slots")
                    else ""
                )
                gpu = run["gpu"]
                cells = [
                    model["label"],
                    _rate(run["rate_per_s"]),
                    _usd(run["lambda"]),
                    _usd(workers) + shape,
                    _usd(run["worker_gpu"]),
                    f"{gpu['per_million_output_usd']:,.2f} "
                    f"({gpu['gpus']} {gpu['gpu_type'].upper()})",
                    _usd(modal.get("l4")),
                    _usd(modal.get("l40s")),
                    managed,
                ]
                rows.append("| " + " | ".join(cells) + " |")
    return rows


def generate() -> str:
    """`bench generate`: per model and rate, USD per million output tokens (TTFT p99 / TPOT
    p99, seconds) of each way to serve it; every number predicted (simulated or modelled)."""
    lines = [
        "| model | rate | Lambda, a driver per request | Lambda workers (CPU) | workers on "
        "GPU-backed Lambda | EC2 GPUs | Modal L4 | Modal L40S | managed API |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + _generate_rows()) + "\n"


def generate_summary() -> str:
    """`bench generate` in one row per model (README): USD per million output tokens at
    1/min, 1/s and 10/s of each way to serve it."""

    def three(cells: list[str]) -> str:
        return " / ".join(cells)

    lines = [
        "| model (USD / M output tokens at 1/min / 1/s / 10/s) | Lambda, per request | Lambda "
        "workers | EC2 GPUs | Modal (cheaper GPU) | managed API |",
        "|---|---|---|---|---|---|",
    ]
    for name in _GENERATE:
        for model in _load(name)["models"]:
            runs = model["runs"]
            api = model["managed_api"]
            modal = [
                min(
                    (g["per_million_output_usd"] for g in r["gpu_serverless"] if g.get("fits")),
                    default=None,
                )
                for r in runs
            ]
            cells = [
                model["label"],
                three([_usd(r["lambda"], False) for r in runs]),
                three([_usd(r["worker_cpu"], False) for r in runs]),
                three([f"{r['gpu']['per_million_output_usd']:,.2f}" for r in runs]),
                three(["-" if m is None else f"{m:,.2f}" for m in modal]),
                f"{api['per_million_output_usd']:.2f}, {api['provider']}"
                if api.get("list_price")
                else "none listed",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def shapes() -> str:
    """`bench shapes`: per model every shape's cheapest plan of one batch (bold: the cheapest
    batch) and that plan over a day at one request a minute ("cheapest": the cheapest stream)."""
    report = _load("bench-shapes.json")
    lines = [
        "| model | shape | USD per batch | USD per M tokens | latency | smallest SLO "
        "| a day at 1/min: USD per M tokens, p99 |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for model in report["models"]:
        feasible = [s for s in model["shapes"] if s["feasible"]]
        batch = min(feasible, key=lambda s: s["bill_usd"])["deployment"]
        stream = min(
            (s for s in feasible if s["stream"]),
            key=lambda s: s["stream"]["per_million_tokens_usd"],
        )["deployment"]
        first = f"{model['label']}, {model['params'] / 1e9:.3g} B"
        for row, s in enumerate(model["shapes"]):
            name = s["deployment"]
            cells = [first if row == 0 else "", f"**{name}**" if name == batch else name]
            if not s["feasible"]:
                cells += ["", "", "", "", f"infeasible: {s['reason'].split(' (')[0]}"]
            else:
                day = s["stream"]
                cells += [
                    f"{s['bill_usd']:.6f}",
                    f"{s['per_million_tokens_usd']:.3f}",
                    f"{s['latency_s']:.1f} s",
                    f"{s['smallest_slo_s']:.1f} s",
                    f"{day['per_million_tokens_usd']:.3f}, {day['p99_s']:.1f} s"
                    + (" (cheapest)" if name == stream else ""),
                ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def shapes_summary() -> str:
    """`bench shapes` in one row per model: each shape's USD per million tokens for the batch
    and for the day (bold: the cheapest batch) and the smallest SLO of the driver and the
    workflow (README.md)."""
    report = _load("bench-shapes.json")
    lines = [
        "| model | monolithic: batch, day | driver: batch, day | workflow: batch, day "
        "| smallest SLO (driver, workflow) |",
        "|---|---|---|---|---|",
    ]
    for model in report["models"]:
        shapes = {s["deployment"]: s for s in model["shapes"]}
        feasible = [s for s in model["shapes"] if s["feasible"]]
        batch = min(feasible, key=lambda s: s["bill_usd"])["deployment"]
        params = model["params"]
        size = f"{params / 1e6:.3g} M" if params < 1e9 else f"{params / 1e9:.3g} B"
        cells = [f"{model['label']}, {size}"]
        for name in ("monolithic", "driver", "workflow"):
            s = shapes[name]
            if not s["feasible"]:
                cells.append(s["reason"].split(" >")[0])
                continue
            usd = f"{s['per_million_tokens_usd']:.3f}"
            cells.append(
                f"{f'**{usd}**' if name == batch else usd}, "
                f"{s['stream']['per_million_tokens_usd']:.3f}"
            )
        cells.append(
            f"{shapes['driver']['smallest_slo_s']:.1f} s, "
            f"{shapes['workflow']['smallest_slo_s']:.1f} s"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "gpu-lambda": gpu_lambda,
    "precision": precision,
    "stream": stream,
    "generate": generate,
    "generate-summary": generate_summary,
    "shapes": shapes,
    "shapes-summary": shapes_summary,
    "quality-minilm": quality_minilm,
    "quality-minilm-summary": quality_minilm_summary,
    "quality-user-text": quality_user_text,
}


def pages() -> list[Path]:
    return sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})


def stale(write: bool = False) -> list[str]:
    """'page: block' of every block that differs from its rendering (rewritten if `write`),
    or that names no renderer."""
    found = []
    for page in pages():
        text = page.read_text()

        def render(match: re.Match[str], page: Path = page) -> str:
            name = match.group(2)
            renderer = RENDERERS.get(name)
            if renderer is None:
                found.append(f"{page.relative_to(ROOT)}: {name} (no renderer)")
                return match.group(0)
            fresh = renderer()
            if fresh != match.group(3):
                found.append(f"{page.relative_to(ROOT)}: {name}")
            return match.group(1) + fresh + match.group(4)

        new = BLOCK.sub(render, text)
        if write and new != text:
            page.write_text(new)
    return found


def main(argv: list[str]) -> int:
    write = "--write" in argv
    blocks = stale(write=write)
    for block in blocks:
        print(("rewrote " if write else "stale: ") + block)
    return 0 if write or not blocks else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
