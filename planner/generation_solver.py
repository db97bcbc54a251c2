"""The exact solver of a generating driver or one-function plan (the model:
`planner.generation`).

The solver. A plan chooses d, per layer the number k of local experts (each layer's k most
popular, the ones that save the most remote calls per unit of memory), one memory j and one
replica count g for every remote expert. Every (d, k, j, g) is priced at once: each layer's
experts sorted by popularity, the remote aggregates over the least popular E - k experts are
suffix sums and maxima, so the grid is a few numpy arrays of shape (D, L, E + 1, J, G). The
plan of least whole bill (prefill plus decode: per output token, what a user pays, with B, P
and G fixed) among those meeting both SLOs and every limit is exact over that family;
`evaluate_generation` re-prices any choice one expert at a time, and the tests hold the grid
to it by enumeration.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ground.driver import layer_seconds, remote_call_s
from ground.errors import InfeasibleError, UsageError
from ground.generation import hit_probability, rows_per_hit
from ground.topology import TOPOLOGIES, topology
from planner.driver import remote_options
from planner.exact import SLO_RTOL
from planner.generation import (
    DEFAULT_NEW_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_SEQUENCES,
    GenerationChoice,
    GenerationInstance,
    GenerationSolution,
    evaluate_generation,
    generation_instance,
)
from planner.instance import MB

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.calibration import Calibration

__all__ = ["GenerationGrid", "plan_generation"]


def _suffix(values: np.ndarray, ufunc: np.ufunc, identity: float | bool) -> np.ndarray:
    """Along axis 1, index k: `ufunc` over positions k.. (E + 1 entries, the last `identity`)."""
    pad = np.full_like(values[:, :1], identity)
    return ufunc.accumulate(np.concatenate([values, pad], axis=1)[:, ::-1], axis=1)[:, ::-1]


def _prefix(values: np.ndarray) -> np.ndarray:
    """Along axis 1, index k: the sum of positions ..k-1 (E + 1 entries, the first 0)."""
    return np.concatenate([np.zeros_like(values[:, :1]), np.cumsum(values, axis=1)], axis=1)


@dataclass(frozen=True, eq=False)
class GenerationGrid:
    """Every (d, k, j, g) priced at once: arrays (D, E + 1, J, G), k local experts per layer."""

    ginst: GenerationInstance
    ttft: np.ndarray
    tpot: np.ndarray
    run: np.ndarray
    total: np.ndarray
    need_mb: np.ndarray  # (E + 1,) the driver's memory with k local experts per layer
    memory_ok: np.ndarray  # the driver holds its stages, local experts and the KV cache
    limits_ok: np.ndarray  # memory_ok, the remote experts' limits, rows inline

    @classmethod
    def make(cls, ginst: GenerationInstance) -> GenerationGrid:
        dinst, b, B = ginst.prefill, ginst.prefill.base, ginst.sequences
        L, E = ginst.layers, ginst.experts
        order, rows_l = ginst.order, np.arange(L)[:, None]
        opts = [remote_options(dinst, layer) for layer in range(L)]

        def ranked(name: str) -> np.ndarray:  # (L, E, J, G) in popularity order
            return np.stack([getattr(o, name) for o in opts])[rows_l, order]

        # prefill: the driver request (planner.driver) at every choice
        finish = _suffix(ranked("finish"), np.maximum, 0.0)  # (L, K, J, G)
        cost = _suffix(ranked("cost"), np.add, 0.0).sum(axis=0)  # (K, J, G)
        feasible = _suffix(ranked("feasible"), np.logical_and, True).all(axis=0)
        overflow = _suffix(ranked("overflow") > 0, np.logical_or, False).any(axis=0)
        tokens = _prefix(np.ceil(b.counts)[rows_l, order])  # (L, K) local tokens
        local_s = dinst.u_expert[:, None, None] * tokens[None]  # (D, L, K)
        layers = np.maximum(local_s[..., None, None], finish[None]).sum(axis=1)
        no_overflow = np.array([dinst.fixed_s(d, False) for d in range(dinst.memory_mb.size)])
        ttft = layers + no_overflow[:, None, None, None] + 2 * b.s3_delay_s * overflow[None]
        usd = np.where(overflow, dinst.fixed_usd(True), dinst.fixed_usd(False))
        rho = np.array([dinst.rho(d) for d in range(dinst.memory_mb.size)])
        prefill_usd = cost[None] + usd[None] + rho[:, None, None, None] * ttft
        # a decode step
        q = ginst.share[rows_l, order]  # (L, E)
        hit, rows = hit_probability(q, B), rows_per_hit(q, B)
        u_j, m_j = b.compute_s[None, None, :], b.memory_mb[None, None, :]
        width = b.token_bytes_in + b.token_bytes_out
        call = remote_call_s(
            ginst.round_trip_s, rows[..., None], width, b.invoke_bandwidth, rows[..., None] * u_j
        )
        call = np.where(q[..., None] > 0, call, 0.0)
        remote_s = _suffix(call, np.maximum, 0.0)  # (L, K, J)
        local_dec = dinst.u_expert[:, None, None] * B * _prefix(q)[None]  # (D, L, K)
        stage = B * dinst.u_layer[:, :, None, None]  # (D, L, 1, 1)
        step = layer_seconds(local_dec[..., None], remote_s[None]) + stage
        floor = L * ginst.layer_floor_s
        tpot = step.sum(axis=1) + B * dinst.u_tail[:, None, None] + floor  # (D, K, J)
        billed = hit[..., None] * b.warm_start_s + B * q[..., None] * (
            b.token_bytes_out / b.invoke_bandwidth + u_j
        )
        calls = np.where(
            q[..., None] > 0, hit[..., None] * b.request_usd + billed * m_j * b.price_mb_s, 0.0
        )
        step_usd = _suffix(calls, np.add, 0.0).sum(axis=0)[None] + rho[:, None, None] * tpot
        rows_fit = dinst.experts_mb[rows_l, order] + b.runtime_mb + B * width / MB
        decode_fit = _suffix(rows_fit[..., None] <= m_j, np.logical_and, True).all(axis=0)
        # the driver's memory and every limit
        k = np.arange(E + 1)
        acts = np.where(k == E, dinst.activations_local_mb, dinst.activations_mb)
        need = dinst.runtime_mb + dinst.nonmoe_mb + k * L * dinst.unit_mb + acts + ginst.kv_mb
        memory_ok = need[None, :] <= dinst.memory_mb[:, None] + 1e-9  # (D, K)
        inline = (k == E) | ginst.rows_inline()
        limits = feasible & decode_fit[..., None] & inline[:, None, None]
        run = ttft + ginst.steps * tpot[..., None]
        return cls(
            ginst=ginst,
            ttft=ttft,
            tpot=np.broadcast_to(tpot[..., None], ttft.shape),
            run=run,
            total=prefill_usd + ginst.steps * step_usd[..., None],
            need_mb=need,
            memory_ok=np.broadcast_to(memory_ok[:, :, None, None], ttft.shape),
            limits_ok=memory_ok[:, :, None, None] & limits[None],
        )

    def best(
        self,
        deployment: str,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
    ) -> GenerationSolution:
        """The cheapest `deployment` plan ("driver": some expert remote; "monolithic": none)
        meeting both SLOs and every limit.

        Raises:
            InfeasibleError: None does; the message names the binding constraint and, where
                latency binds, the smallest SLO that a plan meets.
        """
        started = time.perf_counter()
        ginst, E = self.ginst, self.ginst.experts
        k = np.arange(E + 1)
        everything_local = topology(deployment).expert_functions == "none"
        shape_k = k == E if everything_local else k < E
        allowed = shape_k[None, :, None, None]
        fits = self.limits_ok & allowed & (self.run <= ginst.prefill.base.max_timeout_s)
        ttft_ok = self.ttft <= (math.inf if slo_ttft_s is None else slo_ttft_s * (1 + SLO_RTOL))
        bound = math.inf if slo_tpot_s is None or not ginst.steps else slo_tpot_s * (1 + SLO_RTOL)
        tpot_ok = self.tpot <= bound  # one new token per sequence: no decode step to bound
        ok = fits & ttft_ok & tpot_ok
        if not ok.any():
            raise self._infeasible(deployment, allowed, fits, ttft_ok, slo_ttft_s, slo_tpot_s)
        flat = int(np.argmin(np.where(ok, self.total, np.inf)))
        d, local, j, g = (int(i) for i in np.unravel_index(flat, ok.shape))
        choice = GenerationChoice(d, local, j, g + 1)
        within = fits & ttft_ok
        return GenerationSolution(
            deployment=deployment,
            choice=choice,
            evaluation=evaluate_generation(ginst, choice, slo_ttft_s, slo_tpot_s),
            smallest_tpot_s=float(self.tpot[within].min()),
            slo_ttft_s=slo_ttft_s,
            slo_tpot_s=slo_tpot_s,
            seconds=time.perf_counter() - started,
        )

    def _infeasible(
        self,
        deployment: str,
        allowed: np.ndarray,
        fits: np.ndarray,
        ttft_ok: np.ndarray,
        slo_ttft_s: float | None,
        slo_tpot_s: float | None,
    ) -> InfeasibleError:
        ginst = self.ginst
        everything_local = topology(deployment).expert_functions == "none"
        what = "one function" if everything_local else "a driver"
        fewer = "plan fewer --batch-sequences, or shorter --prompt-tokens or --new-tokens"
        if not (self.memory_ok & allowed).any():
            largest = ginst.prefill.max_memory_mb
            need = float(self.need_mb[allowed[0, :, 0, 0]].min())
            if need - ginst.kv_mb > largest and everything_local:
                return InfeasibleError(
                    f"one function cannot hold the model: its weights and the prompts' "
                    f"activations take {need - ginst.kv_mb:,.0f} MB, over Lambda's largest "
                    f"function ({largest:,.0f} MB).",
                    "use a driver (--deployment driver or auto).",
                )
            return InfeasibleError(
                f"{what} needs {need:,.0f} MB with a KV cache of {ginst.sequences} x "
                f"({ginst.prompt_tokens} + {ginst.new_tokens}) tokens ({ginst.kv_mb:,.0f} MB), "
                f"over Lambda's largest function ({largest:,.0f} MB).",
                fewer + ".",
            )
        if not (self.limits_ok & allowed).any():
            return InfeasibleError(
                f"no {deployment} plan fits Lambda's limits (the remote experts' memory, a "
                f"step's {ginst.sequences} rows inline in one Invoke) at any memory.",
                fewer + ".",
            )
        if not fits.any():
            fastest = float(self.run[self.limits_ok & allowed].min())
            limit = ginst.prefill.base.max_timeout_s
            return InfeasibleError(
                f"{what} generating {ginst.new_tokens} tokens runs at least {fastest:,.1f} s, "
                f"over Lambda's {limit:g} s timeout of one invocation.",
                "plan fewer --new-tokens (or --batch-sequences, or shorter --prompt-tokens).",
            )
        if (fits & ttft_ok).any():
            smallest = float(self.tpot[fits & ttft_ok].min())
            within = "" if slo_ttft_s is None else f" within the TTFT SLO of {slo_ttft_s:.3f} s"
            return InfeasibleError(
                f"no {deployment} plan meets the TPOT SLO of {slo_tpot_s:.3f} s{within}: the "
                f"fastest takes {smallest:.3f} s per output token.",
                f"pass --slo-tpot {math.ceil(smallest * 1000) / 1000:.3f} or more, or fewer "
                "--batch-sequences.",
                smallest_slo_s=smallest,
            )
        smallest = float(self.ttft[fits].min())
        return InfeasibleError(
            f"no {deployment} plan meets the TTFT SLO of {slo_ttft_s:.3f} s: the fastest "
            f"prefill of {ginst.sequences} x {ginst.prompt_tokens} tokens takes {smallest:.3f} s.",
            f"pass --slo-ttft {math.ceil(smallest * 1000) / 1000:.3f} or more, or shorter "
            "--prompt-tokens or fewer --batch-sequences.",
            smallest_slo_s=smallest,
        )


def plan_generation(
    manifest: Manifest,
    share: np.ndarray,
    calibration: Calibration,
    *,
    deployment: str,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    sequences: int = DEFAULT_SEQUENCES,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    arch: str = "x86_64",
    kv_bytes_per_token: float | None = None,
) -> tuple[GenerationInstance, GenerationSolution]:
    """The cheapest `deployment` ("driver" or "monolithic") generating plan meeting the SLOs.

    The one-state workflow that starts the driver is Express while the whole generation fits
    its duration, else Standard (as `planner.deployments.plan_driver_shape` chooses).

    Example::

        planning = shape_counts_for_plan("mixtral", "zipf:1.0", tokens=10240)
        share = planning.counts / planning.tokens
        ginst, best = plan_generation(planning.manifest, share, load_calibration(),
                                      deployment="driver", slo_ttft_s=300, slo_tpot_s=5)
        print(best.evaluation.tpot_s, best.choice.local_per_layer)

    Raises:
        UsageError: An encoder, a length below 1 or an unknown deployment.
        InfeasibleError: No plan; the message names why and the smallest SLO met.
    """
    if deployment not in TOPOLOGIES or not TOPOLOGIES[deployment].generates:
        raise UsageError(
            f"generation is planned for a driver or one function, not '{deployment}'.",
            "pass --deployment driver, monolithic or auto.",
        )
    build = functools.partial(
        generation_instance,
        manifest,
        share,
        calibration,
        sequences=sequences,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        arch=arch,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    ginst = build(workflow="express")
    best = GenerationGrid.make(ginst).best(deployment, slo_ttft_s, slo_tpot_s)
    if best.evaluation.run_s > calibration.express_max_duration_s:
        ginst = build(workflow="standard")
        best = GenerationGrid.make(ginst).best(deployment, slo_ttft_s, slo_tpot_s)
    return ginst, best
