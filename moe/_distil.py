"""A short end-to-end distillation of a MoEfied model's experts against the dense model.

What the closed-form recovery (shared expert, output-fitted routers, least-squares correction)
cannot reach is the part of the dense FFN that no linear function of the routed neurons
reproduces. Distillation lets the experts' input weights move too. The gate is not trained (its
top-k choice has no gradient); the attention, norms, embeddings and task head stay the dense
model's, so the served model is still the user's everywhere but the FFN.

Loss, on windows of the training text (never the held-out quality windows):

* encoders: mean squared error of the last hidden states (over the teacher's variance) plus
  ``1 - cosine`` of the sentence embeddings, the task output;
* decoders: KL(dense || MoE) of the next-token distributions.

The text is every window of the corpus's fit part (`moe._corpus.training_windows`), not just
the routers' fit tokens: on 16,384 tokens distillation overfits (held-out cosine falls), on the
embedded corpus's ~1 M it keeps improving. Adam with a cosine-decayed learning rate,
`BATCH_WINDOWS` windows a step, drawn without replacement in a seeded order that starts over when
the text runs out.

How many steps to keep is chosen on the validation part, never the test part quality is
reported on: the same loss on `VALIDATION_WINDOWS` validation windows is measured
`VALIDATION_CHECKS` times along the run, and the experts of the lowest are kept. The recipe's
constants (learning rate, batch, schedule) were chosen on the windows that are now the validation
part too (docs/model.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from moe._quality import DenseRunner

if TYPE_CHECKING:
    from moe._moe_model import MoEModel

__all__ = ["RECIPE", "VALIDATION_WINDOWS", "Distillation", "distil", "distil_exposure"]

LEARNING_RATE = 2e-4
BATCH_WINDOWS = 16
VALIDATION_WINDOWS = 64
VALIDATION_CHECKS = 20
# What a cached distilled model depends on beyond its options (part of the cache key).
RECIPE = {
    "lr": LEARNING_RATE,
    "batch": BATCH_WINDOWS,
    "schedule": "cosine",
    "text": "fit part",
    "keep": f"lowest validation loss of {VALIDATION_CHECKS} checks on {VALIDATION_WINDOWS}",
}


@dataclass
class Distillation:
    """What a run did: the training loss per step, the validation loss at each check (step,
    loss; step 0 is before training) and the step whose experts were kept."""

    losses: list[float] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)
    kept_step: int = 0


def distil_exposure(steps: int, windows: int) -> dict[str, int | float]:
    """How much text `steps` steps see in a fit part of `windows` windows: the distinct windows
    and the passes over them (a small corpus is seen many times, and may be overfitted: its
    validation loss then chooses an early step)."""
    return {
        "windows": windows,
        "epochs": round(steps * min(BATCH_WINDOWS, windows) / max(windows, 1), 2),
    }


def _student(model: MoEModel, ids: torch.Tensor) -> torch.Tensor:
    """The MoE forward with gradients through the experts (the tail's input)."""
    batch, length = ids.shape
    with torch.no_grad():
        hidden = model.head(ids)
    for layer, (block, router, bank, combine) in enumerate(
        zip(model.blocks, model.routers, model.banks, model.combines, strict=True)
    ):
        out = block(hidden)
        x = out.ffn_in.reshape(batch * length, -1)
        with torch.no_grad():
            idx, weights, _ = router(x)
        y = bank.sparse(x, idx, weights)
        shared = model.shared_expert(layer)
        if shared is not None:
            y = y + shared(x)
        hidden = combine(out.residual, y.view(batch, length, -1))
    return hidden


def _loss(model: MoEModel, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    if model.family.name == "bert":
        mse = (student - teacher).pow(2).mean() / teacher.var().clamp_min(1e-12)
        cos = nn.functional.cosine_similarity(model.tail(student), model.tail(teacher), dim=-1)
        return mse + (1.0 - cos).mean()
    logp_s = torch.log_softmax(model.tail(student)[:, :-1].float(), dim=-1)
    with torch.no_grad():
        logp_t = torch.log_softmax(model.tail(teacher)[:, :-1].float(), dim=-1)
    return nn.functional.kl_div(logp_s, logp_t, log_target=True, reduction="batchmean") / (
        student.shape[1] - 1
    )


def _trainable(model: MoEModel) -> list[nn.Parameter]:
    params: list[Any] = []
    for layer, bank in enumerate(model.banks):
        params += [p for p in (bank.w_in, bank.b_in, bank.w_out, bank.b_out) if p is not None]
        shared = model.shared_expert(layer)
        if shared is not None:
            params += [p for p in shared.parameters() if p.numel()]
    return params


@torch.no_grad()
def _validation_loss(model: MoEModel, dense: DenseRunner, windows: torch.Tensor) -> float:
    total = 0.0
    for start in range(0, windows.shape[0], BATCH_WINDOWS):
        ids = windows[start : start + BATCH_WINDOWS]
        loss = _loss(model, _student(model, ids), dense.hidden(ids)).item()
        total += loss * ids.shape[0]
    return total / windows.shape[0]


def distil(
    model: MoEModel,
    parts: dict[str, Any],
    windows: torch.Tensor,
    *,
    steps: int,
    validation: torch.Tensor | None = None,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Distillation:
    """Train `model`'s experts for `steps` steps against the dense `parts`.

    Args:
        model: The MoEfied model; its expert (and shared-expert) weights change in place.
        parts: The dense model's stage modules (`Family.parts_from_hf`).
        windows: (n, T) token windows of the fit part.
        steps: Optimiser steps.
        validation: (m, T) windows of the validation part: the experts of the check with the
            lowest loss on them are kept. None keeps the last step's.
        seed: Seeds the draw of windows. Defaults to the model's seed.
        progress: Called with the step and the loss every 1 % of the steps (at least 10).
    """
    from moe._families import Family

    family: Family = model.family
    dense = DenseRunner(family, parts)
    params = _trainable(model)
    for p in params:
        p.requires_grad_(True)
    frozen = [
        p
        for module in (*model.blocks, *model.combines, model.tail)
        for p in module.parameters()
        if p.requires_grad
    ]
    for p in frozen:
        p.requires_grad_(False)
    optimizer = torch.optim.Adam(params, lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1))
    generator = torch.Generator().manual_seed(model.seed if seed is None else seed)
    order = torch.randperm(windows.shape[0], generator=generator)
    every = max(10, steps // 100)
    checks = (
        set()
        if validation is None
        else {round(steps * (i + 1) / VALIDATION_CHECKS) for i in range(VALIDATION_CHECKS)}
    )
    run = Distillation()
    losses = run.losses
    best: list[torch.Tensor] = []

    def check(step: int) -> None:
        assert validation is not None
        loss = _validation_loss(model, dense, validation)
        run.validation.append((step, loss))
        if loss <= min(v for _, v in run.validation):
            run.kept_step = step
            best[:] = [p.detach().clone() for p in params]

    if validation is not None:
        check(0)
    try:
        with torch.enable_grad():
            for step in range(steps):
                ids = windows[
                    order[(torch.arange(BATCH_WINDOWS) + step * BATCH_WINDOWS) % len(order)]
                ]
                loss = _loss(model, _student(model, ids), dense.hidden(ids))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                if progress is not None and (step % every == 0 or step == steps - 1):
                    progress(f"distilling: step {step + 1}/{steps}, loss {losses[-1]:.4f}")
                if step + 1 in checks:
                    check(step + 1)
    finally:
        for p in params:
            p.requires_grad_(False)
        for p in frozen:
            p.requires_grad_(True)
    if validation is None:
        run.kept_step = steps
    else:
        with torch.no_grad():
            for p, kept in zip(params, best, strict=True):
                p.copy_(kept)
        if progress is not None:
            progress(f"distilled: kept step {run.kept_step} of {steps} (lowest validation loss)")
    return run
