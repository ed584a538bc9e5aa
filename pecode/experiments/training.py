"""The one training loop of chapters 13 and 14: AdamW, warm-up and cosine decay, clipping.

Both chapters train a :class:`~pecode.experiments.TinyDecoder` the same way and differ
only in what a step's loss is (a copy and a needle in chapter 13, the next character in
chapter 14), so :func:`fit` takes that loss as a function and owns everything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["fit", "learning_rate"]


def learning_rate(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over the first tenth of the steps, then cosine decay to zero."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def fit(
    model: nn.Module,
    step_loss: Callable[[], Tensor],
    *,
    steps: int,
    lr: float,
    on_step: Callable[[], None] | None = None,
) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps; return the loss of every step.

    ``step_loss()`` draws a step's batch and returns its loss under ``model``; it is
    called once per step, after the learning rate is set, so a seeded generator inside
    it draws the same batches in every run. AdamW with weight decay 0.01, the schedule
    of :func:`learning_rate`, the gradient clipped to norm 1. The model is left in eval
    mode.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr)
        loss = step_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step()
    model.eval()
    return losses
