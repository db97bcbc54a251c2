"""Traffic: the request stream a deployment serves, as arrival times and tokens per request.

A spec is one of
- a CSV file with an arrival timestamp and a token count per request, read as the Azure LLM
  inference trace is written (`TIMESTAMP,ContextTokens,GeneratedTokens`; a numeric `time_s`
  column and a `tokens` column work too; the generated tokens, `GeneratedTokens` or
  `generated`, are optional and only a generating plan reads them); `azure-conv` names the
  conversation trace shipped in `planner/traffic/data` (CC-BY 4.0, see its SOURCES.md);
- `poisson:RATE`: a Poisson process of RATE requests per second;
- `diurnal:PEAK,TROUGH`: a Poisson process whose rate follows a day, from TROUGH requests per
  second at midnight to PEAK at noon (a raised cosine), made by thinning.

Synthetic specs draw each request from the shipped trace's requests (its ContextTokens and
GeneratedTokens together), so every spec has the same request sizes; they are seeded. `scale`
multiplies the arrival rate: a trace's times are divided by it (0.01 stretches the same pattern
a hundred times in time), a synthetic rate is multiplied by it. `hours` keeps the first H
hours; a trace repeats to fill them (each repetition starts one mean gap after the previous one
ends). Everything is vectorised numpy.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import UsageError

__all__ = [
    "BUNDLED",
    "MAX_HOURS",
    "MAX_REQUESTS",
    "Arrivals",
    "generation_arrivals",
    "load_arrivals",
    "period_hours",
    "trace_requests",
    "trace_tokens",
]

BUNDLED = {"azure-conv": "AzureLLMInferenceTrace_conv.csv"}
# The most a stream may ask of the simulator (`moelambda traffic`, `plan --traffic`,
# `run-local --traffic`): a period of 31 days (744 h, the longest month), and 20 million requests,
# about 2-3 minutes and, extrapolated, 4 GB on 2 cores (measured with the demo's plan: a day of
# the Azure trace, 478,716 requests, 280 MB and 2 s; a week, 3.3 million, 820 MB and 12 s; an
# hour at --scale 1000, 19.9 million, 160 s). Both are checked before a request is drawn.
MAX_HOURS = 744.0
MAX_REQUESTS = 20_000_000
TIME_COLUMNS = ("TIMESTAMP", "timestamp", "time_s")
TOKEN_COLUMNS = ("ContextTokens", "tokens")
GENERATED_COLUMNS = ("GeneratedTokens", "generated")
DAY_S = 86400.0


@dataclass(frozen=True, eq=False)
class Arrivals:
    """Requests of one period: arrival seconds from its start (sorted), tokens of each (a
    decoder's context), and the tokens each generates (None: the stream does not say)."""

    times_s: np.ndarray
    tokens: np.ndarray
    period_s: float
    source: dict[str, Any] = field(default_factory=dict)
    generated: np.ndarray | None = None

    @property
    def requests(self) -> int:
        return int(self.times_s.size)

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    def window(self, start_s: float, end_s: float) -> Arrivals:
        """The requests arriving in [start_s, end_s), with times from start_s: a later period
        of the same stream (e.g. the day after the one a plan was made on)."""
        if not 0 <= start_s < end_s <= self.period_s:
            raise UsageError(
                f"the window {start_s:g}-{end_s:g} s is not inside the {self.period_s:g} s "
                "period.",
                "take a window inside the period.",
            )
        keep = (self.times_s >= start_s) & (self.times_s < end_s)
        source = self.source | {"window_s": [start_s, end_s]}
        generated = None if self.generated is None else self.generated[keep]
        return Arrivals(
            self.times_s[keep] - start_s, self.tokens[keep], end_s - start_s, source, generated
        )

    def describe(self) -> dict[str, Any]:
        """What the stream is, for JSON reports: its spec and its measured rate."""
        return self.source | {
            "requests": self.requests,
            "tokens": self.total_tokens,
            "period_s": self.period_s,
            "rate_per_s": self.requests / self.period_s if self.period_s > 0 else 0.0,
        }


def _bundled_path(name: str) -> Path:
    return Path(str(resources.files("planner.traffic") / "data" / BUNDLED[name]))


def _find(header: list[str], names: tuple[str, ...]) -> int | None:
    return next((header.index(name) for name in names if name in header), None)


def _column(header: list[str], names: tuple[str, ...], path: Path, what: str) -> int:
    found = _find(header, names)
    if found is not None:
        return found
    raise UsageError(
        f"{path} has no {what} column (looked for {', '.join(names)}; found "
        f"{', '.join(header) or 'no header'}).",
        f"give the CSV a header with one of {', '.join(names)}, as the Azure trace has.",
    )


def _read_csv(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(seconds from the first arrival, tokens, generated tokens or None) of a trace file,
    sorted by arrival."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise UsageError(
            f"cannot read the traffic file {path}: {exc.strerror}.",
            "pass an existing CSV, 'azure-conv', 'poisson:RATE' or 'diurnal:PEAK,TROUGH'.",
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the traffic file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
            f"offset {exc.start}): it must be a CSV of timestamps and token counts.",
            "pass a UTF-8 CSV with a header such as TIMESTAMP,ContextTokens,GeneratedTokens "
            "(the Azure trace's), or 'azure-conv', 'poisson:RATE' or 'diurnal:PEAK,TROUGH'.",
        ) from None
    if len(rows) < 2:
        raise UsageError(f"the traffic file {path} holds no requests.", "pass a non-empty CSV.")
    header, body = [h.strip().lstrip("\ufeff") for h in rows[0]], rows[1:]
    t_col = _column(header, TIME_COLUMNS, path, "timestamp")
    n_col = _column(header, TOKEN_COLUMNS, path, "token count")
    g_col = _find(header, GENERATED_COLUMNS)
    try:
        raw_t = np.array([row[t_col].strip() for row in body])
        tokens = np.array([row[n_col] for row in body], dtype=np.int64)
        generated = None
        if g_col is not None:
            generated = np.array([row[g_col] for row in body], dtype=np.int64)
        if header[t_col] == "time_s":
            seconds = raw_t.astype(float)
        else:
            stamps = raw_t.astype("datetime64[ns]")
            seconds = (stamps - stamps.min()).astype(np.int64) / 1e9
    except (ValueError, IndexError) as exc:
        raise UsageError(
            f"the traffic file {path} has a row that does not parse: {exc}.",
            "each row needs a timestamp (e.g. 2023-11-16 18:15:46.68) or seconds, and an "
            "integer token count (and generated tokens, when the file has them).",
        ) from None
    for what, values in (("tokens", tokens), ("generated tokens", generated)):
        if values is not None and (values < 1).any():
            raise UsageError(
                f"the traffic file {path} has requests of {int(values.min())} {what}.",
                f"every request needs at least one of its {what}.",
            )
    order = np.argsort(seconds, kind="stable")
    seconds = seconds[order]
    return seconds - seconds[0], tokens[order], None if generated is None else generated[order]


def trace_requests() -> tuple[np.ndarray, np.ndarray]:
    """(context tokens, generated tokens) per request of the shipped conversation trace: what
    synthetic specs draw from."""
    _, tokens, generated = _read_csv(_bundled_path("azure-conv"))
    assert generated is not None  # the shipped trace has the column
    return tokens, generated


def trace_tokens() -> np.ndarray:
    """Tokens per request of the shipped conversation trace (its ContextTokens)."""
    return trace_requests()[0]


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or not math.isfinite(value):
        raise UsageError(
            f"--traffic {spec!r}: {text!r} is not a positive number of requests per second.",
            "write e.g. poisson:2.5 or diurnal:10,0.5 (requests per second).",
        )
    return value


def _repeat(
    times: np.ndarray, tokens: np.ndarray, generated: np.ndarray | None, period_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The trace repeated end to end until it covers `period_s` seconds, cut there."""
    span = float(times[-1])
    gap = span / (times.size - 1) if times.size > 1 else max(span, 1.0)
    cycle = span + gap
    copies = max(1, math.ceil(period_s / cycle))
    all_times = (times[None, :] + cycle * np.arange(copies)[:, None]).ravel()
    keep = all_times < period_s
    all_generated = None if generated is None else np.tile(generated, copies)[keep]
    return all_times[keep], np.tile(tokens, copies)[keep], all_generated


def _poisson(rate: float, period_s: float, rng: np.random.Generator) -> np.ndarray:
    count = rng.poisson(rate * period_s)
    return np.sort(rng.uniform(0.0, period_s, size=count))


def period_hours(hours: float | None, minutes: float | None) -> float | None:
    """The period that `--hours` or `--minutes` gives, in hours (None when neither).

    Every command that takes a stream takes both, so a period written for one command works
    for the others (`run-local --traffic` replays minutes, `traffic` simulates days).

    Raises:
        UsageError: Both given, or `minutes` not positive or over `MAX_HOURS` (`load_arrivals`
            checks hours).
    """
    if hours is not None and minutes is not None:
        raise UsageError("--hours and --minutes both give the period.", "pass one of them.")
    if minutes is None:
        return hours
    if not minutes > 0 or not math.isfinite(minutes):
        raise UsageError(f"--minutes {minutes} is not positive.", "pass e.g. --minutes 10.")
    if minutes > MAX_HOURS * 60:
        raise UsageError(
            f"--minutes {minutes:g} is longer than the {MAX_HOURS * 60:,.0f} minutes "
            f"({MAX_HOURS / 24:g} days) a stream is simulated over.",
            f"pass --minutes {MAX_HOURS * 60:.0f} or less (or --hours {MAX_HOURS:g} or less).",
        )
    return minutes / 60.0


def _check_requests(expected: float, spec: str, scale: float, period_s: float) -> None:
    """Refuse a stream of more than `MAX_REQUESTS` (`expected`: before drawing them)."""
    if expected > MAX_REQUESTS:
        raise UsageError(
            f"--traffic {spec} at --scale {scale:g} over {period_s / 3600:g} h is about "
            f"{expected:,.0f} requests; the simulator takes at most {MAX_REQUESTS:,} (about 4 GB "
            "of memory and minutes of work).",
            "pass a smaller --scale or fewer --hours (or --minutes).",
        )


def load_arrivals(
    spec: str, *, scale: float = 1.0, hours: float | None = None, seed: int = 0
) -> Arrivals:
    """The arrivals a traffic spec describes (see the module docstring).

    Args:
        spec: A CSV path, 'azure-conv', 'poisson:RATE' or 'diurnal:PEAK,TROUGH' (per second).
        scale: Multiplies the arrival rate. Defaults to 1.
        hours: Length of the period. Defaults to None: a trace's own span (scaled), one hour
            for poisson, a day for diurnal.
        seed: Seeds synthetic arrivals and their token draws. Defaults to 0.

    Raises:
        UsageError: A malformed spec, an unreadable, non-UTF-8 or malformed file, a
            non-positive scale or period, `hours` over `MAX_HOURS`, or a stream of more than
            `MAX_REQUESTS` (estimated before any is drawn); the message says which and how to
            write it.
    """
    if not scale > 0 or not math.isfinite(scale):
        raise UsageError(f"--scale {scale} is not positive.", "pass e.g. --scale 0.01 or 2.")
    if hours is not None and (not hours > 0 or not math.isfinite(hours)):
        raise UsageError(f"--hours {hours} is not positive.", "pass e.g. --hours 24.")
    if hours is not None and hours > MAX_HOURS:
        raise UsageError(
            f"--hours {hours:g} is longer than the {MAX_HOURS:g} hours ({MAX_HOURS / 24:g} "
            "days) a stream is simulated over.",
            f"pass --hours {MAX_HOURS:g} or less (a trace repeats to fill them).",
        )
    rng = np.random.default_rng(seed)
    kind, _, args = spec.partition(":")
    source: dict[str, Any] = {"spec": spec, "scale": scale, "hours": hours}
    if kind == "poisson" and args:
        rate = _number(args, spec) * scale
        period = 3600.0 if hours is None else hours * 3600.0
        _check_requests(rate * period, spec, scale, period)
        times = _poisson(rate, period, rng)
        source["seed"] = seed
    elif kind == "diurnal" and args:
        parts = args.split(",")
        if len(parts) != 2:
            raise UsageError(
                f"--traffic {spec!r} needs a peak and a trough.", "write diurnal:PEAK,TROUGH."
            )
        peak, trough = (_number(p, spec) * scale for p in parts)
        if trough > peak:
            raise UsageError(
                f"--traffic {spec!r}: the trough exceeds the peak.", "write diurnal:PEAK,TROUGH."
            )
        period = DAY_S if hours is None else hours * 3600.0
        _check_requests(peak * period, spec, scale, period)
        candidates = _poisson(peak, period, rng)
        rate = trough + (peak - trough) * 0.5 * (1.0 - np.cos(2.0 * np.pi * candidates / DAY_S))
        times = candidates[rng.uniform(size=candidates.size) * peak < rate]
        source["seed"] = seed
    else:
        path = _bundled_path(spec) if spec in BUNDLED else Path(spec)
        if spec not in BUNDLED and not path.exists():
            raise UsageError(
                f"--traffic {spec!r} is neither a file nor a spec.",
                f"pass a CSV path, {', '.join(BUNDLED)}, poisson:RATE or diurnal:PEAK,TROUGH.",
            )
        trace_s, trace_n, trace_g = _read_csv(path)
        trace_s = trace_s / scale
        if hours is None:
            period = float(trace_s[-1]) + (
                float(trace_s[-1]) / (trace_s.size - 1) if trace_s.size > 1 else 1.0
            )
            return Arrivals(trace_s, trace_n, period, source, trace_g)
        period = hours * 3600.0
        span = float(trace_s[-1])
        cycle = span + (span / (trace_s.size - 1) if trace_s.size > 1 else max(span, 1.0))
        if not cycle > 0:
            raise UsageError(
                f"every request of the traffic file {path} arrives at the same instant: it has "
                "no rate to repeat over --hours.",
                "leave --hours out (the file's own requests), or give the requests their "
                "arrival times.",
            )
        _check_requests(trace_s.size * period / cycle, spec, scale, period)
        times, tokens, generated = _repeat(trace_s, trace_n, trace_g, period)
        return Arrivals(times, tokens, period, source, generated)
    # One draw per request of the trace's rows (the same draws `rng.choice` of the context
    # tokens alone made, so an encoder's streams are unchanged), its context and generation.
    context, generated = trace_requests()
    row = rng.integers(0, context.size, size=times.size)
    return Arrivals(times, context[row].astype(np.int64), period, source, generated[row])


def generation_arrivals(
    spec: str, *, scale: float = 1.0, hours: float | None = None, seed: int = 0
) -> Arrivals:
    """`load_arrivals` for a decoder's stream: at least one request, each saying how many
    tokens it generates.

    Raises:
        UsageError: What `load_arrivals` raises, or a stream without a request or without
            the tokens each generates.
    """
    arrivals = load_arrivals(spec, scale=scale, hours=hours, seed=seed)
    if arrivals.requests == 0 or arrivals.generated is None:
        raise UsageError(
            f"--traffic {spec} gives no request, or does not say what each generates.",
            "raise --scale or --hours, or pass a stream with GeneratedTokens (azure-conv).",
        )
    return arrivals
