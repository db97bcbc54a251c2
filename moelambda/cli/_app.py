"""What every command shares: the Typer apps, common options, error handling, model loading."""

from __future__ import annotations

import functools
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions

from ground.errors import MoelambdaError, UsageError

app = typer.Typer(
    help="Serve Mixture-of-Experts models on serverless functions at the lowest bill.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print measured numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

# Width of a summary written to a pipe or a file: no table is cut (rich's default is 80
# columns, or the width of whichever standard stream is a terminal).
PIPE_WIDTH = 400
HEARTBEAT_S = 15.0  # a plain-line status says it is still at work this often


class _Console(Console):
    """A rich console that is as wide as the terminal, or `PIPE_WIDTH` when its stream is not
    a terminal (and $COLUMNS is unset), and whose `status` is plain lines with elapsed time
    when its stream is not a terminal (a spinner would only leave blank lines in a log)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        if self.is_terminal or self._width is not None or "COLUMNS" in os.environ:
            return size  # type: ignore[no-any-return]
        return ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def status(self, status: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self.is_terminal:
            return super().status(status, **kwargs)
        return PlainStatus(self, str(status))


class PlainStatus:
    """`Console.status` for a log: a line when the work starts, one per new message, one every
    `HEARTBEAT_S` seconds of silence, and one when it ends, each with the seconds elapsed."""

    def __init__(self, console: Console, message: str) -> None:
        self.console, self.message, self.last = console, message, message
        self.started = time.perf_counter()
        self.printed = self.started
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._heartbeat, daemon=True)

    def _line(self, text: str) -> None:
        with self.lock:
            now = time.perf_counter()
            self.printed = now
            self.console.print(
                f"[{now - self.started:6.1f} s] {text}", highlight=False, markup=False
            )

    def _heartbeat(self) -> None:
        while not self.stop.wait(1.0):
            if time.perf_counter() - self.printed >= HEARTBEAT_S:
                self._line(f"{self.last} (still at work)")

    def update(self, status: Any = None, **_: Any) -> None:
        """Print `status` if it is a new message."""
        if status is not None and str(status) != self.last:
            self.last = str(status)
            self._line(self.last)

    def __enter__(self) -> PlainStatus:
        self._line(f"{self.message} ...")
        self.thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop.set()
        self.thread.join()
        self._line(f"{self.message}: {'done' if kind is None else 'stopped'}")


class PlainProgress:
    """The part of `rich.progress.Progress` the commands use, as plain lines for a log: one
    line when a task starts, then at most one every few seconds, and one when it ends."""

    EVERY_S = 5.0

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.perf_counter()
        self.tasks: dict[int, dict[str, Any]] = {}

    def _line(self, task: dict[str, Any]) -> None:
        now = time.perf_counter()
        task["printed"] = now
        total = "" if task["total"] is None else f"/{task['total']:,}"
        done = f": {task['completed']:,}{total}" if task["completed"] or task["total"] else ""
        self.console.print(
            f"[{now - self.started:6.1f} s] {task['description']}{done}",
            highlight=False,
            markup=False,
        )

    def add_task(self, description: str, total: float | None = 100.0, **_: Any) -> int:
        """A new task, announced at once; returns its id."""
        task_id = len(self.tasks)
        total = None if total is None else int(total)
        self.tasks[task_id] = {"description": description, "total": total, "completed": 0}
        self._line(self.tasks[task_id])
        return task_id

    def update(
        self,
        task_id: int,
        *,
        completed: float | None = None,
        total: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        """Record progress; print it when a few seconds passed or the task finished."""
        task = self.tasks[task_id]
        if total is not None:
            task["total"] = int(total)
        if completed is not None:
            task["completed"] = int(completed)
        if advance is not None:
            task["completed"] += int(advance)
        if description is not None:
            task["description"] = description
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if finished and not task.get("finished"):
            task["finished"] = True
            self._line(task)
        elif time.perf_counter() - task["printed"] >= self.EVERY_S:
            self._line(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        """Add `advance` to the task's completed count."""
        self.update(task_id, advance=advance)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: object) -> None:
        for task in self.tasks.values():
            if not task.get("finished"):
                self._line(task)


def progress(*columns: Any, **kwargs: Any) -> Any:
    """A rich progress bar on stderr (transient), or `PlainProgress` lines when stderr is not a
    terminal. Takes `rich.progress.Progress`'s columns and keyword arguments."""
    if not err.is_terminal:
        return PlainProgress(err)
    from rich.progress import Progress

    return Progress(*columns, console=err, transient=True, **kwargs)


def stdout() -> Console:
    """The console a command's readable summary goes to (stdout): the terminal's width, or wide
    enough that no table is cut when stdout is a pipe or a file."""
    return _Console()


err = _Console(stderr=True)


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
    int, typer.Option(help="Steps of end-to-end distillation of the experts (0 = none).")
]
FitTokensOpt = Annotated[
    int, typer.Option(help="Tokens of the fit text the routers and corrections are fitted on.")
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
    fit_tokens: int = 8192,
) -> Any:
    """The `moe.MoefyOptions` of a command's flags, or None for a native MoE model.

    Checks every value before any model is loaded.
    """
    from moe import moefy_options, resolve_model
    from moe._families import NATIVE_MOE_TYPES

    if resolve_model(model).model_type in NATIVE_MOE_TYPES:
        recovery = shared or router != "mass" or correction or distil_steps
        if recovery:
            raise UsageError(
                f"{model} is a native MoE model: it is served as it is, and the MoEfication "
                "options (--shared, --router, --correction, --distil-steps) do not apply.",
                "leave them out for this model.",
            )
        return None
    if router not in ("mass", "output"):
        raise UsageError(f"--router '{router}' is not known.", "use mass or output.")
    experts, top_k = _defaults(model, experts, top_k)
    return moefy_options(
        experts,
        top_k,
        seed=seed,
        fit_tokens=fit_tokens,
        shared=shared,
        router=router,
        correction=correction,
        distil_steps=distil_steps,
    )


def load_with_status(
    model: str,
    experts: int | None,
    top_k: str | int | None,
    seed: int,
    cache: bool,
    moefy: Any = None,
) -> Any:
    """Load (MoEfying on first use) the model; `moefy` is a `MoefyOptions` or its description
    as traces, counts and plans record it, and wins over `experts`/`top_k`/`seed`."""
    from moe import MoefyOptions, load_model

    if isinstance(moefy, dict):
        moefy = MoefyOptions.from_description(moefy)
    experts, top_k = _defaults(model, experts, top_k)
    with err.status("loading the model") as status:
        return load_model(
            model,
            experts=experts,
            top_k=top_k,
            seed=seed,
            options=moefy,
            cache=cache,
            progress=lambda msg: status.update(msg),
        )


def check_out(out: Path, force: bool) -> None:
    """Fail before any slow work when the output would overwrite data."""
    from ground.errors import OutputExistsError

    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise OutputExistsError(
            f"'{out}' already exists and is not empty.", "pick a new --out or pass --force."
        )


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
    )
    return describe_model(model)
