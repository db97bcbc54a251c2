"""The MoE model: load a Hugging Face model, MoEfy it (or take its native experts), run it.

`MoEModel.forward` is the monolithic forward the profiler runs (each token through its top-k
experts only). `reference=True` runs every expert on every token and masks by the routing: slower,
but it shares no gather/scatter code with the fast path or with the staged serving path, so tests
compare both against it.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ground.errors import ModelError, UsageError
from moe._experts import ExpertBank, Router, expert_ffn
from moe._families import NATIVE_MOE_TYPES, Family, family_for
from moe._moefy import LayerFit, moefy_ffn
from moe._registry import ModelSource, resolve_model

__all__ = [
    "EXPERT_CHOICES",
    "TOP_K_CHOICES",
    "LayerRouting",
    "MoEModel",
    "build_model",
]

EXPERT_CHOICES = (2, 4, 8, 16)
TOP_K_CHOICES = (1, 2)
FIT_WINDOW = 128


@dataclass(frozen=True)
class LayerRouting:
    """Routing of one MoE layer for n tokens: what the profiler records."""

    experts: torch.Tensor  # (n, k) expert indices
    probs: torch.Tensor  # (n, k) gate probabilities of those experts
    attention_ids: torch.Tensor  # (n,) token ID of the most-attended key


@dataclass
class MoEModel:
    """A Mixture-of-Experts transformer split into the stages the functions run.

    Attributes:
        name: The model's name in reports ("minilm", "smollm2" or its directory).
        family: Architecture family with the config and the classes to rebuild stages.
        experts: Experts per MoE layer (E).
        top_k: Experts per token (k).
        moefied: True when the experts were made from a dense FFN, False for native MoE weights.
        seed: Seed of the MoEfication (clustering and router fit).
        head, blocks, routers, banks, combines, tail: The stage modules.
        tokenizer: The model's tokenizer.
        fits: Per-layer quality of the fitted routers (empty for native MoE models).
    """

    name: str
    family: Family
    experts: int
    top_k: int
    moefied: bool
    seed: int
    head: nn.Module
    blocks: list[nn.Module]
    routers: list[Router]
    banks: list[ExpertBank]
    combines: list[nn.Module]
    tail: nn.Module
    tokenizer: Any
    fits: list[LayerFit] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def hidden_size(self) -> int:
        return self.family.hidden_size

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        reference: bool = False,
        routing: list[LayerRouting] | None = None,
        tail: bool = True,
    ) -> torch.Tensor:
        """Run (B, T) windows through the model; append per-layer routing to `routing` if given.

        Returns the tail's output: sentence embeddings (B, h) for BERT, logits (B, T, V) for
        decoders; with `tail=False` the last hidden states instead, which is all the profiler
        needs (a decoder's LM head can cost as much as its MoE layers).
        """
        batch, length = input_ids.shape
        hidden = self.head(input_ids)
        for block, router, bank, combine in zip(
            self.blocks, self.routers, self.banks, self.combines, strict=True
        ):
            out = block(hidden)
            x = out.ffn_in.reshape(batch * length, -1)
            idx, weights, probs = router(x)
            y = bank.dense_masked(x, idx, weights) if reference else bank.sparse(x, idx, weights)
            hidden = combine(out.residual, y.view(batch, length, -1))
            if routing is not None:
                most_attended = out.attention.sum(dim=1).argmax(dim=-1)
                routing.append(
                    LayerRouting(idx, probs, input_ids.gather(1, most_attended).reshape(-1))
                )
        return self.tail(hidden) if tail else hidden


def _check_choices(experts: int | None, top_k: int | None) -> None:
    if experts is not None and top_k is not None and top_k > experts:
        raise UsageError(
            f"--top-k {top_k} is larger than --experts {experts}.",
            "pick top-k no larger than the number of experts.",
        )
    if experts is not None and experts not in EXPERT_CHOICES:
        raise UsageError(
            f"--experts {experts} is not supported for MoEfication.",
            f"use one of {', '.join(map(str, EXPERT_CHOICES))}.",
        )
    if top_k is not None and top_k not in TOP_K_CHOICES:
        raise UsageError(
            f"--top-k {top_k} is not supported.",
            f"use one of {', '.join(map(str, TOP_K_CHOICES))}.",
        )


def load_hf(source: ModelSource) -> tuple[nn.Module, Any]:
    """Load a Hugging Face model (fp32, eager attention so weights are returned) and tokenizer."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    kwargs: dict[str, Any] = {}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    auto = (
        transformers.AutoModel
        if source.model_type == "bert"
        else transformers.AutoModelForCausalLM
    )
    try:
        # The GGUF reader draws its own tqdm bar, which transformers' switch does not reach;
        # it would garble our progress display, so its stderr is dropped (errors still raise).
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = transformers.AutoTokenizer.from_pretrained(source.path, **kwargs)
            hf = auto.from_pretrained(
                source.path, attn_implementation="eager", dtype=torch.float32, **kwargs
            )
    except (OSError, ValueError, KeyError, ImportError) as err:
        raise ModelError(
            f"cannot load the model in {source.path}: {err}",
            "check that the directory holds a complete Hugging Face model (config, weights, "
            "tokenizer) and that its architecture is supported.",
        ) from err
    return hf.eval(), tokenizer


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
    )


def build_model(
    model: str,
    *,
    experts: int | None = 4,
    top_k: int | None = 2,
    seed: int = 0,
    fit_tokens: int = 8192,
    progress: Callable[[str], None] | None = None,
) -> MoEModel:
    """Build `model` as an MoE model from its Hugging Face weights (no cache; see `load_model`).

    A dense model (BERT, Llama, Mistral, Qwen2) is MoEfied into `experts` experts with top-`top_k`
    routing, fitting the routers on `fit_tokens` tokens of the embedded Wikipedia corpus (its "fit"
    split). A native MoE model (Mixtral, OLMoE) keeps its own experts and router; `experts` and
    `top_k` must then be None or equal to the model's.

    Args:
        model: "minilm" (default), "smollm2", or a local Hugging Face model directory.
        experts: Experts per layer for MoEfication, one of 2, 4, 8, 16. Defaults to 4.
        top_k: Experts per token, 1 or 2. Defaults to 2.
        seed: Seeds MoEfication. Defaults to 0.
        fit_tokens: Tokens to fit the routers on. Defaults to 8,192.
        progress: Called with a short description before each slow step.

    Raises:
        UsageError: `experts`/`top_k` out of range or not dividing the FFN width.
        ModelError: The model cannot be found, loaded, or is of an unsupported type.
    """
    source = resolve_model(model)
    native = source.model_type in NATIVE_MOE_TYPES
    if not native:
        _check_choices(experts, top_k)
    say = progress or (lambda _msg: None)
    say(f"loading {source.name}")
    hf, tokenizer = load_hf(source)
    family = family_for(hf)
    parts = family.parts_from_hf(hf)

    if native:
        banks, routers, n_experts, n_top_k = _native_parts(hf, family)
        for asked, actual, flag in (
            (experts, n_experts, "--experts"),
            (top_k, n_top_k, "--top-k"),
        ):
            if asked is not None and asked != actual:
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

    if experts is None or top_k is None:
        raise UsageError(
            f"{source.name} is a dense model: MoEfying it needs --experts and --top-k.",
            "pass --experts (2, 4, 8 or 16) and --top-k (1 or 2).",
        )
    width = int(family.config.intermediate_size)
    if width % experts:
        raise UsageError(
            f"--experts {experts} does not divide the FFN width {width} of {source.name}.",
            f"use a number of experts that divides {width}: "
            + ", ".join(str(e) for e in EXPERT_CHOICES if width % e == 0)
            + ".",
        )
    from moelambda.corpus import load_corpus, make_windows

    say(f"fitting routers on {fit_tokens} tokens")
    windows = make_windows(
        load_corpus("wiki"),
        tokenizer,
        tokens=fit_tokens,
        window=FIT_WINDOW,
        seed=seed,
        split="fit",
    )
    inputs = _collect_ffn_inputs(parts, family, torch.from_numpy(windows), batch=16)
    banks, routers, fits = [], [], []
    for layer, x in enumerate(inputs):
        say(f"MoEfying layer {layer + 1}/{len(inputs)}")
        bank, router, fit = moefy_ffn(
            family.dense_ffn(parts["ffns"][layer]), x, experts=experts, top_k=top_k, seed=seed
        )
        banks.append(bank)
        routers.append(router)
        fits.append(fit)
    return _assemble(
        source.name,
        family,
        parts,
        tokenizer,
        banks,
        routers,
        experts,
        top_k,
        moefied=True,
        seed=seed,
        fits=fits,
    )
