"""A decoder on GPUs: time to first token, time per output token and dollars per token.

The GPU backend's per-token model, which `moelambda compare` and `bench generate` set beside a
Lambda deployment's (`planner.generation`). A deployment is n GPUs of one catalogue type holding
the model in bf16 (`gpu.compare`: non-MoE weights on every GPU, expert e on GPU e mod n), run as
GPU serving engines run a decoder (continuous batching: every sequence in flight on a copy
advances one token per step). For requests of P prompt tokens generating G tokens each:

* prefill (TTFT): the batch model of `gpu.compare.gpu_options` on the P tokens (compute at the
  catalogue's `mfu`, all-to-alls in Aurora's rounds).
* a decode step of B sequences on one copy (TPOT): per layer, the GPUs split the B rows; each
  reads its layer's non-MoE weights once and computes its rows; each expert picked by some row
  (probability 1 - (1 - q)^B, `ground.generation.hit_probability`) has its weights read once
  and computes its B q rows; a phase takes the slower of reading at the memory bandwidth
  (`memory_gbps`) and computing at `mfu`, plus `kernel_s`; the GPU with the most expert work
  sets the expert phase; the rows' two all-to-alls cross the network; then the tail (LM head).
* at R requests/s on c copies, a copy gets r = R / c. Its prefills take the share
  rho_p = r TTFT of its time, which must stay within the catalogue's `max_utilisation`, and
  pause its decode steps: TPOT = step(B) / (1 - rho_p). It holds B = max(1, r (TTFT + (G - 1)
  TPOT)) sequences (Little's law, solved by fixed-point iteration; no fixed point: the copy
  cannot keep up). The deployment is the least c meeting that and the SLOs; the type and n of
  the cheapest hour are kept.
* the bill, c n price per hour whether busy or not, is split between input and output tokens as
  the busy time is, prefills (rho_p) against decode steps (rho_d = r (G - 1) step(B) / B): per
  million output tokens, the decode share of an hour over the R G 3,600 tokens generated in it.

The KV cache bounds B: the B (P + G) tokens' keys and values (bf16) must fit in what the
weights leave of the copy's GPUs (`gpu.compare.free_bytes`, the fullest GPU's times n, as the
copy's sequences are spread over its GPUs); more sequences need more copies. Left out, as
Lambda's model leaves them out: the attention's reads of the KV cache in a step; and queueing
for a prefill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpu.compare import free_bytes, gpu_options
from gpu.estimate import ModelWork
from ground.errors import UsageError
from ground.generation import hit_probability

if TYPE_CHECKING:
    from gpu.cluster import Catalogue, GpuType
    from ground.manifest import Manifest

__all__ = ["GpuGeneration", "decode_step_s", "gpu_generation", "prefill_s"]

_BF16 = 2  # bytes per weight on GPUs (gpu.compare holds the weights in bf16)
_ITERATIONS = 200  # fixed-point steps for the batch in flight
_MAX_BATCH = 65_536.0  # sequences in flight past which a copy is taken not to keep up
_MAX_COPIES = 10_000


@dataclass(frozen=True)
class GpuGeneration:
    """The cheapest GPU deployment generating at a rate within the SLOs (`gpu_generation`)."""

    gpu_type: str
    gpus: int  # per copy
    copies: int
    batch: float  # sequences in flight on a copy
    ttft_s: float
    tpot_s: float
    utilisation: float  # a copy's busy share: prefills and decode steps
    usd_per_hour: float  # every copy
    per_million_input_usd: float
    per_million_output_usd: float
    source: str  # the catalogue's source of the type's price and speeds

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


def decode_step_s(
    work: ModelWork,
    share: np.ndarray,
    kind: GpuType,
    gpus: int,
    batch: float,
    catalogue: Catalogue,
) -> float:
    """Seconds of one decode step of `batch` sequences on a copy of `gpus` GPUs of `kind`
    (module docstring); `share` (L, E) is a token's probability of picking each expert."""
    assert kind.memory_gbps is not None
    read = kind.memory_gbps * 1e9
    compute = kind.flops(catalogue.mfu)
    kernel = catalogue.kernel_s
    rows = max(batch / gpus, 1.0)  # sequences on the busiest GPU
    nonmoe = np.maximum(work.nonmoe_flops / 2 * _BF16 / read, rows * work.nonmoe_flops / compute)
    hit = hit_probability(share, max(batch, 1.0))
    expert = (
        np.maximum(
            hit * work.expert_flops / 2 * _BF16 / read, batch * share * work.expert_flops / compute
        )
        + hit * kernel
    )
    per_gpu = np.stack([expert[:, g::gpus].sum(axis=1) for g in range(gpus)], axis=1)
    a2a = 0.0 if gpus == 1 else 2 * rows * work.top_k * work.token_bytes / kind.bandwidth
    layers = nonmoe + per_gpu.max(axis=1) + a2a + 2 * kernel
    tail = max(work.tail_flops / 2 * _BF16 / read, rows * work.tail_flops / compute) + kernel
    return float(layers.sum() + tail)


