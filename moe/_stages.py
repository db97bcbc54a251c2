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
from moe._experts import (
    Router,
    SharedExpert,
    expert_ffn,
    gather_shards,
    matrix_of,
    routing_shards,
)
from moe._families import Family
from moe._int8 import int8_shells
from moe._options import TopK, parse_top_k
from moe._placement import check_device, check_precision, torch_dtype

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
        self.dtype = _dtype_of(block)

    @torch.inference_mode()
    def run(
        self,
        hidden: torch.Tensor,
        expert_sum: torch.Tensor | None = None,
        context: DecodeContext | None = None,
    ) -> LayerOutput:
        """`hidden` is the head's output (layer 0) or the previous layer's residual; `context`
        the KV cache, positions and mask of a generation step (`moe._generate`), if any. Both
        come at the stage's dtype, or as float32 from another function (cast here)."""
        hidden = hidden.to(self.dtype)
        if expert_sum is not None:
            expert_sum = expert_sum.to(self.dtype)
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
    """One expert as its file stores it: float weights, or int8 ones with their scales."""

    def __init__(self, tensors: dict[str, torch.Tensor], kind: str, act: str) -> None:
        self.w_in, self.b_in = matrix_of(tensors, "w_in", "b_in")
        self.w_out, self.b_out = matrix_of(tensors, "w_out", "b_out")
        self.kind = kind
        self.act = act

    @torch.inference_mode()
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return expert_ffn(x, self.w_in, self.b_in, self.w_out, self.kind, self.act, self.b_out)  # type: ignore[arg-type]


class TailStage:
    def __init__(self, combine: nn.Module, tail: nn.Module) -> None:
        self.combine = combine
        self.tail = tail
        self.dtype = _dtype_of(combine, tail)

    @torch.inference_mode()
    def run(self, residual: torch.Tensor, expert_sum: torch.Tensor) -> torch.Tensor:
        residual, expert_sum = residual.to(self.dtype), expert_sum.to(self.dtype)
        return self.tail(self.combine(residual, expert_sum.view_as(residual)))


def _dtype_of(*modules: nn.Module) -> torch.dtype:
    """The dtype a stage computes in: its floating parameters' (an int8 stage's norms are
    float32), float32 for modules without any."""
    params = (p for m in modules for p in m.parameters() if p.is_floating_point())
    return next((p.dtype for p in params), torch.float32)


class StageLoader:
    """Reads the manifest of an export and builds any one stage from its own file, on the
    device and at the dtype of its `placement` (`ground.placement`: float32 on the CPU unless
    a GPU-backed function says otherwise) and of the export's precision
    (`ground.precision`: a bf16 stage runs in bfloat16, an int8 one in int8 with float32
    activations; the gate stays float32 on the CPU). Modules are made on the device and each
    tensor is moved there as it is read, so the host holds one tensor of the file at a time."""

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
        check_precision(self.manifest.precision, self.placement)

    def dtype(self, role: str) -> torch.dtype:
        """The dtype a stage of `role` computes in: the placement's bfloat16 (a GPU), else its
        precision's (bfloat16, or float32 for fp32 and int8)."""
        if self.placement.dtype == "bfloat16" or self.manifest.precision.of(role) == "bf16":
            return torch.bfloat16
        return torch_dtype(self.placement)

    @property
    def _int8_stack(self) -> bool:
        return self.manifest.precision.stack == "int8"

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

    def _tensors(
        self, key: str, dtype: torch.dtype, keep: str | None = None
    ) -> dict[str, torch.Tensor]:
        """The file's tensors on the device, floating ones at `dtype` (those under the prefix
        `keep` at the placement's: the gate)."""
        path = self.root / key
        if not path.is_file():
            raise ModelError(
                f"the weights object '{key}' is missing from {self.root}.",
                "re-export the model; do not delete files from an export.",
            )
        kept = torch_dtype(self.placement)

        def cast(name: str, value: torch.Tensor) -> torch.Tensor:
            if not value.is_floating_point():
                return value
            return value.to(kept if keep and name.startswith(keep) else dtype)

        with safe_open(str(path), framework="pt", device=self.placement.device) as f:
            return {key: cast(key, f.get_tensor(key)) for key in f.keys()}  # noqa: SIM118

    def _filled(
        self,
        make: Callable[[], nn.Module],
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        *,
        int8: bool = False,
    ) -> nn.Module:
        """The module `make` builds, made on the placement's device at `dtype` (its linear
        layers and embeddings int8 when `int8`) and filled."""
        with torch.device(self.placement.device):
            module = make().to(dtype=dtype)
        if int8:
            int8_shells(module)
        module.load_state_dict(tensors, strict=True)
        return module.eval().requires_grad_(False)

    def _router(self, tensors: dict[str, torch.Tensor]) -> Router:
        weight = tensors["linear.weight"]
        bias = "linear.bias" in tensors
        linear = self._filled(
            lambda: nn.Linear(weight.shape[1], weight.shape[0], bias=bias),
            _sub(tensors, "linear"),
            torch_dtype(self.placement),
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
        return SharedExpert.stored(
            tensors,
            kind=m.expert_kind,  # type: ignore[arg-type]
            act=m.activation,
        ).eval()

    def _stack(self, make: Callable[[], nn.Module], tensors: dict[str, torch.Tensor]) -> nn.Module:
        return self._filled(make, tensors, self.dtype("layer"), int8=self._int8_stack)

    def head(self) -> HeadStage:
        tensors = self._tensors(HEAD_KEY, self.dtype("head"))
        return HeadStage(self._stack(self.family.new_head, _sub(tensors, "head")))

    def layer(self, layer: int) -> LayerStage:
        tensors = self._tensors(layer_key(layer), self.dtype("layer"), keep="router.")
        combine = None
        if layer > 0:
            combine = self._stack(self.family.new_combine, _sub(tensors, "combine"))
        block = self._stack(lambda: self.family.new_block(layer), _sub(tensors, "block"))
        router = self._router(_sub(tensors, "router"))
        return LayerStage(combine, block, router, self._shared(_sub(tensors, "shared")))

    def expert(self, layer: int, expert: int) -> ExpertStage:
        m = self.manifest
        tensors = self._tensors(expert_key(layer, expert), self.dtype("expert"))
        return ExpertStage(tensors, m.expert_kind, m.activation)

    def tail(self) -> TailStage:
        tensors = self._tensors(TAIL_KEY, self.dtype("tail"))
        combine = self._stack(self.family.new_combine, _sub(tensors, "combine"))
        return TailStage(combine, self._stack(self.family.new_tail, _sub(tensors, "tail")))


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
            if tokens.numel()
        ]
        return gather_shards(out.ffn_in.shape[0], hidden, parts, like=out.ffn_in)

    return call


def run_staged(root: str | Path, input_ids: torch.Tensor) -> torch.Tensor:
    """Run windows through the exported stages one by one, each expert on its own shard."""
    loader = StageLoader(root)
    m = loader.manifest
    experts = local_experts(loader.expert, m.experts, m.hidden_size)
    return run_stages(loader, m.num_layers, input_ids, experts)
