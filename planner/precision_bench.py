"""`moelambda bench precision` and `calibrate --weights`: how fast each weight precision runs
on this machine, and what the planner takes from it.

Three measurements, each on one torch thread (a 1,769 MB Lambda function's one vCPU), with the
precisions interleaved round by round so the machine's drift (other tenants, clock) hits them
alike, and the median kept:

* the reference expert (`planner.compute.reference_expert`, MiniLM's) on a 1,024-token batch:
  the ratio of its seconds per token to float32's is the precision's `compute` speed, which
  scales U_j;
* MiniLM E8 k6 + correction on 32 windows of 128 tokens (a batch, as the workflow serves it):
  tokens per second;
* the SmolLM2 MoE (E8 k4 + correction) decoding 33 tokens for 1 and for 8 sequences: output
  tokens per second; at one sequence the ratio of its TPOT to float32's is the precision's
  `decode_floor` speed (a step of one row is bound by per-operation overhead and weight reads,
  the floor `decode_layer_floor_s` prices).

Bytes per token are the weight bytes a step reads over the tokens it serves: every layer and
tail stage, and each expert the step's tokens routed to (counted from the routing of the very
steps timed), never the embeddings (a lookup reads a row).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from ground.precision import FP32, PRECISIONS, Weights, parse_weights

__all__ = ["DECODE_MODEL", "bench_precision", "measure_speed", "predicted_tpot"]

Progress = Callable[[str], None]
DECODE_MODEL = ("smollm2", 8, "4")  # the decoder `scripts/decode-step.py` measures too
BATCH_MODEL = ("minilm", 8, "6")
NEW_TOKENS = 33
# Eight different prompts: a batch of one prompt repeated would route its rows alike.
PROMPTS = (
    "The capital of France is",
    "Serverless functions bill per",
    "A mixture of experts routes each token",
    "The river flows through the",
    "In 1905 Albert Einstein published",
    "The recipe calls for two cups of",
    "Photosynthesis converts light into",
    "The orchestra began to play",
)
# Other prompts for `calibrate --weights`: the speeds it writes are not fitted on the prompts
# `bench precision` then holds the planner's predicted TPOT to.
CALIBRATION_PROMPTS = (
    "Water boils at a temperature of",
    "The museum opened its doors in",
    "Machine learning models are trained",
    "She walked along the shore and",
    "The committee decided to postpone",
    "Mountains form when tectonic plates",
    "The library lends books and",
    "His first novel was published",
)
BATCH_WINDOWS, BATCH_WINDOW = 32, 128


def _options(name: str, experts: int, top_k: str) -> Any:
    from moe import MoefyOptions, parse_top_k

    return MoefyOptions(experts=experts, top_k=parse_top_k(top_k, experts), correction=True)


def _one_thread() -> Callable[[], None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(threads)


class _Hits:
    """Counts the distinct experts each decode step's rows route to, per layer (hooks on the
    gates: a decode step's gate sees exactly `rows` rows, the prefill more)."""

    def __init__(self, model: Any, rows: int) -> None:
        self.rows, self.experts, self.steps = rows, model.experts, 0
        self.hits = 0
        self.handles = [r.register_forward_hook(self._hook) for r in model.routers]
        self.layers = model.num_layers

    def _hook(self, _module: Any, _inputs: Any, output: Any) -> None:
        idx = output[0]
        if idx.shape[0] == self.rows:
            used = idx[idx < self.experts].unique()
            self.hits += int(used.numel())
            self.steps += 1

    def close(self) -> float:
        """Mean distinct experts per layer and step."""
        for handle in self.handles:
            handle.remove()
        return self.hits / max(self.steps, 1)


def _stage_bytes(model: Any) -> tuple[float, float]:
    """(bytes of every layer and tail stage, bytes of one expert) of `model` at its precision."""
    from moe import describe_model

    manifest = describe_model(model)
    stack = sum(s.bytes for s in manifest.stages if s.role in ("layer", "tail"))
    experts = [s.bytes for s in manifest.stages if s.role == "expert"]
    return float(stack), float(statistics.mean(experts))


