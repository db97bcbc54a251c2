"""Expert-selection predictors: the paper's Bayesian posterior, its variants, and the baselines.

Every predictor is fitted on the profiling part of a trace and predicts, for a batch of requests,
each layer's expert popularity (tokens per expert) and each token's top-k experts. Before
inference only a request's token IDs and positions are known, so that is all the Bayesian and
token methods read from the batch; `lina-path` reads the batch's real experts of the previous
layers, as Lina does at run time while a request moves through the model.

The posterior of eq. (1) with uniform P'(f2) reduces to

    P(i | f1)  ∝  sum over profiled entries (f1, f2, f3, i) of  P'(f3)

where P'(f3) is the frequency of token f3 among the batch's tokens (plus `attention_smoothing`
pseudo-counts, so an attention ID absent from the batch does not erase its entries). The
entries already occur as often as f3 accompanies f1, so the extra P'(f3) counts the attention ID
a second time, favouring contexts whose attention token is frequent ([CLS], "the", "."). On real
MiniLM routing this makes the estimate worse, not better; with P'(f3) uniform the posterior is
that of the token ID alone (`bayes-token-soft`), and the default, `bayes-pos-soft`, conditions on
the position as well. README "Prediction" has the numbers.

Hard or soft counts. MAP (eq. 2) counts every token for its top-k experts, which inflates the
experts a token most often picks and erases the rest: on MiniLM it is off by ~380 tokens per
expert, the soft expected counts (sum of posteriors) by ~50.

Unseen and rare tokens. A token never seen in profiling has no entries; it gets the fallback
prior. The paper's method uses the layer's marginal P(i). The soft variants use the routing of
*rare* profiled tokens (seen at most `rare_max` times) instead: the marginal is dominated by
frequent tokens that route unlike the content words an unseen token most likely is, and on
held-out MiniLM data this alone cuts the popularity error up to sixfold. `smoothing` adds that
many pseudo-entries of the fallback prior to every token, which keeps a token seen once or twice
from voting with full confidence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ground.errors import UsageError, did_you_mean
from predictor._splits import split_windows
from predictor._tables import CountTable, LayerTable, build_tables
from predictor._trace import RoutingTrace

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "BayesPredictor",
    "Method",
    "HistoryPredictor",
    "LinaPathPredictor",
    "LinaTokenPredictor",
    "Prediction",
    "Predictor",
    "make_predictor",
]


@dataclass(frozen=True)
class Prediction:
    """Predicted popularity (L, E) in tokens, each token's predicted top-k (L, N, k), and the
    variance (L, E) of the counts as sums of per-token draws from the predictor's posteriors
    (`predictor._uncertainty` widens it by the model error measured on held-out batches)."""

    counts: np.ndarray
    topk: np.ndarray
    variance: np.ndarray


def _draw_variance(q: np.ndarray, n: np.ndarray | None = None) -> np.ndarray:
    """Variance of the sum of Bernoulli draws with probabilities `q` (rows, E), each row
    occurring `n` times: sum n q (1 - q), q clipped to [0, 1] (k P(i|f) may round above 1)."""
    q = np.clip(q, 0.0, 1.0)
    terms = q * (1.0 - q)
    return terms.sum(axis=0) if n is None else n @ terms


def _top(posterior: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, best first (ties broken by expert index)."""
    return np.argsort(-posterior, axis=1, kind="stable")[:, :k]


def _counts(posterior: np.ndarray, n: np.ndarray, k: float, soft: bool) -> np.ndarray:
    """Popularity from per-unique-token posteriors weighted by how often each token occurs.

    `k` is the entries a token makes: k, or the profiled mean of adaptive routing. Hard: every
    token adds one to each of its MAP top-round(k) experts, scaled so that a token adds k in all.
    Soft: every token adds k times its posterior (a token's entries are distinct experts, so
    k*P(i|f) <= 1 is the chance i is among them).
    """
    experts = posterior.shape[1]
    if soft:
        return k * (n @ posterior)
    whole = max(1, round(k))
    top = _top(posterior, whole)
    weights = np.repeat(n * (k / whole), whole)
    return np.bincount(top.ravel(), weights=weights, minlength=experts).astype(float)


def _normalise(rows: np.ndarray, prior: np.ndarray, smoothing: float) -> np.ndarray:
    """Rows of counts -> probabilities with `smoothing` pseudo-counts on the prior."""
    total = rows.sum(axis=1, keepdims=True)
    out = (rows + smoothing * prior) / np.maximum(total + smoothing, 1e-300)
    out[total[:, 0] + smoothing <= 0] = prior  # unseen and unsmoothed: the layer prior
    return out


