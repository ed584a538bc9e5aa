"""RoPE on a grid: each vision token rotates by its 2-D position (row, column).

A ViT cuts an image into ``height × width`` patches; 1-D RoPE over their raster index
``row · width + col`` would make the patch below a token (offset ``width``) look as far
away as the one ``width`` columns to its right, and that offset changes with the
image's width. 2-D RoPE gives every token two indices and turns each feature pair by a
linear function of both, ``angle_j = θ_{j,row} · row + θ_{j,col} · col``, so that the
score of a query and a key depends on their positions only through
``(Δrow, Δcol)`` (:func:`pecode.proofs.mrope.mixed_frequency_offsets`). Two choices of
the ``θ`` ship:

- :class:`AxialRotaryEmbedding`, *RoPE-Axial*: each pair reads one axis, the first
  quarter of the features' pairs the row and the next quarter the column, each with its
  own full ladder ``base^(-4i/head_dim)``. This is the vision tower of Qwen2-VL (and
  Qwen2.5-VL, Qwen3-VL) in Hugging Face transformers.
- :class:`MixedRotaryEmbedding`, *RoPE-Mixed* (Heo et al. 2024): every pair reads both
  axes with learned frequencies, one set per head, so a head can turn along a diagonal.

:func:`grid_positions` gives the positions ``[height · width, 2]`` in raster order.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pecode._checks import check_bool, check_heads, check_int, check_integer_tensor
from pecode.attention import PositionScheme
from pecode.frequencies import check_rope_base, check_rope_dim
from pecode.rope import _check_layout, apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["AxialRotaryEmbedding", "MixedRotaryEmbedding", "grid_positions"]


def grid_positions(height: int, width: int) -> Tensor:
    """The ``(row, column)`` of every token of a ``height × width`` grid, in raster order.

    Token ``r · width + c`` (rows first, as a ViT flattens its patches) is at ``(r, c)``.

    Shapes::

        returns: [height * width, 2] int64

    Raises:
        TypeError, ValueError: ``height`` or ``width`` is not a positive int.
    """
    check_int("height", height)
    check_int("width", width)
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return torch.stack((rows, cols), dim=-1).reshape(-1, 2)


def _check_head_dim(head_dim: object) -> int:
    check_rope_dim("head_dim", head_dim)
    if head_dim % 4 != 0:
        raise ValueError(
            f"head_dim must be a multiple of 4 (half of its pairs per axis), got {head_dim}"
        )
    return head_dim


def _check_grid(name: str, positions: object, least: int = 2, most: int = 3) -> Tensor:
    """``positions`` if it is an integer tensor ``[..., 2]`` of ``least`` to ``most`` axes."""
    check_integer_tensor(name, positions)
    if not least <= positions.dim() <= most or positions.shape[-1] != 2:
        raise ValueError(
            f"{name} must have shape [L, 2] or [B, L, 2], a (row, column) per token "
            f"(grid_positions(height, width)), got {tuple(positions.shape)}"
        )
    return positions


def _grid(positions: Tensor, name: str, x: Tensor, x_name: str) -> Tensor:
    """``positions`` ``[L, 2]`` or ``[B, L, 2]`` checked against ``x`` ``[..., L, Dh]``
    (``[B, H, L, Dh]`` for batched positions), returned as ``[B or 1, 1, L, 2]``."""
    _check_grid(name, positions)
    length, batched = x.shape[-2], positions.dim() == 3
    if positions.shape[-2] != length or (
        batched and (x.dim() != 4 or positions.shape[0] not in (1, x.shape[0]))
    ):
        raise ValueError(
            f"{name} of shape {tuple(positions.shape)} does not fit {x_name} of shape "
            f"{tuple(x.shape)}: give [{length}, 2], or [B, {length}, 2] for [B, H, {length}, Dh]"
        )
    return (positions if batched else positions[None])[:, None]


class AxialRotaryEmbedding(PositionScheme):
    """2-D RoPE with one axis per pair (RoPE-Axial), as Qwen2-VL's vision tower.

    Pair ``j`` of the ``head_dim / 2`` pairs turns by ``row · θ_j`` for
    ``j < head_dim / 4`` and by ``col · θ_{j - head_dim/4}`` for the rest, with the
    ladder ``θ_i = base^(-4i / head_dim)`` (:func:`~pecode.rope.rope_inv_freq` of
    ``head_dim / 2`` features): Heo et al. 2024 (arXiv 2403.13298), RoPE-Axial, and
    transformers' ``Qwen2VLVisionRotaryEmbedding`` (rope type ``"axial"``), whose angle
    table is ``cat(row angles, column angles)`` applied with ``rotate_half``: the
    ``"half"`` layout. Each axis gets the whole ladder; M-RoPE with two chunked sections
    (:class:`~pecode.rope.RotaryEmbedding` ``(sections=...)``) would instead split one
    ladder of ``head_dim / 2`` frequencies between them.

    :class:`~pecode.attention.MultiHeadAttention` passes this scheme positions
    ``[B, L, 2]`` (:attr:`position_axes`).

    Shapes::

        q: [B, H, L, head_dim]    k: [B, Hkv, L, head_dim]   (any [..., L, head_dim]
                                                             for positions [L, 2])
        q_positions, k_positions: [L, 2] or [B, L, 2] integer (row, column)

    Args:
        head_dim: the per-head width, a multiple of 4.
        base: the frequency base (10000 in Qwen2-VL, 100 in Heo et al.'s RoPE-Axial).
        layout: ``"half"`` (Qwen2-VL) or ``"interleaved"`` (adjacent features, as
            Heo et al.'s code), see :func:`~pecode.rope.apply_rope`.

    Raises:
        TypeError, ValueError: ``head_dim`` is not a positive multiple of 4, ``base``
            is not a finite number greater than 1, or ``layout`` is unknown.
    """

    position_axes = 2  # (row, column)

    def __init__(self, head_dim: int, *, base: float = 10000.0, layout: str = "half") -> None:
        super().__init__()
        self.head_dim = _check_head_dim(head_dim)
        _check_layout(layout)  # pecode.rope's, as RotaryEmbedding checks it
        self.base, self.layout = check_rope_base("base", base), layout
        # float64 here, rounded to float32 (or kept, for float64 inputs) per call
        self.inv_freq = rope_inv_freq(head_dim // 2, self.base, dtype=torch.float64)

    def cos_sin(
        self, positions: Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """The tables of grid ``positions``: the row angles, then the column angles.

        Shapes::

            positions: [..., 2] integer (row, column)
            returns:   (cos, sin), each [..., head_dim / 2], ``dtype``

        Raises:
            TypeError, ValueError: ``positions`` is not an integer tensor ending in 2.
        """
        _check_grid("positions", positions, least=1, most=64)
        cos, sin = rope_cos_sin(positions, self.inv_freq.to(dtype))  # [..., 2, head_dim/4]
        return cos.flatten(-2), sin.flatten(-2)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` ``[..., L, head_dim]`` by ``positions`` ``[L, 2]`` (or ``[B, L, 2]``
        for ``x`` ``[B, H, L, head_dim]``).

        Raises:
            TypeError: ``x`` is not a floating tensor, or ``positions`` not an integer one.
            ValueError: ``x`` does not end in ``head_dim``, or ``positions`` does not have
                shape ``[L, 2]`` or ``[B, L, 2]`` for ``x``.
        """
        return self._rotate(x, positions, "x", "positions")

    def _rotate(self, x: Tensor, positions: Tensor, name: str, positions_name: str) -> Tensor:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            what = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a floating torch.Tensor, got {what}")
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} does not end in head_dim={self.head_dim}"
            )
        grid = _grid(positions, positions_name, x, name)
        if positions.dim() == 2:  # [L, 2]: tables [L, head_dim/2] for any x [..., L, Dh]
            grid = grid[0, 0]
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(grid.to(x.device), dtype)
        return apply_rope(x, cos, sin, self.layout)

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` by ``q_positions`` and ``k`` by ``k_positions`` (see :meth:`rotate`)."""
        return (
            self._rotate(q, q_positions, "q", "q_positions"),
            self._rotate(k, k_positions, "k", "k_positions"),
        )

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, layout={self.layout!r}"


class MixedRotaryEmbedding(PositionScheme):
    """2-D RoPE with learned frequencies on both axes, per head (RoPE-Mixed).

    Heo et al. 2024 (arXiv 2403.13298), RoPE-Mixed: pair ``j`` of head ``h`` turns by
    ``θ_{h,j,row} · row + θ_{h,j,col} · col``, the rotation ``e^{i(θ^x_j p^x + θ^y_j p^y)}``
    of the paper; the ``θ`` (``frequencies``) are trained with the model. As every
    angle is linear in the position, the score still depends only on ``(Δrow, Δcol)``.

    Initialisation, as the authors' code (``init_random_2d_freqs`` in naver-ai/rope-vit):
    magnitudes ``base^(-4i/head_dim)`` for ``i < head_dim / 4`` (RoPE-Axial's ladder,
    with the paper's ``base = 10``), and for each head a random direction ``φ`` (uniform
    in ``[0, 2π)``): the first ``head_dim / 4`` pairs point along ``(cos φ, sin φ)`` in
    the (row, column) plane, the others along the perpendicular ``(-sin φ, cos φ)``.
    With ``random_directions=False`` (``φ = 0``) the first quarter of the pairs reads the
    row and the second the column: RoPE-Axial exactly, where training starts from. (The
    authors' ``(x, y)`` is (column, row), and their code pairs adjacent features:
    ``layout="interleaved"``; with a uniform ``φ`` the naming of the axes makes no
    difference.)

    Each query head has its own frequencies, so the keys must have as many heads:
    grouped-query attention (fewer key heads) is refused, since a key shared by query
    heads with different frequencies would have to be turned by each of them.
    :class:`~pecode.attention.MultiHeadAttention` passes this scheme positions
    ``[B, L, 2]`` (:attr:`position_axes`).

    Shapes::

        q, k:        [B, num_heads, L, head_dim]
        q_positions, k_positions: [L, 2] or [B, L, 2] integer (row, column)
        frequencies: [num_heads, head_dim / 2, 2] (row, column), a Parameter

    Args:
        head_dim: the per-head width, a multiple of 4.
        num_heads: the number of query (and key) heads.
        base: the base of the initial magnitudes (10 in the paper's RoPE-Mixed).
        layout: ``"half"`` or ``"interleaved"`` (see :func:`~pecode.rope.apply_rope`).
        random_directions: draw a random direction per head (the paper; ``rotate=``
            in the authors' code); ``False`` starts at RoPE-Axial.
        generator: the random generator of the directions.

    Raises:
        TypeError, ValueError: ``head_dim`` is not a positive multiple of 4,
            ``num_heads`` not a positive int, ``base`` not a finite number greater than 1,
            ``layout`` unknown, or ``random_directions`` not a bool.
    """

    position_axes = 2  # (row, column)

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        base: float = 10.0,
        layout: str = "half",
        random_directions: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.head_dim, self.num_heads = _check_head_dim(head_dim), check_int("num_heads", num_heads)
        _check_layout(layout)  # pecode.rope's, as RotaryEmbedding checks it
        self.base, self.layout = check_rope_base("base", base), layout
        self.random_directions = check_bool("random_directions", random_directions)
        self.frequencies = nn.Parameter(torch.empty(num_heads, head_dim // 2, 2))
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw the initial frequencies again (see the class docstring)."""
        magnitudes = rope_inv_freq(self.head_dim // 2, self.base)  # [head_dim / 4]
        phi = torch.zeros(self.num_heads)
        if self.random_directions:
            phi = torch.rand(self.num_heads, generator=generator) * 2 * math.pi
        cos, sin = phi.cos(), phi.sin()
        directions = torch.stack((torch.stack((cos, sin), -1), torch.stack((-sin, cos), -1)), 1)
        frequencies = directions[:, :, None, :] * magnitudes[:, None]  # [H, 2, head_dim/4, 2]
        with torch.no_grad():
            self.frequencies.copy_(frequencies.reshape(self.num_heads, -1, 2))

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The tables of grid ``positions``, one per head (float32, or the frequencies'
        dtype if wider).

        Shapes::

            positions: [..., L, 2] integer (row, column)
            returns:   (cos, sin), each [..., num_heads, L, head_dim / 2]

        Raises:
            TypeError, ValueError: ``positions`` is not an integer tensor ``[..., L, 2]``.
        """
        _check_grid("positions", positions, most=64)
        frequencies = self.frequencies
        dtype = torch.promote_types(frequencies.dtype, torch.float32)
        grid = positions.to(frequencies.device, dtype).unsqueeze(-3)  # [..., 1, L, 2]
        angles = grid @ frequencies.to(dtype).mT  # Σ_a θ_{h,j,a} p_a: [..., H, L, head_dim/2]
        return angles.cos(), angles.sin()

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` ``[B, num_heads, L, head_dim]`` by ``positions`` ``[L, 2]`` or
        ``[B, L, 2]``.

        Raises:
            TypeError: ``x`` is not a floating tensor, or ``positions`` not an integer one.
            ValueError: ``x`` is not ``[B, num_heads, L, head_dim]``, or ``positions``
                does not have shape ``[L, 2]`` or ``[B, L, 2]`` for it.
        """
        return self._rotate(x, positions, "x", "positions")

    def _rotate(self, x: Tensor, positions: Tensor, name: str, positions_name: str) -> Tensor:
        check_heads(name, x, head_dim=self.head_dim)
        if x.shape[1] != self.num_heads:
            raise ValueError(
                f"{name} has {x.shape[1]} heads, MixedRotaryEmbedding was built for "
                f"num_heads={self.num_heads} (each head has its own frequencies, so "
                f"grouped-query attention with fewer key heads does not fit)"
            )
        cos, sin = self.cos_sin(_grid(positions, positions_name, x, name)[:, 0])
        return apply_rope(x, cos.to(x.device), sin.to(x.device), self.layout)

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` by ``q_positions`` and ``k`` by ``k_positions``, head by head."""
        return (
            self._rotate(q, q_positions, "q", "q_positions"),
            self._rotate(k, k_positions, "k", "k_positions"),
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, base={self.base}, "
            f"layout={self.layout!r}"
        )
