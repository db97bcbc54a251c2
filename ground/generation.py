"""Generation semantics: what a driver does after the prompt, what it waits for, is billed for
and requests. The planner (`planner.generation`), the driver's decode loop and its meter read
these rules; numbers (the Invoke round trip, prices) live in the calibration file.

A decoder generates inside one driver invocation (`ground.driver`: a driver with local and
remote experts, or one function holding every expert). For a batch of B sequences of P prompt
tokens each, generating G new tokens each:

    prefill: one pass over the B x P prompt tokens, exactly the driver request of
      `ground.driver` (per layer: layer stage, local experts, remote experts invoked with
      their routed rows, replicas and S3 overflow as there); the tail's logits at each
      sequence's last position give its first new token. The driver keeps every layer's keys
      and values of every sequence (the KV cache) in its memory.
    decode step (G - 1 of them, one per further token): ONE token per sequence through every
      layer. Per layer the driver computes the layer stage for the B rows, runs the local
      experts those rows picked, and invokes each remote expert picked by at least one row
      exactly once (synchronous Invoke, the rows inline: a step's rows are few), all of the
      layer's calls at once; it waits for all of them, then goes to the next layer. After the
      last layer, the tail (final norm, LM head) for the B rows, then sampling.

So a decode step makes one Invoke per (layer, remote expert hit) and no S3 request;
`decode_invokes` counts them from the routing a run observed, and `expected_remote_hits` is what
the planner expects from the per-token routing shares q_{l,e} (the probability that a token's
top-k contains expert e of layer l: predicted tokens of the expert over all tokens). With the B
sequences routed independently, expert e is hit by at least one of them with probability
1 - (1 - q_{l,e})^B, and when it is hit it receives B q_{l,e} / (1 - (1 - q_{l,e})^B) rows on
average (`rows_per_hit`).

Latency:
    TTFT (time to first token) = the prefill's latency: the warm driver's start, reading the
      token ids, the pass over the prompts, the tail; what `planner.driver.evaluate_driver`
      models for B x P tokens.
    TPOT (time per output token) = one decode step's latency: per layer the layer stage on B
      rows, then the slower of the local experts (one after another) and the slowest remote
      call (the Invoke round trip plus the expert's compute on its rows); plus the tail.
    A sequence's whole generation takes TTFT + (G - 1) TPOT, and the driver's invocation as
      long: it must fit Lambda's timeout (and Express's duration, when the one-state workflow
      that starts it is Express).

Billing: the driver is billed for its whole invocation, memory x (TTFT + (G - 1) TPOT): it is
billed while it waits on its remote experts, in the prefill and in every decode step. A remote
expert is billed from its start to its return for each call (its warm start and the compute of
its rows, not the caller's round trip) and one Lambda request per call. Nothing here imports
torch, boto3 or CDK.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "decode_invokes",
    "decode_steps",
    "expected_remote_hits",
    "hit_probability",
    "rows_per_hit",
]


def decode_steps(new_tokens: int) -> int:
    """Decode steps that produce `new_tokens` tokens per sequence: the prefill yields the first.

    Raises:
        ValueError: `new_tokens` < 1.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    return new_tokens - 1


def decode_invokes(counts: np.ndarray, local: np.ndarray) -> int:
    """Invoke requests of the decode steps: one per (step, layer, expert) that some row picked
    and that the driver does not run itself.

    Args:
        counts: (steps, L, E) rows routed to each expert at each decode step and layer.
        local: (L, E) True where the driver runs the expert in process.
    """
    counts = np.asarray(counts)
    remote = ~np.asarray(local, dtype=bool)
    if counts.ndim != 3 or counts.shape[1:] != remote.shape:
        raise ValueError(
            f"counts {counts.shape} must be (steps, L, E) with (L, E) = {remote.shape}"
        )
    return int(np.count_nonzero((counts > 0) & remote[None]))


def hit_probability(share: np.ndarray, sequences: int) -> np.ndarray:
    """(L, E) the probability that at least one of `sequences` tokens picks each expert, for a
    token picking it with probability `share` (q), sequences routed independently."""
    q = np.clip(np.asarray(share, dtype=float), 0.0, 1.0)
    return 1.0 - (1.0 - q) ** sequences


def rows_per_hit(share: np.ndarray, sequences: int) -> np.ndarray:
    """(L, E) the rows an expert receives in a step where it is hit, on average: B q over the
    probability of a hit (at least 1; 0 for an expert no token picks)."""
    q = np.asarray(share, dtype=float)
    hit = hit_probability(q, sequences)
    return np.divide(sequences * q, hit, out=np.zeros_like(hit), where=hit > 0)


def expected_remote_hits(share: np.ndarray, local: np.ndarray, sequences: int) -> np.ndarray:
    """(L,) the expected number of distinct remote experts a decode step invokes per layer:
    the hit probability summed over the experts the driver does not run itself."""
    remote = ~np.asarray(local, dtype=bool)
    return np.where(remote, hit_probability(share, sequences), 0.0).sum(axis=-1)
