"""Index arithmetic that several relative schemes share: one entry per (query, key) pair."""

from __future__ import annotations

from torch import Tensor

from pecode._checks import check_position_pair


def pairwise_offsets(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """``k_positions[j] - q_positions[i]``: ``[Lq, Lk]``, or ``[B, Lq, Lk]`` if batched.

    Raises:
        TypeError, ValueError: as :func:`pecode._checks.check_position_pair`.
    """
    check_position_pair(q_positions, k_positions)
    return k_positions.unsqueeze(-2) - q_positions.unsqueeze(-1)


def check_batch(index: Tensor, batch: int, name: str) -> None:
    """Raise unless a batched ``index`` (``[B', Lq, Lk]``) has ``B'`` 1 or ``batch``.

    ``name`` is the caller's per-head argument, of batch ``batch``, that the positions
    must fit.

    Raises:
        ValueError: batched positions whose batch is neither 1 nor ``batch``.
    """
    if index.dim() == 3 and index.shape[0] not in (1, batch):
        raise ValueError(
            f"q_positions and k_positions have batch {index.shape[0]}, {name} has batch {batch}"
        )


def index_for_heads(index: Tensor, batch: int, heads: int, name: str = "q") -> Tensor:
    """``[Lq, Lk]`` or ``[B, Lq, Lk]`` index -> expanded view ``[B, H, Lq, Lk]``.

    Raises:
        ValueError: as :func:`check_batch`.
    """
    check_batch(index, batch, name)
    if index.dim() == 3:
        index = index.unsqueeze(1)
    return index.expand(batch, heads, *index.shape[-2:])
