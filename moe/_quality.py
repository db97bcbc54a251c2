"""How far the served MoE model is from the dense model the user brought, on held-out text.

Every bill and latency moelambda reports is of the MoE model; this module says what that model
is worth against the user's own. Both models run the same windows of real text that nothing was
fitted or chosen on (the corpus's test part, `moe._corpus.partition`: the same documents for
every seed, so no seed is judged on text another seed fitted on), and the task outputs are
compared:

* encoders (sentence embeddings): cosine of each window's embedding to the dense one (mean, 5th
  percentile, minimum) and ``neighbour_overlap_10``, the mean share of each window's 10 nearest
  neighbours (by cosine, among the other windows) that are also its neighbours under the dense
  model: what a search or clustering system built on the embeddings would notice;
* decoders (next-token logits): perplexity of both models on the windows, their ratio, the share
  of positions where both predict the same next token, and the mean KL divergence
  KL(dense || MoE) of the next-token distributions;
* both: ``expert_flops_share``, the FFN FLOPs a token really spends (shared expert plus the
  experts it is routed to, with its own k) over the dense FFN's, averaged over layers and
  tokens. Every neuron costs the same (its input row(s) and output column), so this is a ratio
  of neuron counts; the gate and the correction biases (E + 2 vectors of h) are left out.

The dense model is the user's own FFN weights run through the same stage modules
(`DenseRunner`), so the comparison holds whatever MoEfication changed, corrections included.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from moe._experts import expert_ffn

if TYPE_CHECKING:
    from moe._corpus import Corpus
    from moe._families import Family
    from moe._moe_model import LayerRouting, MoEModel

__all__ = [
    "QUALITY_TOKENS",
    "QUALITY_WINDOW",
    "check_held_out",
    "check_quality_size",
    "DenseRunner",
    "Quality",
    "dense_reference",
    "flops_share",
    "measure_quality",
    "native_model_error",
    "quality_of",
]

QUALITY_TOKENS = 16384
QUALITY_WINDOW = 64
NEIGHBOURS = 10


class Quality(BaseModel):
    """The served model against the dense one on held-out windows (None: not this kind)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["encoder", "decoder"]
    corpus: str
    # The judged text's documents (`Corpus.sha256`); None in blocks written before.
    corpus_sha256: str | None = None
    # The text the model was fitted on (`MoefyOptions.fit_corpus`) and its hash: the same as
    # the judged text when the user's own corpus was fitted and judged on its held-out part.
    fit_corpus: str | None = None
    fit_corpus_sha256: str | None = None
    # Documents and tokens of the fit text's parts (`moe._corpus.part_sizes`), at conversion.
    fit_parts: dict[str, dict[str, int]] | None = None
    # Which text of `corpus` was compared: its test part, its validation part (where `choose`
    # decides), or the whole corpus (blocks written before the corpus had parts).
    split: Literal["test", "validation", "profile"] = "profile"
    tokens: int
    windows: int
    window: int
    seed: int
    expert_flops_share: float
    flops_share_per_layer: list[float]
    cosine_mean: float | None = None
    cosine_p05: float | None = None
    cosine_min: float | None = None
    neighbour_overlap_10: float | None = None
    perplexity_dense: float | None = None
    perplexity_moe: float | None = None
    ppl_ratio: float | None = None
    next_token_agreement: float | None = None
    kl_mean: float | None = None
    # A distilled model's step kept on the validation part (`moe._distil`), and the text it
    # saw: distinct windows of the fit part and epochs over them (`distil_exposure`).
    distil_kept_step: int | None = None
    distil_text: dict[str, int | float] | None = None
    # What converting the model cost where it was converted (`moe._meter`): wall seconds (those
    # before a resume included) and the process's peak resident memory; None in blocks
    # written before conversions were metered.
    convert_s: float | None = None
    convert_peak_rss_mib: float | None = None
    # The precision of the judged model's weights (`ground.precision`): the float32 model
    # unless `--weights` asked for another.
    weights: str = "fp32"
    wall_s: float = 0.0

    @property
    def judged_on_fit_text(self) -> bool:
        """True when the model is judged on the held-out part of the text it was fitted on
        (False also when the block does not say where it was fitted)."""
        return self.fit_corpus_sha256 is not None and self.fit_corpus_sha256 == self.corpus_sha256

    def where(self) -> str:
        """Where the model was fitted and judged: a sentence for reports."""
        judged = f"the {self.split} part of '{self.corpus}'"
        if self.fit_corpus is None:
            return f"Judged on {judged}."
        if self.judged_on_fit_text:
            return (
                f"Fitted on the fit part of '{self.fit_corpus}', judged on its {self.split} "
                "part (documents no fit or choice read)."
            )
        return (
            f"Fitted on '{self.fit_corpus}', judged on {judged}: not the text the model was "
            "fitted on (--fit-corpus fits it on the text you judge it on)."
        )

    def headline(self) -> str:
        """One line for reports."""
        share = f"FFN FLOPs {self.expert_flops_share:.0%} of dense"
        if self.kind == "encoder":
            return (
                f"cosine to dense {self.cosine_mean:.3f} (p5 {self.cosine_p05:.3f}), "
                f"{self.neighbour_overlap_10:.0%} of 10 nearest neighbours kept, {share}"
            )
        return (
            f"perplexity {self.perplexity_moe:.2f} vs dense {self.perplexity_dense:.2f} "
            f"(x{self.ppl_ratio:.3f}), next token as dense {self.next_token_agreement:.0%}, "
            f"{share}"
        )


