"""Multi-axis RoPE (M-RoPE): which position axis each frequency pair of a head reads.

Qwen2-VL (Wang et al. 2024, arXiv 2409.12191, section 2.1) gives every token three
position indices, time, height and width, and rotates each pair of features by one of
them: the ``P = rotary_dim / 2`` pairs are cut into ``sections`` (``mrope_section`` in a
config, e.g. ``[16, 24, 24]`` for a 128-wide head), and pair ``j`` turns by
``p[axis(j)] · θ_j``, with the one frequency ladder ``θ_j = base^(-2j / rotary_dim)`` of
1-D RoPE. A text token has the same index on every axis, so for text the map changes
nothing: M-RoPE is 1-D RoPE there.

Two layouts of the sections ship:

- ``"chunked"`` (Qwen2-VL, Qwen2.5-VL): the first ``sections[0]`` pairs read axis 0, the
  next ``sections[1]`` axis 1, and so on. Time gets the fastest frequencies, width the
  slowest.
- ``"interleaved"`` (Qwen3-VL, Qwen3.5, ``mrope_interleaved``): pair ``j`` reads axis
  ``a = j mod A`` (``A`` axes) when ``a ≥ 1`` and ``j < A · sections[a]``, and axis 0
  otherwise: T, H, W, T, H, W, ..., then T for the pairs left. Every axis gets
  frequencies from the whole ladder.

:class:`pecode.rope.RotaryEmbedding` takes ``sections=`` and ``section_layout=`` and then
rotates by positions ``[B, L, A]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["SECTION_LAYOUTS", "mrope_pair_axes", "mrope_positions"]

SECTION_LAYOUTS = ("chunked", "interleaved")


def mrope_pair_axes(sections: Sequence[int], layout: str = "chunked") -> Tensor:
    """The position axis each frequency pair reads, for ``sections`` laid out as ``layout``.

    Shapes::

        sections: A positive ints, one per axis (time, height, width, ...)
        returns:  [sum(sections)] int64, entry j the axis pair j reads

    Raises:
        TypeError: ``sections`` is not a list or tuple of ints, or ``layout`` not a str.
        ValueError: fewer than two sections, a section that is not positive, an unknown
            ``layout``, or sections the interleaved layout cannot give their counts
            (an axis ``a ≥ 1`` whose ``A · sections[a]`` runs past the pairs).
    """
    if not isinstance(sections, list | tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in sections
    ):
        raise TypeError(f"sections must be a list or tuple of ints, got {sections!r}")
    if len(sections) < 2 or min(sections) < 1:
        raise ValueError(
            "sections must be two or more positive pair counts (one per axis), got "
            f"{list(sections)}"
        )
    if not isinstance(layout, str):
        raise TypeError(f"section_layout must be a str, got {type(layout).__name__}")
    if layout not in SECTION_LAYOUTS:
        raise ValueError(f"section_layout must be one of {list(SECTION_LAYOUTS)}, got {layout!r}")
    axes = len(sections)
    pairs = torch.arange(sum(sections))
    if layout == "chunked":
        return torch.repeat_interleave(torch.arange(axes), torch.tensor(list(sections)))
    axis = torch.zeros_like(pairs)
    for a in range(1, axes):
        mine = (pairs % axes == a) & (pairs < axes * sections[a])
        axis[mine] = a
    counts = torch.bincount(axis, minlength=axes).tolist()
    if counts != list(sections):
        raise ValueError(
            f"sections {list(sections)} cannot be interleaved over {len(pairs)} pairs: the "
            f"interleaved layout gives the axes {counts} pairs (axis a >= 1 takes pairs "
            f"a, a + {axes}, ... below {axes}·sections[a])"
        )
    return axis


def mrope_positions(
    segments: Sequence[int | Sequence[float]], *, start: int = 0
) -> tuple[Tensor, int]:
    """The (time, height, width) positions of a sequence of text runs and vision grids.

    Qwen2-VL's rule (Wang et al. 2024, section 2.1): a text token has its running index
    on all three axes; a vision grid of ``t × h × w`` tokens (after the vision tower's
    merging, in raster order: time, then rows, then columns) starts at the next index
    ``s`` and gives token ``(i, j, k)`` the positions ``(s + ⌊i · step⌋, s + j, s + k)``,
    ``step`` the time step between frames (1 for an image; Qwen2.5-VL spaces video
    frames by their time in seconds times ``tokens_per_second``); whatever follows
    starts one past the largest position so far. So a sequence of ``L`` tokens ends
    below position ``L`` when it holds grids, and decoding continues from the returned
    ``next`` index, not from ``L``: ``next - L`` is the ``rope_deltas`` transformers
    keeps between calls.

    Args:
        segments: in order, an int ``n`` for ``n`` text tokens, or a grid ``(t, h, w)``
            or ``(t, h, w, step)``.
        start: the first index (a non-negative int).

    Shapes::

        returns: (positions [L, 3] int64, next: int)

    Raises:
        TypeError: a segment is neither an int nor a tuple or list of 3 or 4 numbers.
        ValueError: a count that is not positive, a negative ``step`` or ``start``.
    """
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"start must be a non-negative int, got {start!r}")
    pieces, current = [], start
    for index, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool):
            if segment < 1:
                raise ValueError(f"segments[{index}]: a text run of {segment} tokens")
            pieces.append((torch.arange(segment) + current)[:, None].expand(segment, 3))
        elif isinstance(segment, list | tuple) and len(segment) in (3, 4):
            t, h, w = segment[:3]
            step = segment[3] if len(segment) == 4 else 1
            if not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (t, h, w)
            ):
                raise ValueError(
                    f"segments[{index}]: grid sizes must be positive ints, got {segment!r}"
                )
            if not isinstance(step, int | float) or isinstance(step, bool) or step < 0:
                raise ValueError(
                    f"segments[{index}]: step must be a non-negative number, got {step!r}"
                )
            times = (torch.arange(t, dtype=torch.float64) * step).long()
            grid = torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
            pieces.append(torch.stack(grid, dim=-1).reshape(-1, 3) + current)
        else:
            raise TypeError(
                f"segments[{index}] must be an int (text tokens) or a (t, h, w[, step]) grid, "
                f"got {segment!r}"
            )
        current = int(pieces[-1].max()) + 1
    if not pieces:
        return torch.zeros(0, 3, dtype=torch.int64), start
    return torch.cat(pieces), current
