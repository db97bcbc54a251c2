"""Count tables: per MoE layer, the key-value table (token ID, position ID, attention ID, expert)
-> count of the paper's section III-B, built from routing traces with vectorised numpy.

A key packs the four features into one int64, ``((f1 * P + f2) * V + f3) * E + e``, so building a
layer's table is one sort of the trace's (token, expert) entries plus a run-length count: about
0.04 s per million entries. Keys stay sorted, which makes tables cheap to merge and to save.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import TraceError
from ground.files import write_atomically
from ground.kinds import refuse_other_kind
from predictor._trace import RoutingTrace

__all__ = ["TABLE_FILE", "TABLE_VERSION", "CountTable", "LayerTable", "build_tables"]

TABLE_VERSION = 1
TABLE_FILE = "tables.npz"


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Omega of one layer: sorted unique packed keys and their counts, with decoded views."""

    keys: np.ndarray  # (n,) int64, sorted, unique
    counts: np.ndarray  # (n,) int64
    vocab: int
    positions: int
    experts: int
    top_k: float  # entries per token: k, or the mean k of adaptive routing

    @cached_property
    def expert(self) -> np.ndarray:
        return (self.keys % self.experts).astype(np.int64)

    @cached_property
    def attention(self) -> np.ndarray:
        return (self.keys // self.experts) % self.vocab

    @cached_property
    def position(self) -> np.ndarray:
        return (self.keys // (self.experts * self.vocab)) % self.positions

    @cached_property
    def token(self) -> np.ndarray:
        return self.keys // (self.experts * self.vocab * self.positions)

    @cached_property
    def token_expert(self) -> np.ndarray:
        """(V, E) counts summed over position and attention ID: what token-only methods read."""
        flat = np.bincount(
            self.token * self.experts + self.expert,
            weights=self.counts,
            minlength=self.vocab * self.experts,
        )
        return flat.reshape(self.vocab, self.experts)

    @cached_property
    def prior(self) -> np.ndarray:
        """(E,) share of routing entries per expert: the layer's marginal P(i)."""
        per_expert = np.bincount(self.expert, weights=self.counts, minlength=self.experts)
        return per_expert / max(per_expert.sum(), 1.0)

    def rare_prior(self, max_occurrences: int) -> np.ndarray:
        """(E,) routing of tokens seen at most `max_occurrences` times in profiling.

        The prior for unseen and rare tokens. The overall marginal is dominated by frequent
        tokens ("the", punctuation, [CLS]), which route differently from the rare content tokens
        an unseen token most resembles (the Good-Turing idea).
        """
        rows = self.token_expert
        occurrences = rows.sum(axis=1) / self.top_k
        rare = rows[(occurrences > 0) & (occurrences <= max_occurrences)].sum(axis=0)
        return rare / rare.sum() if rare.sum() > 0 else self.prior

    @cached_property
    def by_token_position(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts summed over attention ID: sorted keys f1*P+f2 and their (m, E) count rows."""
        pair = self.token * self.positions + self.position
        keys, row = np.unique(pair, return_inverse=True)
        rows = np.bincount(
            row * self.experts + self.expert,
            weights=self.counts,
            minlength=keys.size * self.experts,
        )
        return keys, rows.reshape(keys.size, self.experts)

    @cached_property
    def by_token_attention(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries summed over position (uniform P'(f2) marginalises it): (f1*E+e, f3, count)."""
        packed = (self.token * self.vocab + self.attention) * self.experts + self.expert
        order = np.argsort(packed, kind="stable")
        packed = packed[order]
        starts = np.flatnonzero(np.r_[True, packed[1:] != packed[:-1]])
        counts = np.add.reduceat(self.counts[order], starts)
        unique = packed[starts]
        row = (unique // (self.vocab * self.experts)) * self.experts + unique % self.experts
        return row, (unique // self.experts) % self.vocab, counts


def _count_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ordered = np.sort(keys)
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    counts = np.diff(np.r_[starts, ordered.size])
    return ordered[starts], counts


def build_tables(trace: RoutingTrace, *, positions: int | None = None) -> CountTable:
    """Count every (token, position, attention, expert) of `trace`, one table per layer."""
    vocab = int(trace.meta["vocab_size"])
    positions = positions or int(trace.meta.get("window", int(trace.position_ids.max()) + 1))
    experts = trace.num_experts
    k = trace.top_k
    entries = trace.entries_per_token()
    base = (trace.token_ids.astype(np.int64) * positions + trace.position_ids) * vocab
    layers = []
    for layer in range(trace.num_layers):
        token_part = (base + trace.attention_ids[layer]) * experts
        routed = trace.experts[layer]
        keys = (token_part[:, None] + routed)[routed < experts]  # adaptive: unused slots out
        unique, counts = _count_keys(keys)
        layers.append(LayerTable(unique, counts, vocab, positions, experts, float(entries[layer])))
    meta = {
        "format_version": TABLE_VERSION,
        "model": trace.meta["model"],
        "experts": experts,
        "top_k": k,
        "entries_per_token": [round(float(e), 6) for e in entries],
        "layers": trace.num_layers,
        "vocab_size": vocab,
        "positions": positions,
        "tokens": trace.num_tokens,
    }
    return CountTable(meta, layers)


@dataclass(frozen=True)
class CountTable:
    """Omega for every MoE layer of one model, E and k (recorded in `meta`)."""

    meta: dict[str, Any]
    layers: list[LayerTable]

    def check_matches(self, trace: RoutingTrace) -> None:
        """Refuse to mix tables and traces of different models, E or k."""
        for key in ("model", "experts", "top_k", "layers", "vocab_size"):
            ours, theirs = self.meta[key], trace.meta.get(key)
            if ours != theirs:
                raise TraceError(
                    f"the count table was built for {key} = {ours}, but the trace has {theirs}.",
                    "profile with the same model, --experts and --top-k as the table, or "
                    "rebuild the table from matching traces.",
                )

    def save(self, directory: str | Path, *, force: bool = False) -> Path:
        def write(tmp: Path) -> None:
            arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(self.meta))}
            for i, layer in enumerate(self.layers):
                arrays[f"keys_{i}"] = layer.keys
                arrays[f"counts_{i}"] = layer.counts.astype(np.int32)
            np.savez(tmp / TABLE_FILE, **arrays)

        write_atomically(Path(directory), write, force=force)
        return Path(directory) / TABLE_FILE

    @classmethod
    def load(cls, directory: str | Path) -> CountTable:
        refuse_other_kind(directory, "tables", "--tables")
        path = Path(directory)
        if path.is_dir():
            path = path / TABLE_FILE
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.get("format_version") != TABLE_VERSION:
                    raise TraceError(
                        f"'{path}' has table format version {meta.get('format_version')}; this "
                        f"moelambda reads version {TABLE_VERSION}.",
                        "rebuild the table from the traces with this version.",
                    )
                layers = [
                    LayerTable(
                        data[f"keys_{i}"],
                        data[f"counts_{i}"].astype(np.int64),
                        meta["vocab_size"],
                        meta["positions"],
                        meta["experts"],
                        meta.get("entries_per_token", [meta["top_k"]] * meta["layers"])[i],
                    )
                    for i in range(meta["layers"])
                ]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
            raise TraceError(
                f"'{path}' is not a readable count table: {err}.",
                "rebuild it with `moelambda predict --tables-out DIR`.",
            ) from err
        return cls(meta, layers)
