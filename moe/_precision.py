"""A model at a weight precision (`ground.precision`): the in-process model a deployment at that
precision must equal, and the hardware check that refuses bfloat16 where it would crawl.

The MoEfied model is fitted, cached and judged in float32 once; a precision is applied to it
afterwards, in a second or two, and deterministically: the same float32 model gives the same
int8 values and scales every time, so the cache keeps one entry per MoEfication, not one per
precision, and the export written from the converted model is what the functions serve.

* ``bf16``: the stack's modules (head, attention blocks, combines, tail, shared experts) or the
  experts cast to bfloat16. The gate stays float32 (`moe._experts.Router` casts its input).
* ``int8``: every linear layer and embedding of the stack, and each expert's two matrices,
  quantized per output channel (`moe._int8`).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from ground.errors import UsageError
from ground.precision import Weights
from moe._int8 import quantize_stack
from moe._moe_model import MoEModel
from moe._placement import check_precision

__all__ = ["at_precision"]


def at_precision(model: MoEModel, weights: Weights) -> MoEModel:
    """`model` (float32) with its weights at `weights`: a new model, the given one unchanged.

    Raises:
        UsageError: The model is already at another precision than float32 (precisions are
            applied to the float32 model once, never stacked), or the CPU cannot run bf16.
    """
    if weights == model.weights:
        return model
    if not model.weights.is_fp32:
        raise UsageError(
            f"{model.name} is already at --weights {model.weights.label()}; a precision is "
            "applied to the float32 model.",
            "load the model again (float32) and ask for the precision you want.",
        )
    check_precision(weights)
    new = copy.deepcopy(model)
    stack = [new.head, *new.blocks, *new.combines, new.tail]
    shared = list(new.shared)
    if weights.stack == "bf16":
        for module in stack:
            module.to(torch.bfloat16)
        shared = [None if s is None else s.to(torch.bfloat16) for s in shared]
    elif weights.stack == "int8":
        for module in stack:
            quantize_stack(module)
        shared = [None if s is None else s.quantize() for s in shared]
    banks = new.banks
    if weights.experts == "bf16":
        banks = [bank.to(torch.bfloat16) for bank in banks]
    elif weights.experts == "int8":
        banks = [bank.quantize() for bank in banks]
    # the float32 model's quality is not this one's: `quality_of` measures it again
    return dataclasses.replace(new, banks=banks, shared=shared, weights=weights, quality=None)
