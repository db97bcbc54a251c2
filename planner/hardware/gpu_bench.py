"""`moelambda bench gpu-lambda`: CPU-only, GPU-only and GPU+CPU Lambda plans of real-scale MoE
shapes on the Azure conversation trace, beside a managed API's list price.

For each model shape (Zipf(1) popularity, labelled synthetic) and each rate, the Azure
conversation trace's arrivals scaled to that mean rate (`planner.traffic.bench.scale_for`) over
the period of `RATES`, every request a prompt of `PROMPT_TOKENS` tokens,
`planner.hardware.gpu_candidates` plans the cheapest deployment meeting a p99 latency of `SLO_S`
on each hardware, preferring a plan the handlers deploy (`HardwarePlan.detail["deployable"]`:
a GPU function holding the model, a GPU driver with CPU experts; GPU expert groups and layer
stages have no handler). Each shape is planned at its published precision (bf16 for these:
`ModelShape.published_weights`), hidden states crossing functions at bf16 too. `cheapest` is
the cheapest that deploys on a kind whose handlers run and compute that precision
(`planner.hardware.why_not`, each row's `not_runnable`: CPU Lambda is not known to compute
bf16, the calibration's `lambda_cpu_bf16`), `cheapest_priced` the cheapest of all, as
priced. Each row gives the plan's bill per million prompt tokens next to the managed API's list
price per million input tokens (`planner.generation.managed_api_quote`; "no list price" where
the calibration has none). Every GPU timing in it is predicted by the GPU backend's model, not
measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MODELS", "PROMPT_TOKENS", "RATES", "SLO_S", "bench_gpu_lambda"]

MODELS = ("mixtral", "olmoe")
PROMPT_TOKENS = 1000
SLO_S = 30.0
# (requests per second, hours simulated): a day at one a minute, an hour at one and at ten a
# second (the trace's pattern scaled to that mean: 1,239, 3,110 and 36,698 requests).
RATES = ((1 / 60, 24.0), (1.0, 1.0), (10.0, 1.0))


def bench_gpu_lambda(
    models: Sequence[str] = MODELS,
    *,
    rates: Sequence[tuple[float, float]] = RATES,
    slo_s: float = SLO_S,
    prompt_tokens: int = PROMPT_TOKENS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The JSON of `moelambda bench gpu-lambda` (see the module docstring)."""
    from planner import load_calibration
    from planner.api import shape_counts_for_plan
    from planner.generation import managed_api_quote
    from planner.hardware import why_not
    from planner.hardware.catalogue import load_catalogue
    from planner.hardware.gpu_candidates import HARDWARE, cpu_plan, plan_hardware
    from planner.hardware.gpu_model import Stream
    from planner.traffic import load_arrivals
    from planner.traffic.bench import scale_for

    say = progress or (lambda _: None)
    started = time.perf_counter()
    calibration = load_calibration(None)
    catalogue = load_catalogue()
    rows = []
    for name in models:
        counts = shape_counts_for_plan(name, "zipf:1.0", tokens=prompt_tokens)
        manifest = counts.manifest
        assert manifest is not None
        say(f"{name}: the CPU plan")
        cpu = cpu_plan(manifest, counts, calibration, slo_s=slo_s, prompt_tokens=prompt_tokens)
        blocked = {h: why_not(h, manifest.precision, calibration) for h in HARDWARE}
        runs = []
        for rate, hours in rates:
            arrivals = load_arrivals("azure-conv", scale=scale_for(rate), hours=hours)
            stream = Stream(
                arrivals.times_s,
                arrivals.period_s,
                prompt_tokens,
                {"spec": "azure-conv", "rate_per_s": rate, "hours": hours},
            )
            plans = plan_hardware(
                manifest,
                counts,
                calibration,
                catalogue,
                stream,
                slo_s=slo_s,
                cpu=cpu,
                progress=say,
            )
            described = {h: plans[h].describe() | {"not_runnable": blocked[h]} for h in HARDWARE}
            feasible = {h: d["bill_usd"] for h, d in described.items() if d["feasible"]}
            can_run = {
                h: usd
                for h, usd in feasible.items()
                if blocked[h] is None and described[h].get("deployable")
            }
            runs.append(
                {
                    "rate_per_s": rate,
                    "hours": hours,
                    "requests": int(stream.arrivals_s.size),
                    "plans": described,
                    "cheapest": min(can_run, key=can_run.__getitem__) if can_run else None,
                    "cheapest_priced": min(feasible, key=feasible.__getitem__)
                    if feasible
                    else None,
                }
            )
        rows.append(
            {
                "model": name,
                "label": manifest.model,
                "weights": manifest.precision.label(),
                "counts": counts.source,
                "managed_api": managed_api_quote(calibration, manifest.model),
                "runs": runs,
            }
        )
    return {
        "trace": "azure-conv",
        "prompt_tokens": prompt_tokens,
        "slo_p99_s": slo_s,
        "predicted": "GPU timings predicted by the GPU backend's model, not measured",
        "models": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }
