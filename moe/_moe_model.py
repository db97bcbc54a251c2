"""The MoE model: its stage modules, the monolithic forward, and generation in one process.

`MoEModel.forward` is the monolithic forward the profiler runs (each token through its top-k
experts only). `reference=True` runs every expert on every token and masks by the routing: slower,
but it shares no gather/scatter code with the fast path or with the staged serving path, so tests
compare both against it.

Its own module, apart from how a model is built (`moe._model`), because building one distils it
and measures its quality (`moe._distil`, `moe._quality`), and those read the model: they take it
from here, not from what calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ground.errors import UsageError
from ground.precision import FP32, Weights
from moe._experts import ExpertBank, Router, SharedExpert
from moe._families import Family
from moe._generate import Generated, GenerationConfig, Step, eos_ids, generate_tokens
from moe._moefy import LayerFit
from moe._options import MoefyOptions
from moe._stages import ExpertCall, HeadStage, LayerOutput, LayerStage, TailStage

__all__ = ["LayerRouting", "MoEModel"]


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
        shared: Per layer, the always-on part run in the layer function (shared expert and
            correction bias), or None; empty when no layer has one.
        options: The MoEfication that made the experts (None for native MoE models).
        quality: The served model against the dense one on held-out text (`moe.Quality` as a
            dict), measured when the model was MoEfied; None if never measured.
        weights: The precision of its weights per stage kind (`moe.at_precision`).
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
    shared: list[SharedExpert | None] = field(default_factory=list)
    options: MoefyOptions | None = None
    quality: dict[str, Any] | None = None
    weights: Weights = FP32

    def shared_expert(self, layer: int) -> SharedExpert | None:
        return self.shared[layer] if self.shared else None

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
        for layer, (block, router, bank, combine) in enumerate(
            zip(self.blocks, self.routers, self.banks, self.combines, strict=True)
        ):
            out = block(hidden)
            x = out.ffn_in.reshape(batch * length, -1)
            idx, weights, probs = router(x)
            y = bank.dense_masked(x, idx, weights) if reference else bank.sparse(x, idx, weights)
            residual = out.residual
            shared = self.shared_expert(layer)
            if shared is not None:  # added where the layer function adds it (`LayerStage`)
                residual = residual + shared(x).view_as(residual)
            hidden = combine(residual, y.view(batch, length, -1))
            if routing is not None:
                most_attended = out.attention.sum(dim=1).argmax(dim=-1)
                routing.append(
                    LayerRouting(idx, probs, input_ids.gather(1, most_attended).reshape(-1))
                )
        return self.tail(hidden) if tail else hidden

    def generate(
        self,
        prompts: list[list[int]],
        config: GenerationConfig,
        *,
        on_step: Callable[[Step], None] | None = None,
    ) -> list[Generated]:
        """Generate in this process, every expert local: what a monolithic function does, and
        the reference a deployment's generation is held to (`moe.generate_tokens`)."""
        if self.family.name != "decoder":
            raise UsageError(
                f"{self.name} is an encoder: it has no next token to generate.",
                "generate with a decoder model (SmolLM2, Mixtral, OLMoE).",
            )
        cfg = self.family.config
        return generate_tokens(
            self.stages(),
            self.num_layers,
            prompts,
            self.expert_call(),
            config,
            pad_id=0,
            eos_ids=eos_ids(cfg),
            sliding_window=getattr(cfg, "sliding_window", None),
            tokenizer=self.tokenizer,
            on_step=on_step,
        )

    def stages(self) -> _ModelStages:
        """This model as serving stages (`moe.Stages`) sharing its tensors: what a monolithic
        function runs, in process, for `moe.generate_tokens`."""
        return _ModelStages(self)

    def expert_call(self) -> ExpertCall:
        """Every routed expert of a layer in this process (the `ExpertCall` of one function)."""

        def call(layer: int, out: LayerOutput) -> torch.Tensor:
            return self.banks[layer].sparse(out.ffn_in, out.experts, out.weights)

        return call


class _ModelStages:
    """`MoEModel`'s modules as the stages of `moe.run_stages`."""

    def __init__(self, model: MoEModel) -> None:
        self.model = model

    def head(self) -> HeadStage:
        return HeadStage(self.model.head)

    def layer(self, layer: int) -> LayerStage:
        m = self.model
        combine = m.combines[layer - 1] if layer > 0 else None
        return LayerStage(combine, m.blocks[layer], m.routers[layer], m.shared_expert(layer))

    def tail(self) -> TailStage:
        return TailStage(self.model.combines[-1], self.model.tail)
