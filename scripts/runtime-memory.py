"""Measure the resident memory a function holds beside its weights and tokens: the calibration's
`runtime_overhead_mb` (an expert function), `driver_runtime_mb` (a driver or monolithic
function) and `driver_activation_states` (a driver's tensors per token).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/runtime-memory.py ENTRY [--dry-run]

Each measurement runs in a fresh interpreter, one torch thread:

- runtime_overhead_mb: the peak resident set after importing the expert handler
  (`functions.expert`: numpy, torch, boto3) and one forward pass of an expert of the reference
  shape (hidden 384, width 384, as `moelambda calibrate` times) over 1,024 tokens, its weights
  excluded; the value is that rounded up by 25% (the runtime interface client, fragmentation).
- driver_runtime_mb: the resident set after importing the driver handler (`functions.driver`,
  which also imports transformers' modeling_utils) and running the MoEfied MiniLM (8 experts,
  6 per token, correction) stage by stage over one window of 128 tokens, its weights excluded;
  the value is that rounded up by 20%.
- driver_activation_states: the same model run stage by stage over 10,240 tokens in windows of
  128: the peak resident set's rise above the built stages, per token, in hidden states of
  float32 (4 x hidden bytes), less the 2 x top_k routed rows `ground.driver.activation_bytes`
  adds apart; the value is that rounded up.

The first run converts MiniLM once (cached under ~/.cache/moelambda, not measured). Lambda's
container image is not this machine: re-measure inside it where one can be run. `--dry-run`
names what would be measured and exits without importing torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = WIDTH = 384  # the reference expert's shape (calibration: expert_compute_reference)
EXPERT_TOKENS = 1024
DRIVER_OPTIONS = {"experts": 8, "top_k": 6, "correction": True}
WINDOW, TOKENS = 128, 10240
MARGIN = {"runtime_overhead_mb": 1.25, "driver_runtime_mb": 1.2}

ENTRIES = {
    "runtime_overhead_mb": "peak RSS after importing functions.expert (numpy, torch, boto3) and "
    f"one expert forward pass (hidden {HIDDEN}, width {WIDTH}, {EXPERT_TOKENS} tokens), weights "
    "excluded, plus 25%",
    "driver_runtime_mb": "RSS after importing functions.driver (torch, numpy, boto3, "
    "transformers' modeling_utils) and running MiniLM (8 experts, 6 per token, correction) "
    f"stage by stage over one window of {WINDOW} tokens, weights excluded, plus 20%",
    "driver_activation_states": f"peak RSS rise of MiniLM (8 experts, 6 per token, correction) "
    f"run stage by stage over {TOKENS:,} tokens in windows of {WINDOW}, per token in float32 "
    "hidden states, less 2 x top_k routed rows",
}


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _model():  # type: ignore[no-untyped-def]
    from moe import MoefyOptions, load_model
    from moe._options import parse_top_k

    experts, top_k = DRIVER_OPTIONS["experts"], DRIVER_OPTIONS["top_k"]
    options = MoefyOptions(
        experts=experts,
        top_k=parse_top_k(str(top_k), experts),
        correction=bool(DRIVER_OPTIONS["correction"]),
        seed=0,
    )
    return load_model("minilm", options=options)


def _weights_mb(model) -> float:  # type: ignore[no-untyped-def]
    modules = [model.head, model.tail, *model.blocks, *model.routers, *model.banks]
    modules += [*model.combines, *(s for s in model.shared if s is not None)]
    seen: set[int] = set()
    total = 0
    for module in modules:
        if not hasattr(module, "parameters"):
            continue
        for t in [*module.parameters(), *module.buffers()]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total / 2**20


def _run_windows(model, tokens: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    from moe import run_stages

    generator = torch.Generator().manual_seed(0)
    vocab = int(model.family.config.vocab_size)
    ids = torch.randint(1000, vocab, (tokens // WINDOW, WINDOW), generator=generator)
    with torch.inference_mode():
        run_stages(model.stages(), model.num_layers, ids, model.expert_call())


def _child(entry: str) -> dict[str, float]:
    """The measurement itself, in this (fresh) interpreter."""
    if entry == "runtime_overhead_mb":
        import torch

        import functions.expert  # noqa: F401  (what an expert function imports)
        from moe import ExpertStage

        torch.set_num_threads(1)
        imported = _peak_mb()
        g = torch.Generator().manual_seed(0)
        tensors = {
            "w_in": torch.randn(WIDTH, HIDDEN, generator=g),
            "b_in": torch.randn(WIDTH, generator=g),
            "w_out": torch.randn(HIDDEN, WIDTH, generator=g),
            "b_out": torch.randn(HIDDEN, generator=g),
        }
        weights = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
        ExpertStage(tensors, "mlp", "gelu").run(torch.randn(EXPERT_TOKENS, HIDDEN, generator=g))
        return {"imported_mb": imported, "measured_mb": _peak_mb() - weights}
    import torch

    import functions.driver  # noqa: F401  (what a driver function imports)

    torch.set_num_threads(1)
    imported = _rss_mb()
    model = _model()
    if entry == "driver_runtime_mb":
        _run_windows(model, WINDOW)
        return {"imported_mb": imported, "measured_mb": _rss_mb() - _weights_mb(model)}
    import gc
    import threading

    _run_windows(model, WINDOW)  # warm: the first call's one-off allocations are not per token
    gc.collect()
    base = _rss_mb()
    peak, done = [base], threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _run_windows(model, TOKENS)
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _rss_mb())
    token_bytes = 4 * model.hidden_size
    states = (peak[0] - base) * 2**20 / (TOKENS * token_bytes) - 2 * model.top_k
    return {"built_mb": base, "peak_mb": peak[0], "states": states}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", choices=sorted(ENTRIES), help="the calibration entry")
    parser.add_argument("--dry-run", action="store_true", help="say what, measure nothing")
    parser.add_argument("--child", choices=("prepare", "measure"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        print(f"{args.entry}: would measure {ENTRIES[args.entry]} (dry run: nothing measured)")
        return
    sys.path.insert(0, str(ROOT))
    if args.child == "prepare":
        _model()
        return
    if args.child == "measure":
        print(json.dumps(_child(args.entry)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__)), args.entry, "--child"]
    if args.entry != "runtime_overhead_mb":  # convert the model once, outside the measurement
        subprocess.run([*command, "prepare"], check=True, cwd=ROOT, env=env)
    out = subprocess.run(
        [*command, "measure"], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if args.entry == "driver_activation_states":
        value = math.ceil(result["states"])
        print(
            f"driver_activation_states: {result['states']:.2f} hidden states per token beyond "
            f"2 x top_k routed rows (built stages {result['built_mb']:.0f} MB, peak "
            f"{result['peak_mb']:.0f} MB over {TOKENS:,} tokens in windows of {WINDOW}); "
            f"value {value}"
        )
        return
    value = math.ceil(result["measured_mb"] * MARGIN[args.entry])
    print(
        f"{args.entry}: {result['imported_mb']:.0f} MB after the imports, "
        f"{result['measured_mb']:.0f} MB after a first forward pass (weights excluded); "
        f"value {value} MB (+{MARGIN[args.entry] - 1:.0%})"
    )


if __name__ == "__main__":
    main()
