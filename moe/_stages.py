"""Stages loaded from an export, as the serverless functions load them, and their composition.

Each stage is built empty from the exported config and filled from its own safetensors file only:
a function never needs the whole model. `run_staged` chains head, layers, per-expert shards and
tail in one process; it is the reference for the serving workflow, and tests check it equals the
monolithic forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError
from safetensors import safe_open
from torch import nn

from ground.errors import ModelError
from ground.manifest import HEAD_KEY, MANIFEST_VERSION, TAIL_KEY, Manifest, expert_key, layer_key
from ground.placement import CPU, Placement
from moe._decode_context import DecodeContext
from moe._experts import Router, SharedExpert, expert_ffn, gather_shards, routing_shards
from moe._families import Family
from moe._options import TopK, parse_top_k
from moe._placement import check_device, place, torch_dtype

__all__ = [
    "ExpertCall",
    "ExpertStage",
    "LayerOutput",
    "LayerStage",
    "StageLoader",
    "Stages",
    "local_experts",
    "run_staged",
    "run_stages",
]


def _sub(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


@dataclass
class LayerOutput:
    """What a layer function produces: the residual to keep, the gate's split of the tokens."""

    residual: torch.Tensor  # (B, T, h)
    ffn_in: torch.Tensor  # (B*T, h)
    experts: torch.Tensor  # (B*T, k)
    weights: torch.Tensor  # (B*T, k)
    probs: torch.Tensor  # (B*T, k)


class HeadStage:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids)


class LayerStage:
    """The previous layer's combine (absent for layer 0), this layer's block and its gate.

    A layer with a shared expert (or a correction bias) runs it here on every token and hands on
    the residual with its output added: the experts' sum is added to that residual downstream,
    exactly as the monolithic forward adds shared and routed outputs.
    """

    def __init__(
        self,
        combine: nn.Module | None,
        block: nn.Module,
        router: Router,
        shared: SharedExpert | None = None,
    ) -> None:
        self.combine = combine
        self.block = block
        self.router = router
        self.shared = shared

    @torch.inference_mode()
    def run(
        self,
        hidden: torch.Tensor,
        expert_sum: torch.Tensor | None = None,
        context: DecodeContext | None = None,
    ) -> LayerOutput:
        """`hidden` is the head's output (layer 0) or the previous layer's residual; `context`
        the KV cache, positions and mask of a generation step (`moe._generate`), if any."""
        if self.combine is not None:
            if expert_sum is None:
                raise ValueError("a layer after the first needs the previous layer's expert sum")
            hidden = self.combine(hidden, expert_sum.view_as(hidden))
        out = self.block(hidden) if context is None else self.block(hidden, context)
        x = out.ffn_in.reshape(-1, out.ffn_in.shape[-1])
        experts, weights, probs = self.router(x)
        residual = out.residual
        if self.shared is not None:
            residual = residual + self.shared(x).view_as(residual)
        return LayerOutput(residual, x, experts, weights, probs)


class ExpertStage:
    def __init__(self, tensors: dict[str, torch.Tensor], kind: str, act: str) -> None:
        self.w_in = tensors["w_in"]
        self.b_in = tensors.get("b_in")
        self.w_out = tensors["w_out"]
        self.b_out = tensors.get("b_out")
        self.kind = kind
        self.act = act

    @torch.inference_mode()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return expert_ffn(x, self.w_in, self.b_in, self.w_out, self.kind, self.act, self.b_out)  # type: ignore[arg-type]


class TailStage:
    def __init__(self, combine: nn.Module, tail: nn.Module) -> None:
        self.combine = combine
        self.tail = tail

    @torch.inference_mode()
    def run(self, residual: torch.Tensor, expert_sum: torch.Tensor) -> torch.Tensor:
        return self.tail(self.combine(residual, expert_sum.view_as(residual)))


