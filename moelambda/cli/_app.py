"""What every command shares: the Typer apps, common options, error handling, model loading.

The consoles (`err`, `stdout`, `progress`) are `moelambda.cli._console`'s, imported from here.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ground.errors import MoelambdaError, UsageError
from moelambda.cli._console import (  # noqa: F401  (err, progress, stdout: re-exported)
    err,
    progress,
    stdout,
    widen_piped_help,
)

widen_piped_help()
app = typer.Typer(
    help="Serve Mixture-of-Experts models on serverless functions at the lowest bill.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print measured numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Library warnings (e.g. Gurobi's licence fallback) as one line, not a source excerpt."""
    err.print(f"[yellow]note:[/] {message}", highlight=False, soft_wrap=True)


warnings.showwarning = _show_warning
DEFAULT_BATCH = 32  # windows per forward pass: 4,096 tokens, the fastest on 2 cores
F = TypeVar("F", bound=Callable[..., Any])

ModelOpt = Annotated[
    str, typer.Option(help="'minilm', 'smollm2', or a local Hugging Face model directory.")
]
ExpertsOpt = Annotated[
    int | None,
    typer.Option(
        help="Experts per MoE layer for MoEfication (2, 4, 8, 16). Native MoE models "
        "keep their own; leave it out for them."
    ),
]
TopKOpt = Annotated[
    str | None,
    typer.Option(
        "--top-k",
        help="Experts per token: an integer (default 2), adaptive:T (a second expert when the "
        "top two gate probabilities are within T) or mass:P (experts until their gate "
        "probabilities add up to P).",
    ),
]
SharedOpt = Annotated[
    float,
    typer.Option(
        help="Fraction of the FFN width in an always-on shared expert run in the layer "
        "function (0 = none)."
    ),
]
RouterOpt = Annotated[
    str,
    typer.Option(
        help="'mass': route to the groups of largest activation mass (MoEfication); 'output': "
        "to the experts whose outputs best reproduce the dense FFN."
    ),
]
CorrectionOpt = Annotated[
    bool,
    typer.Option(
        help="Refit the experts' output projections and biases by least squares so the routed "
        "FFN matches the dense one on the fit text."
    ),
]
DistilOpt = Annotated[
    int,
    typer.Option(
        help="Steps of end-to-end distillation of the experts on every window of the fit "
        "text's fit part (0 = none)."
    ),
]
LocalOpt = Annotated[
    int,
    typer.Option(
        help="Steps of layer-local distillation per layer: each layer's experts learn the "
        "dense FFN's output on the inputs the MoEfied layers before it give (0 = none)."
    ),
]
RidgeOpt = Annotated[
    float | None,
    typer.Option(
        help="The correction's ridge penalty, relative to the features' mean energy (larger: "
        "closer to the dense weights, steadier on little fit text). Default 0.001."
    ),
]
FitTokensOpt = Annotated[
    int, typer.Option(help="Tokens of the fit text the routers and corrections are fitted on.")
]
FitCorpusOpt = Annotated[
    str | None,
    typer.Option(
        help="The text the MoEfied model is fitted on: 'wiki' (embedded) or a text/JSONL file, "
        "split by document into fit, validation and test parts (routers, corrections and "
        "distillation learn from the fit part). Defaults to --corpus, else wiki."
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Seeds the corpus shuffle and the MoEfication.")]
TracesOpt = Annotated[
    Path, typer.Option(help="Routing-trace directory written by `moelambda profile`.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ForceOpt = Annotated[
    bool,
    typer.Option(help="Replace the files this command writes (--out, --plot, ...) if they exist."),
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        help="Precision of the served weights: fp32; bf16 (a GPU, or a CPU with AVX512-BF16 or "
        "AMX); int8 (CPUs: weight-only, one scale per output channel); or per stage kind, "
        "e.g. stack=bf16,experts=int8 (stack: embeddings, attention, LM head).",
    ),
]
CacheOpt = Annotated[
    bool,
    typer.Option(
        help="Reuse a model MoEfied before (cache in $MOELAMBDA_CACHE_DIR, else "
        "~/.cache/moelambda)."
    ),
]


def renamed(old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """The value of an option given under its old spelling (`old`, kept for one release with a
    deprecation note) or its new one (`new`); both at once is refused."""
    if old_value is None or old_value is False:
        return new_value
    if new_value not in (None, False):
        raise UsageError(f"{old} and {new} are the same option.", f"pass only {new}.")
    err.print(f"[yellow]note:[/] {old} is now {new}; {old} will be removed in the next release.")
    return old_value


def user_errors(fn: F) -> F:
    """Turn a `MoelambdaError` into its message on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MoelambdaError as error:
            err.print(f"[bold red]error:[/] {error.problem}", highlight=False, soft_wrap=True)
            if error.fix:
                err.print(f"To fix: {error.fix}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _defaults(
    model: str, experts: int | None, top_k: str | int | None
) -> tuple[int | None, str | int | None]:
    """Built-in dense models default to E=4, k=2; a local directory may be native MoE."""
    from moe import resolve_model
    from moe._families import NATIVE_MOE_TYPES

    if resolve_model(model).model_type in NATIVE_MOE_TYPES:
        return experts, top_k
    return (4 if experts is None else experts), (2 if top_k is None else top_k)


def moefy_flags(
    model: str,
    experts: int | None,
    top_k: str | int | None,
    seed: int,
    *,
    shared: float = 0.0,
    router: str = "mass",
    correction: bool = False,
    distil_steps: int = 0,
    local_steps: int = 0,
    ridge: float | None = None,
    fit_tokens: int = 8192,
    fit_corpus: str | None = None,
    corpus: str = "wiki",
) -> Any:
    """The `moe.MoefyOptions` of a command's flags, or None for a native MoE model.

    The model is fitted on `fit_corpus` (--fit-corpus) when given, else on `corpus` (the
    command's --corpus: the user's text). Checks every value before any model is loaded, the
    fit corpus's file included.
    """
    from moe import moefy_options, resolve_model
    from moe._families import NATIVE_MOE_TYPES

    if resolve_model(model).model_type in NATIVE_MOE_TYPES:
        recovery = shared or router != "mass" or correction or distil_steps or local_steps
        if recovery or fit_corpus is not None:
            raise UsageError(
                f"{model} is a native MoE model: it is served as it is, and the MoEfication "
                "options (--shared, --router, --correction, --distil-steps, --local-steps, "
                "--fit-corpus) do not apply.",
                "leave them out for this model.",
            )
        return None
    if router not in ("mass", "output"):
        raise UsageError(f"--router '{router}' is not known.", "use mass or output.")
    experts, top_k = _defaults(model, experts, top_k)
    fit = fit_corpus or corpus
    if fit != "wiki":  # where the file is, so a plan names it from any working directory
        fit = str(Path(fit).expanduser().resolve())
    options = moefy_options(
        experts,
        top_k,
        seed=seed,
        fit_tokens=fit_tokens,
        shared=shared,
        router=router,
        correction=correction,
        distil_steps=distil_steps,
        local_steps=local_steps,
        **({} if ridge is None else {"ridge": ridge}),
        fit_corpus=fit,
    )
    from moe import load_corpus

    # A missing or unreadable file is said now.
    load_corpus(options.fit_corpus, "--fit-corpus" if fit_corpus else "--corpus")
    return options


def weights_flag(spec: str | None) -> Any:
    """The `ground.precision.Weights` of `--weights` (or of a plan's or trace's record),
    checked against this machine before any model is loaded."""
    from ground.precision import parse_weights
    from moe import check_precision

    return check_precision(parse_weights(spec))


def load_with_status(
    model: str,
    experts: int | None,
    top_k: str | int | None,
    seed: int,
    cache: bool,
    moefy: Any = None,
    weights: Any = None,
) -> Any:
    """Load (MoEfying on first use) the model; `moefy` is a `MoefyOptions` or its description
    as traces, counts and plans record it, and wins over `experts`/`top_k`/`seed`; `weights`
    (a `Weights` or its label) is the precision it is served at (float32 when None)."""
    from moe import MoefyOptions, at_precision, load_model

    if isinstance(moefy, dict):
        moefy = MoefyOptions.from_description(moefy)
    precision = weights_flag(weights) if weights is None or isinstance(weights, str) else weights
    experts, top_k = _defaults(model, experts, top_k)
    with err.status("loading the model") as status:
        loaded = load_model(
            model,
            experts=experts,
            top_k=top_k,
            seed=seed,
            options=moefy,
            cache=cache,
            progress=lambda msg: status.update(msg),
        )
        if precision.is_fp32:
            return loaded
        status.update(f"converting the weights to {precision.label()}")
        return at_precision(loaded, precision)


def check_writable(path: Path, flag: str) -> None:
    """Fail before any slow work when `path` could not be written (its parent a file, or a
    directory this process cannot write to); the writers in `ground.files` make the rest of
    its parents."""
    from ground.files import why_unwritable

    why = why_unwritable(path)
    if why is not None:
        raise UsageError(
            f"{flag} '{path}' cannot be written: {why}.",
            f"pass a {flag} under a directory you can write to, e.g. {flag} out/{path.name}.",
        )


def check_out(out: Path, force: bool, flag: str = "--out") -> None:
    """Fail before any slow work when the output directory would overwrite data or could not
    be written."""
    from ground.errors import OutputExistsError

    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise OutputExistsError(
            f"'{out}' already exists and is not empty.", f"pick a new {flag} or pass --force."
        )
    check_writable(out, flag)


def check_file_out(path: Path | None, force: bool, flag: str) -> None:
    """Fail before any slow work when the output file `path` (None: not asked for) exists
    without --force, is a directory, or could not be written."""
    from ground.errors import OutputExistsError

    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{flag} '{path}' is a directory.", f"pass a file name as {flag}.")
    if path.exists() and not force:
        raise OutputExistsError(
            f"'{path}' already exists.", f"pick another {flag} or pass --force."
        )
    check_writable(path, flag)


def check_positive(*given: tuple[str, float | None]) -> None:
    """Refuse each (flag, value) whose value is given but not a positive number."""
    for flag, value in given:
        if value is not None and not value > 0:
            raise UsageError(f"{flag} {value:g} is not positive.", f"pass a positive {flag}.")


def manifest_of_trace(trace: Any) -> Any:
    """The Manifest of the model a routing trace was recorded on (loaded, MoEfied if needed)."""
    from moe import describe_model

    model = load_with_status(
        trace.meta["model"],
        trace.num_experts,
        trace.top_k,
        int(trace.meta.get("moefy_seed", 0)),
        True,
        trace.meta.get("moefy"),
        trace.meta.get("weights"),
    )
    return describe_model(model)


def manifest_of_counts(counts: Any) -> Any:
    """The Manifest of the model `planner.api.PlanningCounts` were predicted for (loaded,
    MoEfied if needed)."""
    from moe import describe_model

    model = counts.model
    return describe_model(
        load_with_status(
            model["model"],
            model["experts"],
            model["top_k"],
            model["seed"],
            True,
            model["moefy"],
            model.get("weights"),
        )
    )
