"""Experts and the gate: the parts of an MoE layer that the expert and layer functions run.

Two expert shapes cover every model we load:

* ``"mlp"`` (BERT): ``act(x W_in^T + b_in) W_out^T``; the output bias of the dense FFN is not
  split and stays with the non-MoE part of the layer.
* ``"glu"`` (Llama, Mixtral, OLMoE): ``(act(x W_g^T) * (x W_u^T)) W_out^T`` with ``W_in`` holding
  ``W_g`` and ``W_u`` stacked, as Hugging Face stores ``gate_up_proj``.

Weights are stacked over experts, ``w_in`` (E, f_in, h) and ``w_out`` (E, h, f), so exporting one
expert is a slice and the grouped forward can index them. An expert may add an output bias
``b_out`` (h,): the least-squares output correction gives each expert one.

Routing is an (n, k) tensor of expert indices. With adaptive k a token may take fewer than k
experts: its unused slots hold the index E (one past the last expert) with weight 0, so every
consumer drops them by the same rule (`routing_shards`, the trace's counts, the gate's scatter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from moe._int8 import Int8Matrix
from moe._options import TopK

__all__ = [
    "ExpertBank",
    "ExpertKind",
    "Router",
    "SharedExpert",
    "Weighting",
    "activations",
    "adaptive_keep",
    "expert_ffn",
    "gather_shards",
    "linear",
    "matrix_of",
    "matrix_tensors",
    "routing_shards",
]

Matrix = torch.Tensor | Int8Matrix
"""A weight as a stage holds it: a float tensor (float32 or bfloat16), or int8 (`moe._int8`),
whose bias is packed with it."""

ExpertKind = Literal["mlp", "glu"]
Weighting = Literal["unit", "softmax", "softmax_renorm"]

# The activations of every model we ship, as Hugging Face defines them under these names
# (`transformers.activations.ACT2FN`; a test holds them equal). Importing transformers costs an
# expert function's INIT about 4 s on top of torch's 3.5 s, billed and waited on at every cold
# start, for a one-line function; other names still go to transformers.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
    "silu": nn.functional.silu,
    "swish": nn.functional.silu,
}


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in _ACTIVATIONS:
        return _ACTIVATIONS[name]
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def linear(x: torch.Tensor, w: Matrix, b: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b at the weight's precision, returned in x's dtype (an expert of one precision
    serves a stack of another: `ground.precision`)."""
    if isinstance(w, Int8Matrix):
        if b is not None:
            raise ValueError("an int8 weight carries its bias packed with it")
        return w(x)
    if w.dtype == x.dtype:
        return nn.functional.linear(x, w, b)
    return nn.functional.linear(x.to(w.dtype), w, b).to(x.dtype)