class Predictor(ABC):
    """Fitted on profiling data, predicts popularity for batches of requests."""

    name: str = ""

    def fit(self, tables: CountTable, trace: RoutingTrace | None) -> Predictor:
        """Learn from the count tables (and, for path methods, the profiling trace itself)."""
        self.tables = tables
        self.k = int(tables.meta["top_k"])  # the width of a token's routing (its top-k)
        self.experts = int(tables.meta["experts"])
        # entries a token makes per layer: k, or the profiled mean k of adaptive routing
        self.entries = np.array([layer.top_k for layer in tables.layers], dtype=float)
        return self

    @abstractmethod
    def predict(self, batch: RoutingTrace) -> Prediction: ...

    def __str__(self) -> str:
        return self.name


class HistoryPredictor(Predictor):
    """Historical average: every layer's popularity share from profiling, scaled to the batch."""

    name = "history"

    def predict(self, batch: RoutingTrace) -> Prediction:
        n = batch.num_tokens
        priors = np.stack([layer.prior for layer in self.tables.layers])
        top = np.stack([_top(p[None], self.k)[0] for p in priors])
        entries = self.entries[:, None]
        q = np.clip(entries * priors, 0.0, 1.0)
        return Prediction(
            n * entries * priors, np.repeat(top[:, None, :], n, axis=1), n * q * (1.0 - q)
        )


class BayesPredictor(Predictor):
    """The posterior of the paper's eq. (1), with hard (MAP, eq. 2) or soft (expected) counts.

    Args:
        soft: Sum posteriors (expected counts) instead of counting MAP top-k picks.
        smoothing: Dirichlet pseudo-entries on the fallback prior. Defaults to 0 (the paper).
        rare_max: Fall back to the routing of tokens seen at most this many times; None falls
            back to the layer's marginal P(i) (the paper).
        use_attention: Weight entries by P'(f3); False makes P'(f3) uniform, i.e. token only.
        attention_smoothing: Pseudo-counts added to each token's frequency in P'(f3).
        use_position: Condition on position too, P(i | f1, f2), backing off to P(i | f1) with
            `smoothing` pseudo-entries (positions are known before inference).
    """

    def __init__(
        self,
        *,
        name: str,
        soft: bool,
        smoothing: float = 0.0,
        rare_max: int | None = None,
        use_attention: bool = True,
        attention_smoothing: float = 1.0,
        use_position: bool = False,
    ) -> None:
        self.name = name
        self.soft = soft
        self.smoothing = smoothing
        self.rare_max = rare_max
        self.use_attention = use_attention
        self.attention_smoothing = attention_smoothing
        self.use_position = use_position

    def fit(self, tables: CountTable, trace: RoutingTrace | None) -> Predictor:
        super().fit(tables, trace)
        # Everything derived from the tables alone belongs to profiling time, not prediction.
        self.fallback = []
        for layer in tables.layers:
            _ = layer.token_expert
            if self.use_attention:
                _ = layer.by_token_attention
            if self.use_position:
                _ = layer.by_token_position
            prior = layer.prior if self.rare_max is None else layer.rare_prior(self.rare_max)
            self.fallback.append(prior)
        return self

    def _token_posterior(
        self, layer: LayerTable, prior: np.ndarray, unique: np.ndarray, p_attention: np.ndarray
    ) -> np.ndarray:
        seen = layer.token_expert[unique]
        if not self.use_attention:
            return _normalise(seen, prior, self.smoothing)
        row, f3, count = layer.by_token_attention
        weighted = np.bincount(
            row, weights=count * p_attention[f3], minlength=layer.vocab * layer.experts
        ).reshape(layer.vocab, layer.experts)[unique]
        # Rescale each token's weighted counts to its number of profiled entries, so that the
        # Dirichlet smoothing weighs evidence, not the scale of P'(f3).
        entries = seen.sum(axis=1, keepdims=True)
        total = weighted.sum(axis=1, keepdims=True)
        scaled = np.where(total > 0, weighted * entries / np.maximum(total, 1e-300), seen)
        return _normalise(scaled, prior, self.smoothing)

    def posteriors(self, batch: RoutingTrace) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """P(i | features) for each distinct feature value of the batch, per layer.

        Returns:
            (inverse, n, posteriors): the feature row of each token, how many tokens share each
            row, and per layer a (rows, E) array of posteriors.
        """
        tokens = batch.token_ids.astype(np.int64)
        vocab = int(self.tables.meta["vocab_size"])
        freq = np.bincount(tokens, minlength=vocab) + self.attention_smoothing
        p_attention = freq / freq.sum()
        positions = int(self.tables.meta["positions"])
        feature = tokens * positions + batch.position_ids if self.use_position else tokens
        unique, inverse, n = np.unique(feature, return_inverse=True, return_counts=True)
        unique_tokens = unique // positions if self.use_position else unique
        posteriors = []
        for layer, prior in zip(self.tables.layers, self.fallback, strict=True):
            posterior = self._token_posterior(layer, prior, unique_tokens, p_attention)
            if self.use_position:
                posterior = self._with_position(layer, unique, posterior)
            posteriors.append(posterior)
        return inverse, n, posteriors

    def predict(self, batch: RoutingTrace) -> Prediction:
        inverse, n, posteriors = self.posteriors(batch)
        weights = n.astype(float)
        counts = [
            _counts(p, weights, k, soft=self.soft)
            for p, k in zip(posteriors, self.entries, strict=True)
        ]
        tops = [_top(p, self.k)[inverse] for p in posteriors]
        variance = [
            _draw_variance(k * p, weights) for p, k in zip(posteriors, self.entries, strict=True)
        ]
        return Prediction(np.stack(counts), np.stack(tops), np.stack(variance))

    def _with_position(
        self, layer: LayerTable, unique: np.ndarray, backoff: np.ndarray
    ) -> np.ndarray:
        """P(i | f1, f2): (token, position) counts with `smoothing` entries on P(i | f1)."""
        return position_posterior(position_rows(layer, unique), backoff, self.smoothing)