class DenseRunner:
    """The user's dense model, run through the same stage modules as the MoE model."""

    def __init__(self, family: Family, parts: dict[str, Any]) -> None:
        self.family = family
        self.parts = parts
        self.ffns = [family.dense_ffn(m) for m in parts["ffns"]]

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The last hidden states (the task head's input)."""
        hidden = self.parts["head"](input_ids)
        for layer, ffn in enumerate(self.ffns):
            out = self.parts["blocks"][layer](hidden)
            y = expert_ffn(out.ffn_in, ffn.w_in, ffn.b_in, ffn.w_out, ffn.kind, ffn.act)
            hidden = self.parts["combines"][layer](out.residual, y)
        return hidden

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.parts["tail"](self.hidden(input_ids))


def dense_reference(model: str) -> DenseRunner:
    """Load the dense model `model` names (the source a MoEfied model was made from)."""
    from moe._families import family_for
    from moe._hf import load_hf
    from moe._registry import resolve_model

    hf, _ = load_hf(resolve_model(model))
    family = family_for(hf)
    return DenseRunner(family, family.parts_from_hf(hf))


def flops_share(model: MoEModel, routing: list[LayerRouting]) -> list[float]:
    """Per layer: FFN neurons a token really runs (shared + routed) over the dense FFN's."""
    shares = []
    for layer, route in enumerate(routing):
        bank = model.banks[layer]
        expert_width = bank.expert_width
        shared = model.shared_expert(layer)
        shared_width = 0 if shared is None else shared.width
        dense_width = bank.num_experts * expert_width + shared_width
        per_token = (route.experts < bank.num_experts).sum(dim=1).double().mean().item()
        shares.append((shared_width + per_token * expert_width) / dense_width)
    return shares


def _neighbour_overlap(dense: torch.Tensor, moe: torch.Tensor, k: int) -> float:
    """Mean share of each row's k nearest rows (cosine, itself excluded) kept by the MoE."""
    k = min(k, dense.shape[0] - 1)
    if k < 1:
        return 1.0

    def nearest(x: torch.Tensor) -> np.ndarray:
        unit = torch.nn.functional.normalize(x.double(), dim=-1)
        sims = unit @ unit.T
        sims.fill_diagonal_(-torch.inf)
        return sims.topk(k, dim=1).indices.numpy()

    a, b = nearest(dense), nearest(moe)
    same = (a[:, :, None] == b[:, None, :]).any(axis=2)
    return float(same.mean())


@torch.inference_mode()
def measure_quality(
    model: MoEModel,
    dense: DenseRunner,
    corpus: Corpus,
    *,
    tokens: int = QUALITY_TOKENS,
    window: int = QUALITY_WINDOW,
    seed: int | None = None,
    batch: int = 32,
    split: Literal["test", "validation"] = "test",
) -> Quality:
    """Compare `model` with `dense` on `tokens` held-out tokens of `corpus` in `window`s.

    Args:
        model: The MoE model (MoEfied from `dense`).
        dense: The dense model it was made from.
        corpus: The text; windows come from its `split` part, never its fit part.
        tokens: Tokens to compare on. Defaults to 16,384.
        window: Tokens per window. Defaults to 64.
        seed: Seeds the windows' shuffle. Defaults to the MoEfication's seed.
        batch: Windows per forward pass.
        split: "test" (what is reported) or "validation" (what choices are made on).
    """
    from moe._corpus import make_windows

    started = time.perf_counter()
    seed = model.seed if seed is None else seed
    windows = torch.from_numpy(
        make_windows(corpus, model.tokenizer, tokens=tokens, window=window, seed=seed, split=split)
    )
    decoder = model.family.name != "bert"
    if decoder:
        batch = max(1, batch // 4)  # (B, T, vocab) logits twice per batch
    layer_shares: list[list[float]] = []
    weights: list[int] = []
    out_dense: list[torch.Tensor] = []
    out_moe: list[torch.Tensor] = []
    nll_dense = nll_moe = kl = agree = 0.0
    positions = 0
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        routing: list[LayerRouting] = []
        moe_out = model.forward(ids, routing=routing)
        dense_out = dense(ids)
        layer_shares.append(flops_share(model, routing))
        weights.append(int(ids.numel()))
        if not decoder:
            out_dense.append(dense_out)
            out_moe.append(moe_out)
            continue
        target = ids[:, 1:]
        logp_d = torch.log_softmax(dense_out[:, :-1].float(), dim=-1)
        logp_m = torch.log_softmax(moe_out[:, :-1].float(), dim=-1)
        nll_dense -= logp_d.gather(-1, target[..., None]).double().sum().item()
        nll_moe -= logp_m.gather(-1, target[..., None]).double().sum().item()
        kl += (
            torch.nn.functional.kl_div(logp_m, logp_d, log_target=True, reduction="none")
            .sum(-1)
            .double()
            .sum()
            .item()
        )
        agree += (logp_d.argmax(-1) == logp_m.argmax(-1)).sum().item()
        positions += target.numel()
    per_layer = np.average(np.array(layer_shares), axis=0, weights=weights)
    options = model.options
    common: dict[str, Any] = {
        "kind": "decoder" if decoder else "encoder",
        "corpus": corpus.name,
        "corpus_sha256": corpus.sha256,
        "fit_corpus": None if options is None else options.fit_corpus,
        "fit_corpus_sha256": None if options is None else options.fit_corpus_sha256,
        "split": split,
        "tokens": int(windows.numel()),
        "windows": int(windows.shape[0]),
        "window": window,
        "seed": seed,
        "expert_flops_share": round(float(per_layer.mean()), 6),
        "flops_share_per_layer": [round(float(s), 6) for s in per_layer],
    }
    if decoder:
        ppl_dense = float(np.exp(nll_dense / positions))
        ppl_moe = float(np.exp(nll_moe / positions))
        metrics = {
            "perplexity_dense": round(ppl_dense, 4),
            "perplexity_moe": round(ppl_moe, 4),
            "ppl_ratio": round(ppl_moe / ppl_dense, 6),
            "next_token_agreement": round(agree / positions, 6),
            "kl_mean": round(kl / positions, 6),
        }
    else:
        d, m = torch.cat(out_dense), torch.cat(out_moe)
        cos = torch.nn.functional.cosine_similarity(d.double(), m.double(), dim=-1).numpy()
        metrics = {
            "cosine_mean": round(float(cos.mean()), 6),
            "cosine_p05": round(float(np.percentile(cos, 5)), 6),
            "cosine_min": round(float(cos.min()), 6),
            "neighbour_overlap_10": round(_neighbour_overlap(d, m, NEIGHBOURS), 6),
        }
    return Quality(
        **common,
        **metrics,
        weights=model.weights.label(),
        wall_s=round(time.perf_counter() - started, 3),
    )


def native_model_error(name: str) -> Exception:
    """Why a native MoE model has no quality to measure (it is the model itself)."""
    from ground.errors import UsageError

    return UsageError(
        f"{name} is a native MoE model: it is served exactly as it was trained, and there is "
        "no dense model to compare it with.",
        "measure quality for a dense model that moelambda MoEfies (minilm, smollm2, or a dense "
        "Hugging Face directory).",
    )


def check_quality_size(tokens: int, window: int) -> None:
    """Refuse a comparison of no tokens or of windows too short to embed (before any load)."""
    from ground.errors import UsageError

    if tokens < 1 or window < 2:
        raise UsageError(
            f"--tokens {tokens} / --window {window} leave nothing to compare.",
            "pass --tokens 1 or more and --window 2 or more.",
        )


def check_held_out(corpus: str, tokens: int, window: int, option: str = "--tokens") -> None:
    """Refuse a comparison larger than a corpus's test part, before any model is loaded (a
    distilled model takes minutes to convert), whatever the model and its seed: quality is
    always measured on the test part (`moe._corpus.partition`), which no fit or choice reads.

    Raises:
        UsageError: `tokens` windows would not fit in the test part (`option` asked for them).
    """
    from ground.errors import UsageError
    from moe._corpus import TEST_TOKENS

    if tokens + window > TEST_TOKENS:
        where = "the embedded text" if corpus == "wiki" else f"'{corpus}'"
        raise UsageError(
            f"quality is measured on the test part of {where}, which holds {TEST_TOKENS:,} "
            f"tokens of whole documents that no fit or choice reads; {tokens:,} tokens (and one "
            "window) are more than that.",
            f"pass {option} {TEST_TOKENS - window:,} or fewer.",
        )


def quality_of(
    model: MoEModel,
    *,
    corpus: str = "wiki",
    tokens: int = QUALITY_TOKENS,
    window: int = QUALITY_WINDOW,
    seed: int | None = None,
    split: Literal["test", "validation"] = "test",
) -> tuple[Quality, bool]:
    """The quality of a MoEfied model on `corpus`'s `split` part, and whether it was measured
    just now.

    The block measured at conversion (the fit text's test part) is reused when it answers the
    same question (the same documents, part, size and seed); any other is measured now against
    the dense model.

    Raises:
        UsageError: The model is a native MoE model (it has no dense counterpart), or `tokens`
            or `window` is out of range.
        CorpusError: The corpus is missing, unreadable or too small, or its held-out documents
            are in the fit part of the text the model was fitted on.
    """
    from moe._corpus import check_disjoint, load_corpus

    if not model.moefied:
        raise native_model_error(model.name)
    check_quality_size(tokens, window)
    seed = model.seed if seed is None else seed
    check_held_out(corpus, tokens, window)
    stored = model.quality
    windows = -(-tokens // window)
    text = load_corpus(corpus)
    if model.options is not None:  # never judged on documents it was fitted on
        check_disjoint(load_corpus(model.options.fit_corpus), text, model.tokenizer)
    if (
        stored is not None
        and stored.get("corpus_sha256") == text.sha256
        and stored.get("split") == split
        and (stored["windows"], stored["window"], stored["seed"]) == (windows, window, seed)
    ):
        # Named as this call names the text, not as the call that measured it did.
        return Quality(**{**stored, "corpus": text.name}), False
    dense = dense_reference(model.name)
    return measure_quality(
        model, dense, text, tokens=tokens, window=window, seed=seed, split=split
    ), True