def _decode(model: Any, prompts: list[list[int]], sequences: int) -> tuple[float, float]:
    """(TPOT, mean distinct experts per layer and step) of one generation of the first
    `sequences` prompts."""
    from moe import GenerationConfig

    hits = _Hits(model, sequences)
    try:
        out = model.generate(prompts[:sequences], GenerationConfig(max_new_tokens=NEW_TOKENS))
    finally:
        per_layer = hits.close()
    return float(out[0].tpot_s or 0.0), per_layer


def predicted_tpot(manifest: Any, calibration: Any, sequences: int) -> tuple[float, float]:
    """(TPOT, memory MB) the planner's decode model (`planner.generation.decode_step`) gives
    one function holding `manifest`'s model (every expert local, routing uniform: a step's
    local compute depends only on k) at the memory option with one vCPU, as the one torch
    thread measured here."""
    import numpy as np

    from planner.generation import decode_step, generation_instance

    share = np.full((manifest.num_layers, manifest.experts), manifest.top_k / manifest.experts)
    ginst = generation_instance(
        manifest, share, calibration, sequences=sequences, prompt_tokens=8, new_tokens=NEW_TOKENS
    )
    memory = np.asarray(ginst.prefill.memory_mb, float)
    one = int(np.argmin(np.abs(np.array([calibration.vcpus_at(m) for m in memory]) - 1.0)))
    local = np.ones((manifest.num_layers, manifest.experts), bool)
    tpot, _usd, _invokes = decode_step(ginst, one, local, one)
    return float(tpot), float(memory[one])


def _batch(model: Any, windows: Any) -> float:
    start = time.perf_counter()
    model.forward(windows)
    return windows.numel() / (time.perf_counter() - start)


