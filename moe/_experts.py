"""Experts and the gate: the parts of an MoE layer that the expert and layer functions run.

Two expert shapes cover every model we load:

* ``"mlp"`` (BERT): ``act(x W_in^T + b_in) W_out^T``; the output bias of the dense FFN is not
  split and stays with the non-MoE part of the layer.
* ``"glu"`` (Llama, Mixtral, OLMoE): ``(act(x W_g^T) * (x W_u^T)) W_out^T`` with ``W_in`` holding
  ``W_g`` and ``W_u`` stacked, as Hugging Face stores ``gate_up_proj``.

Weights are stacked over experts, ``w_in`` (E, f_in, h) and ``w_out`` (E, h, f), so exporting one
expert is a slice and the grouped forward can index them.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from transformers.activations import ACT2FN

__all__ = [
    "ExpertBank",
    "ExpertKind",
    "Router",
    "Weighting",
    "expert_ffn",
    "gather_shards",
    "routing_shards",
]

ExpertKind = Literal["mlp", "glu"]
Weighting = Literal["unit", "softmax", "softmax_renorm"]


def expert_ffn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: torch.Tensor | None,
    w_out: torch.Tensor,
    kind: ExpertKind,
    act: str,
) -> torch.Tensor:
    """One expert on a (n, h) block of tokens; the single definition every path calls."""
    hidden = nn.functional.linear(x, w_in, b_in)
    if kind == "glu":
        gate, up = hidden.chunk(2, dim=-1)
        hidden = ACT2FN[act](gate) * up
    else:
        hidden = ACT2FN[act](hidden)
    return nn.functional.linear(hidden, w_out)


class ExpertBank(nn.Module):
    """All experts of one MoE layer, with weights stacked along the first axis."""

    def __init__(
        self,
        w_in: torch.Tensor,
        b_in: torch.Tensor | None,
        w_out: torch.Tensor,
        *,
        kind: ExpertKind,
        act: str,
    ) -> None:
        super().__init__()
        self.w_in = nn.Parameter(w_in, requires_grad=False)
        self.b_in = None if b_in is None else nn.Parameter(b_in, requires_grad=False)
        self.w_out = nn.Parameter(w_out, requires_grad=False)
        self.kind: ExpertKind = kind
        self.act = act

    @property
    def num_experts(self) -> int:
        return int(self.w_in.shape[0])

    def expert_tensors(self, i: int) -> dict[str, torch.Tensor]:
        """The tensors of expert i alone: what its function downloads."""
        tensors = {"w_in": self.w_in[i], "w_out": self.w_out[i]}
        if self.b_in is not None:
            tensors["b_in"] = self.b_in[i]
        return tensors

    def expert(self, i: int, x: torch.Tensor) -> torch.Tensor:
        b_in = None if self.b_in is None else self.b_in[i]
        return expert_ffn(x, self.w_in[i], b_in, self.w_out[i], self.kind, self.act)

    def sparse(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token through its top-k experts only: the fast path the profiler runs."""
        parts = [
            (tokens, w, self.expert(i, x[tokens]))
            for i, (tokens, w) in enumerate(routing_shards(idx, weights, self.num_experts))
        ]
        return gather_shards(x.shape[0], x.shape[1], parts)

    def dense_masked(
        self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """Every expert on every token, masked by the routing: the slow reference forward.

        It shares no gather/scatter code with `sparse` or the staged path, which is what makes it a
        useful reference for both.
        """
        combine = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype)
        combine.scatter_(1, idx, weights.to(x.dtype))
        outs = torch.stack([self.expert(i, x) for i in range(self.num_experts)], dim=1)
        return (outs * combine[:, :, None]).sum(dim=1)


class Router(nn.Module):
    """The linear gate computed before the experts, with top-k routing.

    ``weighting`` says how selected experts are combined: ``"unit"`` adds their outputs as they are
    (MoEfied models: the experts partition one FFN, so the sum over all experts is the dense FFN),
    ``"softmax"`` scales by the gate probability (OLMoE), and ``"softmax_renorm"`` by the
    probability renormalised over the top-k (Mixtral).
    """

    def __init__(self, linear: nn.Linear, *, top_k: int, weighting: Weighting) -> None:
        super().__init__()
        self.linear = linear
        self.top_k = top_k
        self.weighting: Weighting = weighting

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Route (n, h) tokens: top-k expert indices, combine weights and gate probabilities."""
        probs = torch.softmax(self.linear(x).float(), dim=-1)
        top_p, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.weighting == "unit":
            weights = torch.ones_like(top_p)
        elif self.weighting == "softmax_renorm":
            weights = top_p / top_p.sum(dim=-1, keepdim=True)
        else:
            weights = top_p
        return idx, weights.to(x.dtype), top_p


def routing_shards(
    idx: torch.Tensor, weights: torch.Tensor, num_experts: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split routed tokens per expert: for expert i, its token positions and combine weights.

    This is the gate's scatter: one argsort instead of a mask per expert.
    """
    flat_expert = idx.reshape(-1)
    order = torch.argsort(flat_expert, stable=True)
    tokens = order // idx.shape[1]
    w = weights.reshape(-1)[order]
    counts = torch.bincount(flat_expert, minlength=num_experts).tolist()
    return list(zip(tokens.split(counts), w.split(counts), strict=True))


def gather_shards(
    n_tokens: int, hidden: int, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Add each expert's outputs, scaled by the combine weights, back at their tokens' places."""
    dtype = parts[0][2].dtype if parts else torch.float32
    out = torch.zeros(n_tokens, hidden, dtype=dtype)
    for tokens, weights, y in parts:
        if tokens.numel():
            out.index_add_(0, tokens, y * weights[:, None].to(y.dtype))
    return out