def position_rows(layer: LayerTable, features: np.ndarray) -> np.ndarray:
    """(n, E) profiled counts of each packed (token, position) feature; 0 for unseen ones."""
    keys, table = layer.by_token_position
    lookup = np.minimum(np.searchsorted(keys, features), keys.size - 1)
    return np.where((keys[lookup] == features)[:, None], table[lookup], 0.0)


def position_posterior(rows: np.ndarray, backoff: np.ndarray, smoothing: float) -> np.ndarray:
    """P(i | f1, f2) from (token, position) counts with max(smoothing, 1) entries on P(i | f1)."""
    weight = max(smoothing, 1.0)
    return (rows + weight * backoff) / (rows.sum(axis=1, keepdims=True) + weight)


class LinaTokenPredictor(BayesPredictor):
    """Lina as the core paper uses it: MAP of P*(i | token ID) from profiled counts.

    The posterior of eq. (1) with the attention and position IDs dropped, no smoothing, the
    layer's marginal for unseen tokens, and hard top-k counts.
    """

    def __init__(self) -> None:
        super().__init__(name="lina-token", soft=False, use_attention=False)


class LinaPathPredictor(Predictor):
    """Lina as its thesis describes it: the experts a token chose in the previous l layers.

    For layer i the feature is the top-1 experts of layers i-l..i-1 (fewer for the first layers;
    layer 0 has none and uses the prior). Each token keeps the top-k entries of its path's
    distribution with their probabilities, and popularity is their sum (the thesis's
    pop(e) = sum_t P(e) / N_t, times N_t). Unseen paths back off to shorter paths.
    """

    name = "lina-path"

    def __init__(self, *, path_length: int = 3) -> None:
        self.path_length = path_length

    def fit(self, tables: CountTable, trace: RoutingTrace | None) -> Predictor:
        super().fit(tables, trace)
        if trace is None:
            raise UsageError(
                "lina-path learns from the profiling trace itself, not from saved count tables.",
                "leave lina-path out of --methods when predicting with --tables.",
            )
        e = self.experts
        self.psi: list[list[np.ndarray]] = []  # psi[layer][length] -> (E**length, E) counts
        for layer in range(trace.num_layers):
            by_length = []
            for length in range(min(self.path_length, layer) + 1):
                path = self._paths(trace, layer, length)
                routed = trace.experts[layer]
                entries = (path[:, None] * e + routed)[routed < e]  # adaptive: unused slots out
                table = np.bincount(entries, minlength=e**length * e).reshape(e**length, e)
                by_length.append(table.astype(float))
            self.psi.append(by_length)
        return self

    def _paths(self, trace: RoutingTrace, layer: int, length: int) -> np.ndarray:
        path = np.zeros(trace.num_tokens, dtype=np.int64)
        for previous in range(layer - length, layer):
            path = path * self.experts + trace.experts[previous, :, 0]
        return path

    def predict(self, batch: RoutingTrace) -> Prediction:
        n = batch.num_tokens
        counts, tops, variance = [], [], []
        for layer, by_length in enumerate(self.psi):
            k = self.entries[layer]
            dist = np.zeros((n, self.experts))
            found = np.zeros(n, dtype=bool)
            for length in range(len(by_length) - 1, -1, -1):
                rows = by_length[length][self._paths(batch, layer, length)]
                total = rows.sum(axis=1)
                use = ~found & (total > 0)
                dist[use] = rows[use] / (total[use, None] / k)  # Psi sums to k per path
                found |= use
            top = _top(dist, self.k)
            kept = np.take_along_axis(dist, top, axis=1)
            counts.append(np.bincount(top.ravel(), weights=kept.ravel(), minlength=self.experts))
            tops.append(top)
            variance.append(_draw_variance(dist))
        return Prediction(np.stack(counts), np.stack(tops), np.stack(variance))