def _in_flight(
    step: Callable[[float], float], rate: float, ttft: float, new_tokens: int
) -> float | None:
    """B = max(1, rate (TTFT + (G - 1) step(B) / (1 - rate TTFT))) by fixed-point iteration
    from 1 (B only grows, step being increasing); None when it has none (the copy cannot keep
    up) or rate TTFT >= 1."""
    free = 1.0 - rate * ttft
    if free <= 0:
        return None
    batch = 1.0
    for _ in range(_ITERATIONS):
        nxt = max(1.0, rate * (ttft + (new_tokens - 1) * step(batch) / free))
        if nxt > _MAX_BATCH:
            return None
        if abs(nxt - batch) <= 1e-6 * batch:
            return nxt
        batch = nxt
    return None


def gpu_generation(
    share: np.ndarray,
    manifest: Manifest,
    catalogue: Catalogue,
    *,
    rps: float,
    prompt_tokens: int,
    new_tokens: int,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    kv_bytes_per_token: float | None = None,
) -> GpuGeneration:
    """The cheapest GPU deployment generating `new_tokens` per request for `prompt_tokens`
    prompts at `rps` requests per second, within the SLOs (module docstring).

    `kv_bytes_per_token` is one token's keys and values in bf16, every layer; None: 2 x layers
    x hidden x 2 bytes (exact for multi-head attention, an upper bound for grouped-query).

    Example::

        share = planning.counts / planning.tokens
        gpu = gpu_generation(share, manifest, load_catalogue(), rps=1.0, prompt_tokens=1020,
                             new_tokens=129)
        print(gpu.gpu_type, gpu.copies, gpu.per_million_output_usd)

    Raises:
        UsageError: A rate or length that is not positive, or no deployment of the catalogue
            holds the model and meets the SLOs.
    """
    if not rps > 0 or prompt_tokens < 1 or new_tokens < 1:
        raise UsageError(
            "the rate, prompt and generated tokens must be positive.",
            "pass e.g. --rps 1 --prompt-tokens 1020 --new-tokens 129.",
        )
    share = np.asarray(share, dtype=float)
    work = ModelWork.of(manifest)
    kv = kv_bytes_per_token or 2.0 * manifest.num_layers * manifest.hidden_size * _BF16
    u = catalogue.max_utilisation
    best: GpuGeneration | None = None
    for option in gpu_options(share * prompt_tokens, manifest, catalogue, order="bound"):
        kind = catalogue.types[option.gpu_type]
        ttft = option.latency_s
        if kind.memory_gbps is None or (slo_ttft_s is not None and ttft > slo_ttft_s):
            continue

        def step(batch: float, kind: GpuType = kind, gpus: int = option.gpus) -> float:
            return decode_step_s(work, share, kind, gpus, batch, catalogue)

        if slo_tpot_s is not None and step(1.0) > slo_tpot_s:
            continue
        room = option.gpus * free_bytes(manifest, option.gpus, kind.memory_gb)
        most = room / (kv * (prompt_tokens + new_tokens))  # sequences a copy can hold
        if most < 1:
            continue
        copies = max(1, math.ceil(rps * ttft / u))
        while copies <= _MAX_COPIES:
            rate = rps / copies
            batch = _in_flight(step, rate, ttft, new_tokens)
            if batch is not None and batch <= most:
                tpot = step(batch) / (1.0 - rate * ttft)
                if slo_tpot_s is None or tpot <= slo_tpot_s:
                    break
            copies += 1
        else:
            continue
        hourly = copies * option.usd_per_hour
        if best is not None and hourly >= best.usd_per_hour:
            continue
        busy_prefill, busy_decode = rate * ttft, rate * (new_tokens - 1) * step(batch) / batch
        decode = busy_decode / (busy_prefill + busy_decode)
        per_second = hourly / 3600
        best = GpuGeneration(
            gpu_type=option.gpu_type,
            gpus=option.gpus,
            copies=copies,
            batch=batch,
            ttft_s=ttft,
            tpot_s=tpot,
            utilisation=busy_prefill + busy_decode,
            usd_per_hour=hourly,
            per_million_input_usd=per_second * (1 - decode) / (rps * prompt_tokens) * 1e6,
            per_million_output_usd=per_second * decode / (rps * new_tokens) * 1e6,
            source=kind.source,
        )
    if best is None:
        raise UsageError(
            "no GPU deployment of the catalogue holds the model and meets the SLOs "
            f"(TTFT {slo_ttft_s}, TPOT {slo_tpot_s} s) at {rps:g} requests/s.",
            "pass larger --slo-ttft/--slo-tpot, or add a larger GPU type to the catalogue.",
        )
    return best


def prefill_s(
    share: np.ndarray,
    manifest: Manifest,
    catalogue: Catalogue,
    deployment: GpuGeneration,
    prompt_tokens: int,
) -> float:
    """The TTFT of one `prompt_tokens`-token prompt on a copy of `deployment` (the prefill
    model of `gpu_generation`), e.g. at a stream's longest prompts."""
    counts = np.asarray(share, dtype=float) * prompt_tokens
    for option in gpu_options(counts, manifest, catalogue, order="bound"):
        if (option.gpu_type, option.gpus) == (deployment.gpu_type, deployment.gpus):
            return option.latency_s
    raise ValueError(f"{deployment.gpus} x {deployment.gpu_type} is not an option")