class StageLoader:
    """Reads the manifest of an export and builds any one stage from its own file, on the
    device and at the dtype of its `placement` (`ground.placement`: float32 on the CPU unless
    a GPU-backed function says otherwise). Modules are made on the device and each tensor is
    moved there as it is read, so the host holds one tensor of the file at a time."""

    def __init__(self, root: str | Path, placement: Placement = CPU) -> None:
        self.root = Path(root)
        self.placement = check_device(placement)
        path = self.root / "manifest.json"
        if not path.is_file():
            raise ModelError(
                f"'{self.root}' is not a weight export: manifest.json is missing.",
                "export the model first with `moelambda export --out DIR`.",
            )
        try:
            self.manifest = Manifest.model_validate_json(path.read_text())
        except ValidationError as err:
            raise ModelError(
                f"{path} is not a valid manifest: {err}", "re-export the model."
            ) from err
        if self.manifest.format_version != MANIFEST_VERSION:
            raise ModelError(
                f"{path} has format version {self.manifest.format_version}; this moelambda reads "
                f"version {MANIFEST_VERSION}.",
                "re-export the model with this version of moelambda.",
            )

    @cached_property
    def family(self) -> Family:
        """The model's Hugging Face classes, read when a stage other than an expert is built:
        an expert function never imports transformers (about 4 s of every cold start)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.root / "config")
        config._attn_implementation = "eager"
        return Family(self.manifest.family, config, self.manifest.classes)

    @cached_property
    def tokenizer(self) -> Any:
        """The model's tokenizer, exported beside its config (decodes text, finds stop strings)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.root / "config")

    def _tensors(self, key: str) -> dict[str, torch.Tensor]:
        path = self.root / key
        if not path.is_file():
            raise ModelError(
                f"the weights object '{key}' is missing from {self.root}.",
                "re-export the model; do not delete files from an export.",
            )
        where = self.placement
        with safe_open(str(path), framework="pt", device=where.device) as f:
            return {key: place(where, f.get_tensor(key)) for key in f.keys()}  # noqa: SIM118

    def _filled(
        self, make: Callable[[], nn.Module], tensors: dict[str, torch.Tensor]
    ) -> nn.Module:
        """The module `make` builds, made on the placement's device at its dtype and filled."""
        with torch.device(self.placement.device):
            module = make().to(dtype=torch_dtype(self.placement))
        module.load_state_dict(tensors, strict=True)
        return module.eval().requires_grad_(False)

    def _router(self, tensors: dict[str, torch.Tensor]) -> Router:
        weight = tensors["linear.weight"]
        bias = "linear.bias" in tensors
        linear = self._filled(
            lambda: nn.Linear(weight.shape[1], weight.shape[0], bias=bias), _sub(tensors, "linear")
        )
        return Router(linear, top_k=self.routing_rule, weighting=self.manifest.weighting)  # type: ignore[arg-type]

    @property
    def routing_rule(self) -> TopK:
        """How many experts a token takes: the MoEfication's rule, else the manifest's k."""
        m = self.manifest
        if m.moefy is not None:
            return parse_top_k(m.moefy["top_k"], m.experts)
        return TopK(k=m.top_k)

    def _shared(self, tensors: dict[str, torch.Tensor]) -> SharedExpert | None:
        if "w_out" not in tensors:
            return None
        m = self.manifest
        return SharedExpert(
            tensors["w_in"],
            tensors.get("b_in"),
            tensors["w_out"],
            tensors["b_out"],
            kind=m.expert_kind,  # type: ignore[arg-type]
            act=m.activation,
        ).eval()

    def head(self) -> HeadStage:
        return HeadStage(self._filled(self.family.new_head, _sub(self._tensors(HEAD_KEY), "head")))

    def layer(self, layer: int) -> LayerStage:
        tensors = self._tensors(layer_key(layer))
        combine = None
        if layer > 0:
            combine = self._filled(self.family.new_combine, _sub(tensors, "combine"))
        block = self._filled(lambda: self.family.new_block(layer), _sub(tensors, "block"))
        router = self._router(_sub(tensors, "router"))
        return LayerStage(combine, block, router, self._shared(_sub(tensors, "shared")))

    def expert(self, layer: int, expert: int) -> ExpertStage:
        m = self.manifest
        return ExpertStage(self._tensors(expert_key(layer, expert)), m.expert_kind, m.activation)

    def tail(self) -> TailStage:
        tensors = self._tensors(TAIL_KEY)
        combine = self._filled(self.family.new_combine, _sub(tensors, "combine"))
        return TailStage(combine, self._filled(self.family.new_tail, _sub(tensors, "tail")))


class Stages(Protocol):
    """Where a layer loop finds its stages: a `StageLoader`, or a function's warm cache."""

    def head(self) -> HeadStage: ...

    def layer(self, layer: int) -> LayerStage: ...

    def tail(self) -> TailStage: ...


ExpertCall = Callable[[int, LayerOutput], torch.Tensor]
"""(layer, the layer's output) -> the (N, h) weighted sum of its experts' outputs."""


def run_stages(
    stages: Stages,
    num_layers: int,
    input_ids: torch.Tensor,
    experts: ExpertCall,
    *,
    context: DecodeContext | None = None,
) -> torch.Tensor:
    """The layer loop, once: head -> (layer stage -> `experts` -> its sum) x L -> tail.

    `experts` is what differs between the ways a model is served: every expert in this process
    (`run_staged`, a monolithic function), or some in process and the rest invoked remotely (a
    driver function). Whatever it does, it returns the layer's expert sum for the next combine.
    A generation step (`context`, see `moe._generate`) runs the tail on the last column only:
    the next token is all it needs, and the LM head over a whole prompt costs as much as a layer.
    """
    residual = stages.head().run(input_ids)
    expert_sum = None
    for layer in range(num_layers):
        out = stages.layer(layer).run(residual, expert_sum, context)
        expert_sum = experts(layer, out)
        residual = out.residual
    if expert_sum is None:
        raise ValueError("a model without MoE layers has no staged forward")
    if context is not None:
        expert_sum = expert_sum.view_as(residual)[:, -1:]
        residual = residual[:, -1:]
    return stages.tail().run(residual, expert_sum)


def local_experts(
    expert: Callable[[int, int], ExpertStage], num_experts: int, hidden: int
) -> ExpertCall:
    """An `ExpertCall` running every routed expert in this process, each on its own shard."""

    def call(layer: int, out: LayerOutput) -> torch.Tensor:
        parts = [
            (tokens, weights, expert(layer, e).run(out.ffn_in[tokens]))
            for e, (tokens, weights) in enumerate(
                routing_shards(out.experts, out.weights, num_experts)
            )
        ]
        return gather_shards(out.ffn_in.shape[0], hidden, parts)

    return call


def run_staged(root: str | Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Run windows through the exported stages one by one, each expert on its own shard."""
    loader = StageLoader(root)
    m = loader.manifest
    experts = local_experts(loader.expert, m.experts, m.hidden_size)
    return run_stages(loader, m.num_layers, input_ids, experts)