def matrix_tensors(
    w_name: str, b_name: str, w: Matrix, b: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """A weight and its bias as a weight file stores them (an int8 weight adds its scales)."""
    if isinstance(w, Int8Matrix):
        values, scale, bias = w.stored()
        out = {w_name: values, f"{w_name}_scale": scale}
        return out | ({} if bias is None else {b_name: bias})
    return {w_name: w} | ({} if b is None else {b_name: b})


def matrix_of(
    tensors: dict[str, torch.Tensor], w_name: str, b_name: str
) -> tuple[Matrix, torch.Tensor | None]:
    """The weight and bias `matrix_tensors` stored (int8 when its scales are there)."""
    if f"{w_name}_scale" in tensors:
        matrix = Int8Matrix(tensors[w_name], tensors[f"{w_name}_scale"], tensors.get(b_name))
        return matrix, None
    return tensors[w_name], tensors.get(b_name)


def expert_ffn(
    x: torch.Tensor,
    w_in: Matrix,
    b_in: torch.Tensor | None,
    w_out: Matrix,
    kind: ExpertKind,
    act: str,
    b_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One expert on a (n, h) block of tokens; the single definition every path calls."""
    return linear(activations(x, w_in, b_in, kind, act), w_out, b_out)


def activations(
    x: torch.Tensor, w_in: Matrix, b_in: torch.Tensor | None, kind: ExpertKind, act: str
) -> torch.Tensor:
    """The (n, f) intermediate activations of an FFN (or of one expert's neurons)."""
    hidden = linear(x, w_in, b_in)
    if kind == "glu":
        gate, up = hidden.chunk(2, dim=-1)
        return _activation(act)(gate) * up
    return _activation(act)(hidden)


class ExpertBank(nn.Module):
    """All experts of one MoE layer, with weights stacked along the first axis.

    At int8 (`quantize`) each expert holds its own two packed matrices instead (`int8`), and
    the stacked float weights are dropped: the bank keeps one copy of its weights.
    """

    def __init__(
        self,
        w_in: torch.Tensor,
        b_in: torch.Tensor | None,
        w_out: torch.Tensor,
        *,
        kind: ExpertKind,
        act: str,
        b_out: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.w_in = nn.Parameter(w_in, requires_grad=False)
        self.b_in = None if b_in is None else nn.Parameter(b_in, requires_grad=False)
        self.w_out = nn.Parameter(w_out, requires_grad=False)
        self.b_out = None if b_out is None else nn.Parameter(b_out, requires_grad=False)
        self.kind: ExpertKind = kind
        self.act = act
        self.int8: list[tuple[Int8Matrix, Int8Matrix]] | None = None

    @classmethod
    def of_int8(
        cls, matrices: list[tuple[Int8Matrix, Int8Matrix]], *, kind: ExpertKind, act: str
    ) -> ExpertBank:
        """A bank of int8 experts, each (w_in with b_in, w_out with b_out) packed."""
        bank = cls(torch.empty(0), None, torch.empty(0), kind=kind, act=act)
        bank.w_in = bank.w_out = None  # type: ignore[assignment]
        bank.int8 = matrices
        return bank

    def quantize(self) -> ExpertBank:
        """This bank with int8 experts (`moe._int8`)."""
        matrices = [
            (
                Int8Matrix.quantize(self.w_in[i], None if self.b_in is None else self.b_in[i]),
                Int8Matrix.quantize(self.w_out[i], None if self.b_out is None else self.b_out[i]),
            )
            for i in range(self.num_experts)
        ]
        return ExpertBank.of_int8(matrices, kind=self.kind, act=self.act)

    @property
    def num_experts(self) -> int:
        return len(self.int8) if self.int8 is not None else int(self.w_in.shape[0])

    @property
    def expert_width(self) -> int:
        """Neurons of one expert (f)."""
        if self.int8 is not None:
            return self.int8[0][1].in_features
        return int(self.w_out.shape[2])

    def expert_tensors(self, i: int) -> dict[str, torch.Tensor]:
        """The tensors of expert i alone: what its function downloads."""
        if self.int8 is not None:
            m_in, m_out = self.int8[i]
            return matrix_tensors("w_in", "b_in", m_in, None) | matrix_tensors(
                "w_out", "b_out", m_out, None
            )
        b_in = None if self.b_in is None else self.b_in[i]
        b_out = None if self.b_out is None else self.b_out[i]
        return matrix_tensors("w_in", "b_in", self.w_in[i], b_in) | matrix_tensors(
            "w_out", "b_out", self.w_out[i], b_out
        )

    def expert(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if self.int8 is not None:
            m_in, m_out = self.int8[i]
            return expert_ffn(x, m_in, None, m_out, self.kind, self.act)
        b_in = None if self.b_in is None else self.b_in[i]
        b_out = None if self.b_out is None else self.b_out[i]
        return expert_ffn(x, self.w_in[i], b_in, self.w_out[i], self.kind, self.act, b_out)

    def sparse(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token through its top-k experts only: the fast path the profiler runs."""
        parts = [
            (tokens, w, self.expert(i, x[tokens]))
            for i, (tokens, w) in enumerate(routing_shards(idx, weights, self.num_experts))
            if tokens.numel()  # a decode step's few rows leave most experts idle
        ]
        return gather_shards(x.shape[0], x.shape[1], parts, like=x)

    def dense_masked(
        self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """Every expert on every token, masked by the routing: the slow reference forward.

        It shares no gather/scatter code with `sparse` or the staged path, which is what makes it a
        useful reference for both.
        """
        # One column more for the unused slots of adaptive routing, dropped after the scatter.
        combine = torch.zeros(x.shape[0], self.num_experts + 1, dtype=x.dtype, device=x.device)
        combine.scatter_(1, idx, weights.to(x.dtype))
        outs = torch.stack([self.expert(i, x) for i in range(self.num_experts)], dim=1)
        return (outs * combine[:, :-1, None]).sum(dim=1)


class SharedExpert(nn.Module):
    """The always-on part of a layer, run in the layer function on every token.

    Holds the shared expert's neurons (possibly none) and the layer's output-correction bias
    (possibly zero). Its output is added to the residual the layer function hands on, so the
    gather and combine downstream are unchanged. At int8 its matrices are packed
    (`quantize`) with their biases; the correction bias alone stays float32.
    """

    def __init__(
        self,
        w_in: Matrix,
        b_in: torch.Tensor | None,
        w_out: Matrix,
        b_out: torch.Tensor | None,
        *,
        kind: ExpertKind,
        act: str,
    ) -> None:
        super().__init__()
        self.w_in = w_in if isinstance(w_in, Int8Matrix) else nn.Parameter(w_in, False)
        self.b_in = None if b_in is None else nn.Parameter(b_in, requires_grad=False)
        self.w_out = w_out if isinstance(w_out, Int8Matrix) else nn.Parameter(w_out, False)
        self.b_out = None if b_out is None else nn.Parameter(b_out, requires_grad=False)
        self.kind: ExpertKind = kind
        self.act = act

    @property
    def width(self) -> int:
        """Neurons of the shared expert (0 when it holds only a correction bias)."""
        if isinstance(self.w_out, Int8Matrix):
            return self.w_out.in_features
        return int(self.w_out.shape[1])

    def quantize(self) -> SharedExpert:
        """This shared expert with int8 matrices (the correction bias alone: unchanged)."""
        if self.width == 0 or isinstance(self.w_in, Int8Matrix):
            return self
        return SharedExpert(
            Int8Matrix.quantize(self.w_in, self.b_in),
            None,
            Int8Matrix.quantize(self.w_out, self.b_out),
            None,
            kind=self.kind,
            act=self.act,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the layer's weight file holds of it (`SharedExpert.stored` reads it back)."""
        return matrix_tensors("w_in", "b_in", self.w_in, self.b_in) | matrix_tensors(
            "w_out", "b_out", self.w_out, self.b_out
        )

    @classmethod
    def stored(
        cls, tensors: dict[str, torch.Tensor], *, kind: ExpertKind, act: str
    ) -> SharedExpert:
        w_in, b_in = matrix_of(tensors, "w_in", "b_in")
        w_out, b_out = matrix_of(tensors, "w_out", "b_out")
        return cls(w_in, b_in, w_out, b_out, kind=kind, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.width == 0:
            assert self.b_out is not None
            return self.b_out.to(x.dtype).expand(x.shape[0], -1)
        return expert_ffn(x, self.w_in, self.b_in, self.w_out, self.kind, self.act, self.b_out)


class Router(nn.Module):
    """The linear gate computed before the experts, with top-k routing.

    ``weighting`` says how selected experts are combined: ``"unit"`` adds their outputs as they are
    (MoEfied models: the experts partition one FFN, so the sum over all experts is the dense FFN),
    ``"softmax"`` scales by the gate probability (OLMoE), and ``"softmax_renorm"`` by the
    probability renormalised over the top-k (Mixtral).

    ``rule`` decides how many experts a token takes (`moe.TopK`): always k, or adaptively, in
    which case a token's unused slots hold the index E with weight and probability 0.
    """

    def __init__(self, linear: nn.Linear, *, top_k: int | TopK, weighting: Weighting) -> None:
        super().__init__()
        self.linear = linear
        self.rule = top_k if isinstance(top_k, TopK) else TopK(k=top_k)
        self.weighting: Weighting = weighting

    @property
    def top_k(self) -> int:
        """The most experts a token takes (the width of the routing tensor)."""
        return self.rule.k

    @property
    def num_experts(self) -> int:
        return int(self.linear.weight.shape[0])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Route (n, h) tokens: top-k expert indices, combine weights and gate probabilities."""
        # the gate keeps its own dtype (float32 beside a bfloat16 stack: `ground.precision`)
        probs = torch.softmax(linear(x, self.linear.weight, self.linear.bias).float(), dim=-1)
        top_p, idx = torch.topk(probs, self.top_k, dim=-1)
        keep = None
        if self.rule.adaptive:
            keep = adaptive_keep(top_p, self.rule)
            idx = torch.where(keep, idx, self.num_experts)
            top_p = top_p * keep
        if self.weighting == "unit":
            weights = torch.ones_like(top_p) if keep is None else keep.to(top_p.dtype)
        elif self.weighting == "softmax_renorm":
            weights = top_p / top_p.sum(dim=-1, keepdim=True)
        else:
            weights = top_p
        return idx, weights.to(x.dtype), top_p


def adaptive_keep(top_p: torch.Tensor, rule: TopK) -> torch.Tensor:
    """(n, k) which of each token's top-k (probabilities in descending order) it takes.

    The first expert is always taken. ``gap``: the second too when p1 - p2 <= threshold.
    ``mass``: each next one while the probability of those before it is below the threshold.
    """
    assert rule.threshold is not None
    if rule.rule == "gap":
        keep = torch.ones_like(top_p, dtype=torch.bool)
        keep[:, 1:] = (top_p[:, :1] - top_p[:, 1:]) <= rule.threshold
        return keep
    before = top_p.cumsum(dim=-1) - top_p
    return before < rule.threshold


def routing_shards(
    idx: torch.Tensor, weights: torch.Tensor, num_experts: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split routed tokens per expert: for expert i, its token positions and combine weights.

    This is the gate's scatter: one argsort instead of a mask per expert. Unused slots (index
    `num_experts`, adaptive routing) sort last and are dropped.
    """
    flat_expert = idx.reshape(-1)
    order = torch.argsort(flat_expert, stable=True)
    tokens = order // idx.shape[1]
    w = weights.reshape(-1)[order]
    counts = torch.bincount(flat_expert, minlength=num_experts + 1).tolist()
    return list(zip(tokens.split(counts), w.split(counts), strict=True))[:num_experts]


def gather_shards(
    n_tokens: int,
    hidden: int,
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    like: torch.Tensor | None = None,
) -> torch.Tensor:
    """Add each expert's outputs, scaled by the combine weights, back at their tokens' places
    (on the outputs' device, at their dtype; `like`'s when no expert ran)."""
    first = parts[0][2] if parts else (like if like is not None else torch.zeros(0))
    out = torch.zeros(n_tokens, hidden, dtype=first.dtype, device=first.device)
    for tokens, weights, y in parts:
        if tokens.numel():
            out.index_add_(0, tokens, y * weights[:, None].to(y.dtype))
    return out
