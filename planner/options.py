"""How a batch is planned: the planner's options and every rule between them.

`moelambda plan`'s options (`PlanOptions`), the counts they plan for (`PlanningCounts`) and the
cross-option rules the command line used to hold (`check_plan_options`,
`check_stream_options`, `plan_confidence`, `slo_of`): each refuses a combination before any
loading, naming the flag and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.confidence import CountDistribution
    from planner.instance import Method

__all__ = [
    "DEFAULT_CONFIDENCE",
    "SOLVERS",
    "PlanOptions",
    "PlanningCounts",
    "check_plan_options",
    "check_stream_flags",
    "check_stream_options",
    "plan_confidence",
    "slo_of",
]

SOLVERS = ("exact", "ods", "milp")
DEFAULT_CONFIDENCE = 0.99  # with a counts file that carries its predictive distribution


@dataclass(frozen=True, eq=False)
class PlanningCounts:
    """The expert counts a plan is made for, scaled to its batch, and where they came from.

    Attributes:
        counts: Predicted tokens per (MoE layer, expert) in a batch of `tokens`.
        tokens: Tokens per batch the counts are scaled to.
        source: Where the counts came from, as the plan's `counts_source` records it.
        model: The identity of the model they were predicted for (model, experts, top_k,
            seed, moefy), to load it; None for a shape (see `manifest`).
        dist: Their predictive distribution at `tokens`; None when the input holds none.
        manifest: A shape's synthetic manifest (a model known by its architecture alone).
    """

    counts: np.ndarray
    tokens: int
    source: dict[str, Any]
    model: dict[str, Any] | None = None
    dist: CountDistribution | None = None
    manifest: Manifest | None = None


@dataclass(frozen=True)
class PlanOptions:
    """How a batch is planned: `moelambda plan`'s options, with its defaults.

    Attributes:
        solver: One of `SOLVERS`.
        method: Force one method on every layer (pipelined, s3, direct); None: any.
        arch: Lambda architecture, x86_64 or arm64.
        workflow: express or standard; None: express when the plan's latency fits.
        objective: "full" (the whole bill) or "experts" (the paper's objective).
        confidence: See `plan_confidence`; None: its default.
        pack: Experts per function: "auto" (the cheapest of every divisor) or a number.
        concurrency_quota: Refuse a plan whose reserved concurrency does not fit this account
            quota; None: no check.
        deployment: "auto" (every shape, the cheapest kept), "monolithic", "driver" or
            "workflow" (`planner.deployments`).
        slo_ttft_s: Plan generation (`planner.generation`): time to first token, seconds;
            None: no bound. Setting any of it, `slo_tpot_s`, `batch_sequences`,
            `prompt_tokens` or `new_tokens` plans a decoder's generation instead of a batch.
        slo_tpot_s: Time per output token, seconds; None: no bound.
        batch_sequences: Sequences decoded together; None: `DEFAULT_SEQUENCES`.
        prompt_tokens: Prompt tokens per sequence; None: `DEFAULT_PROMPT_TOKENS`.
        new_tokens: Tokens generated per sequence; None: `DEFAULT_NEW_TOKENS`.
    """

    solver: str = "exact"
    method: str | None = None
    arch: str = "x86_64"
    workflow: str | None = None
    objective: str = "full"
    confidence: float | None = None
    pack: str = "auto"
    concurrency_quota: int | None = 1000
    deployment: str = "auto"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    batch_sequences: int | None = None
    prompt_tokens: int | None = None
    new_tokens: int | None = None

    @property
    def generating(self) -> bool:
        """Whether to plan a decoder's generation (TTFT, TPOT) rather than one batch."""
        return any(
            value is not None
            for value in (
                self.slo_ttft_s,
                self.slo_tpot_s,
                self.batch_sequences,
                self.prompt_tokens,
                self.new_tokens,
            )
        )

    def workflow_only(self) -> list[str]:
        """The flags set that only the fan-out workflow takes (--objective experts, --method,
        --pack K > 1)."""
        return [
            flag
            for flag, clash in (
                ("--objective experts", self.objective == "experts"),
                ("--method", self.method is not None),
                (f"--pack {self.pack}", self.pack not in ("auto", "1")),
            )
            if clash
        ]

    def check(self, counts: PlanningCounts) -> tuple[tuple[Method, ...], float]:
        """The methods the layers may use and the confidence level to plan `counts` at.

        Raises:
            UsageError: An unknown workflow type, objective, solver or architecture, an
                empty batch, or a confidence level `plan_confidence` refuses (the deployment
                shape is `planner.batch_shapes.check_shape`'s).
        """
        if self.workflow not in (None, "express", "standard"):
            raise UsageError(f"unknown --workflow '{self.workflow}'.", "use express or standard.")
        if self.objective not in ("full", "experts"):
            raise UsageError(f"unknown --objective '{self.objective}'.", "use full or experts.")
        methods = check_plan_options(
            solver=self.solver, arch=self.arch, tokens=counts.tokens, method=self.method
        )
        if self.generating:
            self._check_generation()
        return methods, plan_confidence(self.confidence, counts)

    def _check_generation(self) -> None:
        """Refuse options that a generation plan cannot honour.

        Raises:
            UsageError: A workflow-only option, a confidence level, or a non-positive SLO (the
                shape is checked by `planner.batch_shapes.check_shape`).
        """
        for flag in self.workflow_only():
            raise UsageError(
                f"{flag} is an option of the fan-out workflow, which does not generate.",
                f"drop {flag.split()[0]} with --slo-ttft/--slo-tpot.",
            )
        if self.confidence:
            raise UsageError(
                "--confidence is not planned for generation: it is planned for the predicted "
                "routing shares.",
                "drop --confidence (or pass 0).",
            )
        for flag, value in (("--slo-ttft", self.slo_ttft_s), ("--slo-tpot", self.slo_tpot_s)):
            if value is not None and not value > 0:
                raise UsageError(f"{flag} {value} is not positive.", f"pass a positive {flag}.")


def check_plan_options(
    *,
    solver: str = "exact",
    arch: str = "x86_64",
    tokens: int = 1,
    method: str | None = None,
) -> tuple[Method, ...]:
    """Refuse an unknown solver or architecture or an empty batch, before any loading.

    Returns:
        The methods the layers may use: every one, or the one `method` names.
    """
    from planner.instance import Method

    if solver not in SOLVERS:
        raise UsageError(f"unknown --solver '{solver}'.", f"use one of: {', '.join(SOLVERS)}.")
    if arch not in ("x86_64", "arm64"):
        raise UsageError(f"unknown --arch '{arch}'.", "use x86_64 or arm64.")
    if tokens < 1:
        raise UsageError(f"--tokens {tokens} is not positive.", "pass --tokens 1 or more.")
    return tuple(Method) if method is None else (Method.parse(method),)


def check_stream_options(
    options: PlanOptions, *, hardware: str, traffic: str | None, tokens: int | None
) -> None:
    """Refuse `moelambda plan` options that the hardware or the stream would drop unsaid,
    before any loading: what `plan_traffic_on_hardware` (GPU-backed functions, `--hardware
    gpu|auto` with `--traffic`) and `planner.traffic.api.plan_traffic` would not honour.

    Args:
        options: The plan's options (`deployment`, the generation options).
        hardware: cpu, gpu or auto.
        traffic: The request stream, None without one.
        tokens: `--tokens` when given, None when left at its default.

    Raises:
        UsageError: An unknown hardware; GPU-backed functions without a stream or for a
            decoder's generation; a --deployment the GPU-backed candidates would not keep;
            --tokens with a stream (its batching decides the batch size).
    """
    from planner.hardware import check_hardware

    check_hardware(hardware)
    generation = [
        flag
        for flag, value in (
            ("--slo-ttft", options.slo_ttft_s),
            ("--slo-tpot", options.slo_tpot_s),
            ("--batch-sequences", options.batch_sequences),
            ("--prompt-tokens", options.prompt_tokens),
            ("--new-tokens", options.new_tokens),
        )
        if value is not None
    ]
    if hardware == "gpu" and generation:
        raise UsageError(
            "--hardware gpu plans GPU-backed functions for a stream of batches, not yet a "
            f"decoder's generation ({', '.join(generation)}).",
            "pass --hardware cpu to plan the generation on CPU functions, or drop "
            f"{', '.join(generation)} and pass --traffic SPEC --slo-p99 SECONDS to plan "
            "GPU-backed functions for the stream's batches.",
        )
    if hardware == "gpu" and traffic is None:
        raise UsageError(
            "--hardware gpu plans GPU-backed functions for a request stream (their pool is "
            "billed by the hour).",
            "pass --traffic SPEC --slo-p99 SECONDS, or --hardware cpu.",
        )
    if (
        traffic is not None
        and not generation
        and hardware != "cpu"
        and options.deployment != "auto"
    ):
        default = " (the default)" if hardware == "auto" else ""
        raise UsageError(
            f"--deployment {options.deployment} with --hardware {hardware}{default}: the "
            "GPU-backed candidates have shapes of their own (one GPU function holding the "
            "model, layer stages, or a GPU driver with CPU experts), so the plan written "
            f"could be another shape than {options.deployment}.",
            f"pass --hardware cpu to plan the {options.deployment} deployment for the "
            "stream, or drop --deployment to weigh every shape.",
        )
    if traffic is not None and tokens is not None:
        raise UsageError(
            f"--tokens {tokens} with --traffic: the stream's batching decides the batch size "
            "(`plan --traffic` chooses the batch policy, the most tokens per batch and the "
            "longest wait, from the stream; a generation plans each request's own prompt).",
            "drop --tokens; the plan says the batch size it chose (max_batch_tokens).",
        )


def slo_of(slo: float | None, throughput: float | None, tokens: int) -> float | None:
    """The batch SLO in seconds: `slo`, or `tokens / throughput` (None: no SLO)."""
    if slo is not None and throughput is not None:
        raise UsageError("--slo and --throughput both set the SLO.", "pass only one of them.")
    for name, value in (("--slo", slo), ("--throughput", throughput)):
        if value is not None and not value > 0:
            raise UsageError(f"{name} {value} is not positive.", f"pass a positive {name}.")
    return tokens / throughput if throughput is not None else slo


def plan_confidence(confidence: float | None, counts: PlanningCounts) -> float:
    """The confidence level to plan at: `confidence`, by default `DEFAULT_CONFIDENCE` when the
    counts carry a distribution, else 0 (plan the predicted counts alone).

    Raises:
        UsageError: A level outside [0, 1), or above 0 for counts without a distribution.
    """
    if confidence is None:
        confidence = DEFAULT_CONFIDENCE if counts.dist is not None else 0.0
    if not 0.0 <= confidence < 1.0:
        raise UsageError(
            f"--confidence {confidence:g} is not in [0, 1).",
            "pass e.g. 0.99, or 0 for a plan of the predicted counts alone.",
        )
    if confidence > 0 and counts.dist is None:
        raise UsageError(
            "--confidence needs the predicted counts' distribution, which "
            + (
                "--traces does not measure."
                if "counts" not in counts.source
                else f"{counts.source['counts']} does not hold."
            ),
            "write the counts with `moelambda predict --counts-out FILE` (it measures the "
            "model error on held-out batches) and plan --counts FILE, or pass --confidence 0.",
        )
    return confidence


def check_stream_flags(
    *,
    traffic: str | None,
    slo_p99_s: float | None,
    batch_slo: bool,
    generating: bool,
    stream_flags: dict[str, bool],
) -> None:
    """Refuse `moelambda plan`'s stream flags that do not go together, before any loading.

    Args:
        traffic: The request stream, None without one.
        slo_p99_s: `--slo-p99`, None when not given.
        batch_slo: Whether a batch's SLO was given (`--slo` or `--throughput`).
        generating: Whether generation is planned (`PlanOptions.generating`).
        stream_flags: Each flag that describes a stream (`--hours`, `--minutes`, `--idle-s`,
            `--scale`) and whether it was given.

    Raises:
        UsageError: --slo-p99 for a generating stream; --traffic without --slo-p99 or the
            other way round, or with a batch's SLO; a stream flag without --traffic.
    """
    if traffic is not None and generating:
        if slo_p99_s is not None:
            raise UsageError(
                "--slo-p99 bounds a batch plan's requests; a generating plan for --traffic is "
                "planned under --slo-ttft and --slo-tpot.",
                "drop --slo-p99 (pass --slo-ttft and --slo-tpot).",
            )
    elif (traffic is None) != (slo_p99_s is None) or (traffic and batch_slo):
        raise UsageError(
            "--traffic and --slo-p99 go together, and replace --slo/--throughput.",
            "pass --traffic SPEC --slo-p99 SECONDS, or neither.",
        )
    if traffic is None:
        for flag, given in stream_flags.items():
            if given:
                raise UsageError(
                    f"{flag} needs --traffic.", f"pass --traffic SPEC, or drop {flag}."
                )
