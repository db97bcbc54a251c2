"""Key-value pairs written into the count table Omega, and a batch's prediction as their function.

Bayesian optimisation (serverless-model.md §8) tunes the predictor by overwriting Q entries of
Omega. A key here is (layer, token ID, position ID, expert): the token-only and position-aware
posteriors read Omega summed over the attention ID, so that is the resolution at which a value
changes a prediction; a dimension the predictor ignores would only waste the search (for the same
reason a token-only predictor's keys have position 0). A value is the key's count, summed over
attention IDs, and 0 deletes the key.

`AdjustableBatch` prepares one batch once (its distinct features and their profiled rows) so that
predicting it under any adjustment touches only the batch's own rows: about a millisecond for
10,240 tokens, which is what lets a BO iteration take well under a second. With no adjustment it
equals `BayesPredictor.predict`; the fallback prior for unseen and rare tokens stays the one of
the profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ground.errors import UsageError
from predictor._methods import (
    BayesPredictor,
    Predictor,
    _counts,
    _normalise,
    position_posterior,
    position_rows,
)
from predictor._trace import RoutingTrace

__all__ = ["AdjustableBatch", "Adjustment", "KeySpace"]


@dataclass(frozen=True)
class KeySpace:
    """All keys (layer, token, position, expert) of one model's Omega, packed into one int64."""

    layers: int
    vocab: int
    positions: int
    experts: int

    @property
    def size(self) -> int:
        return self.layers * self.vocab * self.positions * self.experts

    def pack(
        self, layer: np.ndarray, token: np.ndarray, position: np.ndarray, expert: np.ndarray
    ) -> np.ndarray:
        layer, token, position, expert = (
            np.asarray(a, dtype=np.int64) for a in (layer, token, position, expert)
        )
        return ((layer * self.vocab + token) * self.positions + position) * self.experts + expert

    def unpack(self, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        keys = np.asarray(keys, dtype=np.int64)
        expert = keys % self.experts
        position = (keys // self.experts) % self.positions
        token = (keys // (self.experts * self.positions)) % self.vocab
        layer = keys // (self.experts * self.positions * self.vocab)
        return layer, token, position, expert


@dataclass(frozen=True)
class Adjustment:
    """Q key-value pairs to write into Omega: packed keys of a `KeySpace` and their counts.

    When a key occurs more than once, the last pair wins (the order a table is written in).
    """

    keys: np.ndarray  # (Q,) int64
    values: np.ndarray  # (Q,) counts >= 0

    @classmethod
    def empty(cls) -> Adjustment:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0))

    def __len__(self) -> int:
        return int(self.keys.size)

    def last_wins(self) -> Adjustment:
        """The same writes with duplicate keys resolved to their last value."""
        reversed_keys = self.keys[::-1]
        _, first = np.unique(reversed_keys, return_index=True)
        keep = self.keys.size - 1 - first
        return Adjustment(self.keys[keep], np.asarray(self.values, dtype=float)[keep])


class AdjustableBatch:
    """One batch's predicted counts under any adjustment of a fitted Bayesian predictor's Omega.

    Args:
        predictor: A fitted `BayesPredictor` that ignores the attention ID (bayes-token-soft,
            bayes-pos-soft, or their hard-count forms).
        batch: The requests to predict (only token and position IDs are read).

    Raises:
        UsageError: The predictor reads the attention ID, or is not a Bayesian one.
    """

    def __init__(self, predictor: Predictor, batch: RoutingTrace) -> None:
        if not isinstance(predictor, BayesPredictor) or predictor.use_attention:
            raise UsageError(
                f"the predictor '{predictor}' cannot be tuned by Bayesian optimisation: it must "
                "be a Bayesian predictor that ignores the attention ID.",
                "tune bayes-pos-soft (the default) or bayes-token-soft.",
            )
        self.predictor = predictor
        tables = predictor.tables
        # A token-only predictor reads no position: its keys all have position 0.
        positions = int(tables.meta["positions"]) if predictor.use_position else 1
        self.space = KeySpace(
            len(tables.layers), int(tables.meta["vocab_size"]), positions, predictor.experts
        )
        tokens = batch.token_ids.astype(np.int64)
        features = tokens * positions + (batch.position_ids if predictor.use_position else 0)
        self.features, self.n = np.unique(features, return_counts=True)
        self.tokens, self.token_of_feature = np.unique(
            self.features // self.space.positions, return_inverse=True
        )
        self.token_rows = [layer.token_expert[self.tokens] for layer in tables.layers]
        self.feature_rows = (
            [position_rows(layer, self.features) for layer in tables.layers]
            if predictor.use_position
            else []
        )
        self._full_token_rows = [layer.token_expert for layer in tables.layers]
        self._full_tables = tables.layers

    def current_values(self, keys: np.ndarray) -> np.ndarray:
        """The counts Omega holds now for packed `keys` (summed over attention IDs)."""
        layer, token, position, expert = self.space.unpack(keys)
        values = np.zeros(keys.size)
        for i, table in enumerate(self._full_tables):
            mine = layer == i
            if not mine.any():
                continue
            if self.predictor.use_position:
                feature = token[mine] * self.space.positions + position[mine]
                rows = position_rows(table, feature)
            else:
                rows = self._full_token_rows[i][token[mine]]
            values[mine] = rows[np.arange(rows.shape[0]), expert[mine]]
        return values

    def counts(self, adjustment: Adjustment | None = None) -> np.ndarray:
        """(L, E) predicted tokens per expert with `adjustment` written into Omega."""
        p = self.predictor
        adjustment = (adjustment or Adjustment.empty()).last_wins()
        layer, token, position, expert = self.space.unpack(adjustment.keys)
        delta = adjustment.values - self.current_values(adjustment.keys)
        out = []
        for i in range(self.space.layers):
            token_rows = self.token_rows[i]
            mine = (layer == i) & (delta != 0)
            if mine.any():
                token_rows = token_rows.copy()
                where = np.minimum(np.searchsorted(self.tokens, token[mine]), self.tokens.size - 1)
                hit = self.tokens[where] == token[mine]
                np.add.at(token_rows, (where[hit], expert[mine][hit]), delta[mine][hit])
            backoff = _normalise(token_rows, p.fallback[i], p.smoothing)[self.token_of_feature]
            if p.use_position:
                rows = self.feature_rows[i]
                if mine.any():
                    rows = rows.copy()
                    feature = token[mine] * self.space.positions + position[mine]
                    where = np.minimum(
                        np.searchsorted(self.features, feature), self.features.size - 1
                    )
                    hit = self.features[where] == feature
                    np.add.at(rows, (where[hit], expert[mine][hit]), delta[mine][hit])
                posterior = position_posterior(rows, backoff, p.smoothing)
            else:
                posterior = backoff
            out.append(_counts(posterior, self.n.astype(float), p.entries[i], soft=p.soft))
        return np.stack(out)