@contextlib.contextmanager
def _kernel(name: str | None) -> Iterator[None]:
    """Run int8 on kernel `name` ("portable": the one CPUs without bfloat16 run) inside."""
    from moe._int8 import KERNEL_ENV

    before = os.environ.get(KERNEL_ENV)
    if name is not None:
        os.environ[KERNEL_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = before


def measure_speed(
    variants: list[tuple[str, Weights, str | None]],
    *,
    repeats: int = 5,
    prompts: tuple[str, ...] = PROMPTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every measurement of the module docstring for each (name, precision, int8 kernel or
    None for this CPU's) variant, `repeats` rounds."""
    import torch

    from ground.precision import ACTIVATION_DTYPE
    from moe import (
        ExpertStage,
        GenerationConfig,
        at_precision,
        load_corpus,
        load_model,
        make_windows,
    )
    from moe._int8 import int8_kernel
    from planner.compute import REFERENCE_MODEL

    say = progress or (lambda _msg: None)
    restore = _one_thread()
    try:
        say("loading MiniLM and the SmolLM2 MoE (MoEfied and cached on first use)")
        name, experts, top_k = BATCH_MODEL
        encoder = load_model(name, options=_options(name, experts, top_k), progress=say)
        name, experts, top_k = DECODE_MODEL
        decoder = load_model(name, options=_options(name, experts, top_k), progress=say)
        reference = load_model(REFERENCE_MODEL, experts=4, top_k=2, seed=0, progress=say)
        windows = torch.from_numpy(
            make_windows(
                load_corpus("wiki"),
                encoder.tokenizer,
                tokens=BATCH_WINDOWS * BATCH_WINDOW,
                window=BATCH_WINDOW,
                seed=0,
            )
        )
        prompt_ids = [decoder.tokenizer(text)["input_ids"] for text in prompts]
        x = torch.randn(1024, reference.hidden_size, generator=torch.Generator().manual_seed(0))
        models = {}
        for key, weights, kernel in variants:
            enc, dec = at_precision(encoder, weights), at_precision(decoder, weights)
            bank = at_precision(reference, weights).banks[0]
            stage = ExpertStage(bank.expert_tensors(0), bank.kind, bank.act)
            # the expert's input as the stack before it hands it on
            rows = x.to(getattr(torch, ACTIVATION_DTYPE[weights.stack]))
            models[key] = (enc, dec, stage, rows, kernel)
            with _kernel(kernel):
                dec.generate(prompt_ids[:1], GenerationConfig(max_new_tokens=4))  # allocate first
                enc.forward(windows[:2])
        samples: dict[str, dict[str, list[float]]] = {
            key: {
                "expert_s": [],
                "batch_tps": [],
                "tpot_1": [],
                "tpot_8": [],
                "hits_1": [],
                "hits_8": [],
            }
            for key in models
        }
        for round_ in range(repeats):
            for key, (enc, dec, expert, rows, kernel) in models.items():
                say(f"round {round_ + 1}/{repeats}: {key}")
                with _kernel(kernel):
                    start = time.perf_counter()
                    for _ in range(5):
                        expert.run(rows)
                    samples[key]["expert_s"].append((time.perf_counter() - start) / 5 / 1024)
                    samples[key]["batch_tps"].append(_batch(enc, windows))
                    for b in (1, 8):
                        tpot, hits = _decode(dec, prompt_ids, b)
                        samples[key][f"tpot_{b}"].append(tpot)
                        samples[key][f"hits_{b}"].append(hits)
        from moe import describe_model
        from planner.calibration import load_calibration

        calibration = load_calibration(None)
        rows = {}
        for key, (enc, dec, _expert, _rows, kernel) in models.items():
            got = {k: statistics.median(v) for k, v in samples[key].items()}
            stack, expert_bytes = _stage_bytes(dec)
            enc_stack, enc_expert = _stage_bytes(enc)  # a batch's tokens reach every expert
            enc_bytes = enc_stack + enc_expert * enc.experts * enc.num_layers
            rows[key] = {
                "weights": dict((k, w.label()) for k, w, _ in variants)[key],
                "int8_kernel": kernel or int8_kernel(),
                "expert_s_per_token": got["expert_s"],
                "minilm_tokens_per_s": got["batch_tps"],
                "minilm_bytes_per_token": enc_bytes / windows.numel(),
                "decode": {
                    str(b): {
                        "tpot_s": got[f"tpot_{b}"],
                        # the planner's, at this CPU's kernel (the portable one is not priced)
                        "predicted_tpot_s": None
                        if kernel
                        else predicted_tpot(describe_model(dec), calibration, b)[0],
                        "tokens_per_s": b / got[f"tpot_{b}"],
                        "experts_per_layer_step": got[f"hits_{b}"],
                        "bytes_per_token": (
                            stack + got[f"hits_{b}"] * dec.num_layers * expert_bytes
                        )
                        / b,
                    }
                    for b in (1, 8)
                },
                "tpot_1_samples_s": samples[key]["tpot_1"],
            }
    finally:
        restore()
    return {"repeats": repeats, "threads": 1, "rows": rows}


def bench_precision(
    weights: list[str] | None = None,
    *,
    repeats: int = 5,
    prompts: tuple[str, ...] = PROMPTS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The report `moelambda bench precision --json` prints: each precision's speeds and bytes,
    and its speed against float32's."""
    from moe import cpu_bf16
    from moe._int8 import int8_kernel

    asked = [parse_weights(w) for w in (weights or list(PRECISIONS))]
    if cpu_bf16() is None:  # bf16 is refused here (`moe.check_precision`)
        asked = [p for p in asked if "bf16" not in (p.stack, p.experts)]
    precisions = [FP32, *[p for p in asked if not p.is_fp32]]
    variants: list[tuple[str, Weights, str | None]] = [(p.label(), p, None) for p in precisions]
    if int8_kernel() == "bf16" and any("int8" in (p.stack, p.experts) for p in precisions):
        # and the kernel a CPU without bfloat16 (Lambda's: `lambda_cpu_bf16`) runs int8 on
        int8 = next(p for p in precisions if "int8" in (p.stack, p.experts))
        variants.append((f"{int8.label()} portable", int8, "portable"))
    report = measure_speed(variants, repeats=repeats, prompts=prompts, progress=progress)
    base = report["rows"]["fp32"]
    for row in report["rows"].values():
        row["speed_vs_fp32"] = {
            "compute": row["expert_s_per_token"] / base["expert_s_per_token"],
            "decode_floor": row["decode"]["1"]["tpot_s"] / base["decode"]["1"]["tpot_s"],
            "decode_1_speedup": base["decode"]["1"]["tpot_s"] / row["decode"]["1"]["tpot_s"],
            "decode_8_speedup": base["decode"]["8"]["tpot_s"] / row["decode"]["8"]["tpot_s"],
            "minilm_speedup": row["minilm_tokens_per_s"] / base["minilm_tokens_per_s"],
        }
    return report