DEFAULT_METHOD = (
    "bayes-pos-soft"  # lowest mean held-out error over 8 settings; README "Prediction"
)


@dataclass(frozen=True)
class Method:
    """A named predictor configuration: what `moelambda predict` lists and evaluates."""

    description: str
    make: Callable[[], Predictor]


def _bayes(name: str, **options: Any) -> Callable[[], Predictor]:
    return lambda: BayesPredictor(name=name, **options)


METHODS: dict[str, Method] = {
    "bayes": Method(
        "the paper's eq. (1)-(2): MAP top-k from token and attention ID; unseen tokens get the "
        "layer prior",
        _bayes("bayes", soft=False),
    ),
    "bayes-soft": Method(
        "eq. (1) posterior summed as expected counts; rare-token prior for unseen tokens",
        _bayes("bayes-soft", soft=True, smoothing=0.5, rare_max=2),
    ),
    "bayes-pos-soft": Method(
        "bayes-token-soft also conditioned on position ID, backing off to token ID",
        _bayes(
            "bayes-pos-soft",
            soft=True,
            smoothing=0.5,
            rare_max=2,
            use_attention=False,
            use_position=True,
        ),
    ),
    "bayes-token-soft": Method(
        "bayes-soft with uniform P'(f3), i.e. the posterior from token ID alone",
        _bayes("bayes-token-soft", soft=True, smoothing=0.5, rare_max=2, use_attention=False),
    ),
    "lina-token": Method(
        "Lina as the core paper uses it: MAP top-k from token ID only", LinaTokenPredictor
    ),
    "lina-path": Method(
        "Lina's thesis: the token's top-1 experts in the previous 3 layers", LinaPathPredictor
    ),
    "history": Method("historical average popularity share of each expert", HistoryPredictor),
}


def make_predictor(name: str) -> Predictor:
    """A fresh, unfitted predictor of the method called `name`.

    Raises:
        UsageError: No method has that name.
    """
    if name not in METHODS:
        raise UsageError(
            f"there is no prediction method '{name}'.{did_you_mean(name, METHODS)}",
            f"choose one of: {', '.join(METHODS)}.",
        )
    return METHODS[name].make()


def predict_batch(trace: RoutingTrace, tokens: int, *, seed: int = 0) -> tuple[np.ndarray, int]:
    """(L, E) counts the default predictor expects for a batch of `tokens` tokens, and the size
    of the held-out batch they were predicted on (whole windows, profiled on the rest).

    What `moelambda plan --traces` plans for: the predictor fitted on the trace's other windows
    predicts a held-out batch of the planned size, scaled to exactly `tokens`.
    """
    window = int(trace.meta.get("window", 128))
    batch = max(window, tokens // window * window)
    if batch >= trace.num_tokens:
        most = max(trace.num_tokens - window, 0)
        raise UsageError(
            f"--tokens {tokens:,}: the predictor needs windows of the trace ({trace.num_tokens:,} "
            "tokens) to fit on beside the batch it predicts.",
            f"pass --tokens {most:,} or less, or profile more tokens (`moelambda profile "
            "--tokens`).",
        )
    split = split_windows(trace, eval_tokens=batch, repeats=1, seed=seed)[0]
    predictor = make_predictor(DEFAULT_METHOD).fit(build_tables(split.profile), split.profile)
    return predictor.predict(split.held_out).counts * tokens / batch, batch
