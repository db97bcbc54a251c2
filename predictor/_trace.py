"""Routing traces: which experts every token picked in every MoE layer, with its features.

One file, `trace.npz` in the trace directory, holds flat numpy arrays plus a JSON metadata string
(format version, model, E, k, corpus, seed, window). Per token (N tokens) and MoE layer (L):

    token_ids      (N,)       int32    token ID (feature f1)
    position_ids   (N,)       int16    position in its window (f2)
    window_ids     (N,)       int32    which window (request) the token came from
    attention_ids  (L, N)     int32    token ID of the most-attended key in that layer (f3)
    experts        (L, N, k)  uint8    top-k experts (adaptive k: unused slots hold E)
    probs          (L, N, k)  float16  their gate probabilities (0 in unused slots)

About 12 + 7k bytes per token and layer: 10,240 tokens of a 6-layer top-2 model take 1.3 MB.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import TraceError
from ground.files import write_atomically
from ground.kinds import refuse_other_kind

__all__ = ["TRACE_FILE", "TRACE_VERSION", "RoutingTrace"]

TRACE_VERSION = 1
TRACE_FILE = "trace.npz"
_ARRAYS = ("token_ids", "position_ids", "window_ids", "attention_ids", "experts", "probs")


@dataclass(frozen=True)
class RoutingTrace:
    """Routing of N tokens through L MoE layers, and where they came from (`meta`)."""

    meta: dict[str, Any]
    token_ids: np.ndarray
    position_ids: np.ndarray
    window_ids: np.ndarray
    attention_ids: np.ndarray
    experts: np.ndarray
    probs: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.meta["experts"])

    @property
    def top_k(self) -> int:
        return int(self.experts.shape[2])

    def take(self, index: np.ndarray) -> RoutingTrace:
        """The tokens at `index` (integer indices or a boolean mask), in that order."""
        token_ids = self.token_ids[index]
        return RoutingTrace(
            meta={**self.meta, "tokens": int(token_ids.shape[0])},
            token_ids=token_ids,
            position_ids=self.position_ids[index],
            window_ids=self.window_ids[index],
            attention_ids=self.attention_ids[:, index],
            experts=self.experts[:, index],
            probs=self.probs[:, index],
        )

    def select_windows(self, windows: np.ndarray) -> RoutingTrace:
        """The tokens of the given windows (requests) only, in trace order."""
        return self.take(np.isin(self.window_ids, windows))

    def popularity(self) -> np.ndarray:
        """(L, E) tokens routed to each expert; a token counts once for each of its experts."""
        layers, n, k = self.experts.shape
        slots = self.num_experts + 1  # the last column counts adaptive routing's unused slots
        offsets = (np.arange(layers, dtype=np.int64) * slots)[:, None]
        flat = (self.experts.reshape(layers, n * k).astype(np.int64) + offsets).ravel()
        counts = np.bincount(flat, minlength=layers * slots)
        return counts.reshape(layers, slots)[:, :-1]

    def entries_per_token(self) -> np.ndarray:
        """(L,) mean experts a token takes per layer: k, or less with adaptive routing."""
        if self.num_tokens == 0:
            return np.full(self.num_layers, float(self.top_k))
        return (self.experts < self.num_experts).sum(axis=2).mean(axis=1)

    def save(self, directory: str | Path, *, force: bool = False) -> Path:
        """Write `trace.npz` into `directory` atomically; refuse to overwrite unless `force`."""

        def write(tmp: Path) -> None:
            arrays = {name: getattr(self, name) for name in _ARRAYS}
            np.savez(tmp / TRACE_FILE, meta=np.array(json.dumps(self.meta)), **arrays)

        write_atomically(Path(directory), write, force=force)
        return Path(directory) / TRACE_FILE

    @classmethod
    def load(cls, directory: str | Path) -> RoutingTrace:
        """Read a trace directory (or the `trace.npz` file itself).

        Raises:
            TraceError: The file is missing, not a trace, or of another format version.
            UsageError: The path is another kind of file (a plan, counts, ...).
        """
        refuse_other_kind(directory, "trace", "--traces")
        path = Path(directory)
        if path.is_dir():
            path = path / TRACE_FILE
        if not path.is_file():
            raise TraceError(
                f"no routing trace at '{directory}' ({TRACE_FILE} is missing).",
                "record one with `moelambda profile --out DIR` and pass that DIR.",
            )
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                arrays = {name: data[name] for name in _ARRAYS}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
            raise TraceError(
                f"'{path}' is not a readable routing trace: {err}.",
                "record the trace again with `moelambda profile`.",
            ) from err
        if meta.get("format_version") != TRACE_VERSION:
            raise TraceError(
                f"'{path}' has trace format version {meta.get('format_version')}; this moelambda "
                f"reads version {TRACE_VERSION}.",
                "record the trace again with this version of moelambda.",
            )
        return cls(meta=meta, **arrays)
