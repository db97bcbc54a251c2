"""Building the MoE model: load a Hugging Face model, MoEfy it (or take its native experts).

A dense model is converted (routers fitted, layers corrected and trained, experts distilled) and
metered, and its quality against the dense model is measured; a native MoE model keeps its own
experts and router. The model itself, and how it runs, is `moe._moe_model`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ground.errors import CorpusError, UsageError
from moe._conversion_meter import ConversionMeter
from moe._distil import VALIDATION_WINDOWS, Distillation, distil, distil_exposure
from moe._experts import ExpertBank, Router, SharedExpert, expert_ffn
from moe._families import NATIVE_MOE_TYPES, Family, family_for
from moe._hf import load_hf, load_tokenizer
from moe._moe_model import MoEModel
from moe._moefy import LayerFit, MoefiedLayer, moefy_layer
from moe._options import EXPERT_CHOICES, MAX_SHARED, MoefyOptions, TopK, parse_top_k
from moe._quality import (
    QUALITY_TOKENS,
    QUALITY_WINDOW,
    DenseRunner,
    check_held_out,
    measure_quality,
)
from moe._registry import ModelSource, resolve_model

if TYPE_CHECKING:
    from pathlib import Path

    from moe._corpus import Corpus

__all__ = ["EXPERT_CHOICES", "build_model", "load_hf", "moefy_options"]

FIT_WINDOW = 128


def moefy_options(
    experts: int | None,
    top_k: int | str | TopK | None,
    *,
    seed: int = 0,
    fit_tokens: int = 8192,
    **recovery: Any,
) -> MoefyOptions:
    """The `MoefyOptions` of the CLI's flags; `recovery` holds the quality-recovery options.

    Without recovery options only k = 1 or 2 is offered, MoEfication as it always was.

    Raises:
        UsageError: A value is out of range, or top-k exceeds the number of experts.
    """
    if experts is None or top_k is None:
        raise UsageError(
            "MoEfying a dense model needs --experts and --top-k.",
            "pass --experts (2, 4, 8 or 16) and --top-k (e.g. 2).",
        )
    rule = top_k if isinstance(top_k, TopK) else parse_top_k(top_k, experts)
    if rule.k > experts:
        raise UsageError(
            f"--top-k {rule.label()} is larger than --experts {experts}.",
            "pick top-k no larger than the number of experts.",
        )
    if experts not in EXPERT_CHOICES:
        raise UsageError(
            f"--experts {experts} is not supported for MoEfication.",
            f"use one of {', '.join(map(str, EXPERT_CHOICES))}.",
        )
    if not 0.0 <= recovery.get("shared", 0.0) <= MAX_SHARED:
        raise UsageError(
            f"--shared {recovery['shared']:g} is not a fraction of the FFN width in "
            f"[0, {MAX_SHARED:g}].",
            f"pass --shared between 0 and {MAX_SHARED:g} (0.25 is a common choice).",
        )
    if (
        min(recovery.get("distil_steps", 0), recovery.get("local_steps", 0)) < 0
        or fit_tokens < 128
    ):
        raise UsageError(
            "--distil-steps must be 0 or more, --local-steps 0 or more and --fit-tokens 128 or "
            "more.",
            "pass e.g. --local-steps 100 --fit-tokens 32768.",
        )
    if not recovery.get("ridge", 1.0) > 0:
        raise UsageError(
            f"--ridge {recovery['ridge']:g} is not positive.", "pass e.g. --ridge 0.1."
        )
    return MoefyOptions(experts=experts, top_k=rule, seed=seed, fit_tokens=fit_tokens, **recovery)


def _native_parts(
    hf: nn.Module, family: Family
) -> tuple[list[ExpertBank], list[Router], int, int]:
    config = hf.config
    experts = int(getattr(config, "num_local_experts", None) or config.num_experts)
    top_k = int(config.num_experts_per_tok)
    renorm = config.model_type == "mixtral" or bool(getattr(config, "norm_topk_prob", False))
    banks, routers = [], []
    for layer in hf.model.layers:
        moe = layer.mlp
        banks.append(
            ExpertBank(
                moe.experts.gate_up_proj.detach(),
                None,
                moe.experts.down_proj.detach(),
                kind="glu",
                act=str(config.hidden_act),
            )
        )
        linear = nn.Linear(family.hidden_size, experts, bias=False)
        linear.weight = nn.Parameter(moe.gate.weight.detach(), requires_grad=False)
        routers.append(
            Router(linear, top_k=top_k, weighting="softmax_renorm" if renorm else "softmax")
        )
    return banks, routers, experts, top_k


@torch.no_grad()  # not inference_mode: the router fit needs these as autograd inputs
def _collect_ffn_inputs(
    parts: dict[str, Any], family: Family, windows: torch.Tensor, batch: int
) -> list[torch.Tensor]:
    """FFN inputs of every layer of the *dense* model on real text (what MoEfication fits on)."""
    ffns = [family.dense_ffn(m) for m in parts["ffns"]]
    per_layer: list[list[torch.Tensor]] = [[] for _ in ffns]
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        hidden = parts["head"](ids)
        for layer, ffn in enumerate(ffns):
            out = parts["blocks"][layer](hidden)
            per_layer[layer].append(out.ffn_in.reshape(-1, family.hidden_size))
            y = expert_ffn(out.ffn_in, ffn.w_in, ffn.b_in, ffn.w_out, ffn.kind, ffn.act)
            hidden = parts["combines"][layer](out.residual, y)
    return [torch.cat(chunks) for chunks in per_layer]


@torch.no_grad()
def _fit_sequential(
    parts: dict[str, Any],
    family: Family,
    windows: torch.Tensor,
    options: MoefyOptions,
    say: Callable[[str], None],
    batch: int = 16,
    checkpoint: Path | None = None,
    meter: ConversionMeter | None = None,
) -> list[MoefiedLayer]:
    """MoEfy layer by layer, each fitted on the inputs the MoEfied layers before it produce.

    Fitting on the dense model's inputs (as the original MoEfication does) leaves every layer
    blind to the error of the layers before it; here the target is still the dense FFN's output,
    but at the input the served model will really give it. With `options.local_steps` each layer
    is then trained alone on those inputs (`moe._local`).

    With a `checkpoint` directory each finished layer is saved there at once (with the seconds
    the conversion had taken, from `meter`), and the layers found there are taken instead of
    fitted again: a stopped conversion resumes at the next layer.
    """
    from moe._checkpoint import load_layers, save_layer

    h = family.hidden_size
    count = len(parts["ffns"])
    done = load_layers(checkpoint, options) if checkpoint is not None else []
    if done:
        say(f"resuming: {len(done)} of {count} layers read from {checkpoint}")
    hidden = [parts["head"](windows[s : s + batch]) for s in range(0, windows.shape[0], batch)]
    layers: list[MoefiedLayer] = []
    for index, module in enumerate(parts["ffns"]):
        outs = [parts["blocks"][index](state) for state in hidden]
        x = [out.ffn_in.reshape(-1, h) for out in outs]
        if index < len(done):
            layer = done[index]
        else:
            say(f"MoEfying layer {index + 1}/{count}")
            inputs = torch.cat(x)
            ffn = family.dense_ffn(module)
            layer = moefy_layer(ffn, inputs, options)
            if options.local_steps:
                say(f"training layer {index + 1}/{count} locally ({options.local_steps} steps)")
                _train_locally(layer, ffn, inputs.float(), options, index)
            if checkpoint is not None:
                save_layer(
                    checkpoint, index, layer, options, 0.0 if meter is None else meter.elapsed()
                )
        layers.append(layer)
        combine = parts["combines"][index]
        hidden = [
            combine(out.residual, layer(xs).view_as(out.residual))
            for out, xs in zip(outs, x, strict=True)
        ]
    return layers


def _train_locally(
    layer: MoefiedLayer, ffn: Any, x: torch.Tensor, options: MoefyOptions, index: int
) -> None:
    """`moe._local.train_layer` against the dense FFN on `x`; the layer's fit says how far it
    ended from the dense FFN."""
    from moe._local import train_layer

    target = expert_ffn(x, ffn.w_in, ffn.b_in, ffn.w_out, ffn.kind, ffn.act)
    trained = train_layer(
        layer, x, target, steps=options.local_steps, seed=options.seed * 1000 + index
    )
    layer.fit = dataclasses.replace(layer.fit, ffn_rel_error=math.sqrt(trained.after))


def _assemble(
    name: str,
    family: Family,
    parts: dict[str, Any],
    tokenizer: Any,
    banks: list[ExpertBank],
    routers: list[Router],
    experts: int,
    top_k: int,
    *,
    moefied: bool,
    seed: int,
    fits: list[LayerFit] | None = None,
    shared: list[SharedExpert | None] | None = None,
    options: MoefyOptions | None = None,
) -> MoEModel:
    """The model from the Hugging Face parts plus the MoE parts (native or MoEfied)."""
    return MoEModel(
        name=name,
        family=family,
        experts=experts,
        top_k=top_k,
        moefied=moefied,
        seed=seed,
        head=parts["head"],
        blocks=parts["blocks"],
        routers=routers,
        banks=banks,
        combines=parts["combines"],
        tail=parts["tail"],
        tokenizer=tokenizer,
        fits=fits or [],
        shared=shared if shared and any(s is not None for s in shared) else [],
        options=options,
    )


def _check_width(options: MoefyOptions, width: int, name: str) -> None:
    if options.shared == 0.0 and width % options.experts:
        raise UsageError(
            f"--experts {options.experts} does not divide the FFN width {width} of {name}.",
            f"use a number of experts that divides {width}: "
            + ", ".join(str(e) for e in EXPERT_CHOICES if width % e == 0)
            + ", or give part of the width to a shared expert (--shared).",
        )
    routed = options.experts * int((width - round(options.shared * width)) // options.experts)
    if routed < options.experts:
        raise UsageError(
            f"--shared {options.shared:g} leaves no neurons for {options.experts} experts.",
            "lower --shared.",
        )


def build_model(
    model: str,
    *,
    experts: int | None = 4,
    top_k: int | str | TopK | None = 2,
    seed: int = 0,
    fit_tokens: int = 8192,
    options: MoefyOptions | None = None,
    quality_tokens: int = QUALITY_TOKENS,
    progress: Callable[[str], None] | None = None,
    checkpoint: Path | None = None,
) -> MoEModel:
    """Build `model` as an MoE model from its Hugging Face weights (no cache; see `load_model`).

    A dense model (BERT, Llama, Mistral, Qwen2) is MoEfied into `experts` experts with top-`top_k`
    routing, fitting the routers on `fit_tokens` tokens of the fit part of `options.fit_corpus`
    (the embedded Wikipedia corpus unless the options name another), and its quality against the
    dense model is measured on that corpus's test part (`MoEModel.quality`). A native MoE model
    (Mixtral, OLMoE) keeps its own experts and router;
    `experts` and `top_k` must then be None or equal to the model's.

    Args:
        model: "minilm" (default), "smollm2", or a local Hugging Face model directory.
        experts: Experts per layer for MoEfication, one of 2, 4, 8, 16. Defaults to 4.
        top_k: Experts per token: an integer, or an adaptive rule ("adaptive:0.1",
            "mass:0.6"). Defaults to 2.
        seed: Seeds MoEfication. Defaults to 0.
        fit_tokens: Tokens to fit the routers on. Defaults to 8,192.
        options: The whole MoEfication, quality recovery included; replaces `experts`, `top_k`,
            `seed` and `fit_tokens` when given.
        quality_tokens: Held-out tokens the quality is measured on (0: not measured). Defaults
            to 16,384.
        progress: Called with a short description before each slow step.
        checkpoint: A directory to save each MoEfied layer in as soon as it is done, and to
            resume from (`moe._checkpoint`); None: no checkpoints.

    Raises:
        UsageError: `experts`/`top_k` out of range or not dividing the FFN width.
        ModelError: The model cannot be found, loaded, or is of an unsupported type.
    """
    source = resolve_model(model)
    native = source.model_type in NATIVE_MOE_TYPES
    if not native and options is None:
        options = moefy_options(experts, top_k, seed=seed, fit_tokens=fit_tokens)
    say = progress or (lambda _msg: None)
    say(f"loading {source.name}")
    if native:
        hf, tokenizer = load_hf(source)
        family = family_for(hf)
        parts = family.parts_from_hf(hf)
        return _native_model(source, family, parts, hf, tokenizer, experts, top_k, seed)
    assert options is not None
    from moe._corpus import check_fit_text, make_windows

    if quality_tokens:
        check_held_out(options.fit_corpus, quality_tokens, QUALITY_WINDOW)
    # The text is cut before the weights load: a corpus too small for the options fails in a
    # second, not after a conversion.
    tokenizer = load_tokenizer(source)
    corpus = fit_text(options)
    options = options.model_copy(update={"fit_corpus_sha256": corpus.sha256})
    say(f"splitting '{corpus.name}' into fit, validation and test documents")
    sizes = check_fit_text(corpus, tokenizer, fit_tokens=options.fit_tokens, window=FIT_WINDOW)
    windows = torch.from_numpy(
        make_windows(
            corpus,
            tokenizer,
            tokens=options.fit_tokens,
            window=FIT_WINDOW,
            seed=options.seed,
            split="fit",
            option="--fit-tokens",
        )
    )
    if quality_tokens:  # the test part holds the quality windows (raises now if it cannot)
        make_windows(
            corpus,
            tokenizer,
            tokens=quality_tokens,
            window=QUALITY_WINDOW,
            seed=options.seed,
            split="test",
        )
    from moe._checkpoint import checkpoint_seconds

    earlier = 0.0 if checkpoint is None else checkpoint_seconds(checkpoint, options)
    with ConversionMeter(earlier) as meter:
        built, parts, distilled, seen = _convert(
            source, tokenizer, options, windows, corpus, say, checkpoint, meter
        )
    if quality_tokens:
        say("measuring quality against the dense model")
        dense = DenseRunner(built.family, parts)
        quality = measure_quality(built, dense, corpus, tokens=quality_tokens)
        update: dict[str, Any] = {
            "fit_parts": sizes,
            "convert_s": round(meter.seconds, 1),
            "convert_peak_rss_mib": round(meter.peak_rss_mib),
        }
        if distilled is not None:
            update |= {"distil_kept_step": distilled.kept_step, "distil_text": seen}
        built.quality = quality.model_copy(update=update).model_dump()
    return built


def _convert(
    source: ModelSource,
    tokenizer: Any,
    options: MoefyOptions,
    windows: torch.Tensor,
    corpus: Corpus,
    say: Callable[[str], None],
    checkpoint: Path | None,
    meter: ConversionMeter,
) -> tuple[MoEModel, dict[str, Any], Distillation | None, dict[str, int | float] | None]:
    """The conversion `build_model` meters: load the dense weights, MoEfy every layer (fit,
    correct, train locally), distil. Returns the model, the dense parts, the distillation run
    and the text it saw (None without distillation)."""
    from moe._corpus import make_windows

    hf, tokenizer = load_hf(source, tokenizer)
    family = family_for(hf)
    parts = family.parts_from_hf(hf)
    _check_width(options, int(family.config.intermediate_size), source.name)
    say(f"fitting routers on {options.fit_tokens} tokens")
    if options.is_original:
        inputs = _collect_ffn_inputs(parts, family, windows, batch=16)
        layers = []
        for index, x in enumerate(inputs):
            say(f"MoEfying layer {index + 1}/{len(inputs)}")
            layers.append(moefy_layer(family.dense_ffn(parts["ffns"][index]), x, options))
    else:
        layers = _fit_sequential(
            parts, family, windows, options, say, checkpoint=checkpoint, meter=meter
        )
    built = _assemble(
        source.name,
        family,
        parts,
        tokenizer,
        [layer.bank for layer in layers],
        [layer.router for layer in layers],
        options.experts,
        options.top_k.k,
        moefied=True,
        seed=options.seed,
        fits=[layer.fit for layer in layers],
        shared=[layer.shared for layer in layers],
        options=options,
    )
    distilled: Distillation | None = None
    seen: dict[str, int | float] | None = None
    if options.distil_steps:
        from moe._corpus import training_windows

        say("reading the text to distil on")
        text = training_windows(corpus, tokenizer, window=FIT_WINDOW, seed=options.seed)
        seen = distil_exposure(options.distil_steps, text.shape[0])
        say(
            f"distilling on {seen['windows']:,} distinct windows of {FIT_WINDOW} tokens: "
            f"{seen['epochs']:g} epochs in {options.distil_steps:,} steps"
        )
        held = make_windows(
            corpus,
            tokenizer,
            tokens=VALIDATION_WINDOWS * QUALITY_WINDOW,
            window=QUALITY_WINDOW,
            seed=options.seed,
            split="validation",
        )
        distilled = distil(
            built,
            parts,
            torch.from_numpy(text),
            steps=options.distil_steps,
            validation=torch.from_numpy(held),
            progress=say,
        )
    return built, parts, distilled, seen


def fit_text(options: MoefyOptions) -> Corpus:
    """The corpus `options` fit on, checked against the hash they pin (if any).

    Raises:
        CorpusError: The file is missing or unreadable, or it changed since the model was
            fitted on it.
    """
    from moe._corpus import load_corpus

    corpus = load_corpus(options.fit_corpus, "--fit-corpus")
    pinned = options.fit_corpus_sha256
    if pinned is not None and pinned != corpus.sha256:
        raise CorpusError(
            f"the model was fitted on '{options.fit_corpus}' when its documents had SHA-256 "
            f"{pinned[:12]}…; they now have {corpus.sha256[:12]}…, so this is not the text "
            "the model was fitted on.",
            "restore the file the model was fitted on, or fit a model on the text as it is now "
            "(run `moelambda profile` / `choose` / `plan` again with --fit-corpus).",
        )
    return corpus


def check_judged_text(model: str, options: MoefyOptions | None, corpus: str) -> None:
    """Before any weights load: refuse to judge a model fitted as `options` say on `corpus`
    when the validation or test documents of `corpus` are in the fit part of the text it fits
    on (`moe._corpus.check_disjoint`); a native model (`options` None) is not fitted.

    Raises:
        CorpusError: Either text is missing or unreadable, or they share held-out documents.
    """
    if options is None:
        return
    from moe._corpus import check_disjoint, load_corpus

    fitted = load_corpus(options.fit_corpus, "--fit-corpus")
    judged = load_corpus(corpus)
    if fitted.sha256 != judged.sha256:
        check_disjoint(fitted, judged, load_tokenizer(resolve_model(model)))


def _native_model(
    source: ModelSource,
    family: Family,
    parts: dict[str, Any],
    hf: nn.Module,
    tokenizer: Any,
    experts: int | None,
    top_k: int | str | TopK | None,
    seed: int,
) -> MoEModel:
    banks, routers, n_experts, n_top_k = _native_parts(hf, family)
    asked_k = top_k.k if isinstance(top_k, TopK) else top_k
    for asked, actual, flag in ((experts, n_experts, "--experts"), (asked_k, n_top_k, "--top-k")):
        if asked is not None and str(asked) != str(actual):
            raise UsageError(
                f"{source.name} is a native MoE model with {flag} {actual}, not {asked}.",
                f"omit {flag} or pass {flag} {actual}.",
            )
    return _assemble(
        source.name,
        family,
        parts,
        tokenizer,
        banks,
        routers,
        n_experts,
        n_top_k,
        moefied=False,
        seed=seed,
    )
