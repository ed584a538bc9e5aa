"""Absolute positional encodings: the sinusoidal table and the learned table.

Both give each position ``pos`` a vector that is *added* to the token embedding before
the first layer, outside attention (Vaswani et al. 2017, §3.5; Devlin et al. 2019,
§3). Attention itself then runs with no position scheme.

The sinusoidal encoding is a pure function of ``pos``: :func:`sinusoidal_frequencies`,
:func:`sinusoidal_encoding` (any positions) and :func:`sinusoidal_table` (positions
``0 .. num_positions - 1``); :class:`SinusoidalPositionalEncoding` caches the table
and grows it when a longer input arrives. :class:`LearnedPositionalEncoding` holds a
trained table of ``max_len`` rows and refuses positions it has no row for.

Odd widths: the sinusoidal functions refuse an odd ``dim`` with a ``ValueError``. The
formula pairs column ``2i`` (sine) with column ``2i + 1`` (cosine) of the same
frequency; with an odd width the last sine would have no cosine partner, and the
properties that make the encoding useful (a fixed rotation maps ``PE(pos)`` to
``PE(pos + k)``; ``PE(pos)·PE(pos + k)`` depends only on ``k``) would fail for it.
The learned table works with any width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pecode._checks import check_int

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_table",
]


_CHUNK_ROWS = 1 << 14


def _check_dim(dim: object) -> int:
    check_int("dim", dim, 2)
    if dim % 2:
        raise ValueError(
            f"dim must be even, got {dim}: each frequency needs a sine column 2i "
            "and a cosine column 2i+1"
        )
    return dim


def _check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, int | float):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    if not math.isfinite(base) or base <= 1:
        raise ValueError(f"base must be a finite number greater than 1, got {base}")
    return float(base)


def _check_float_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}")
    return dtype


def _check_positions(positions: object, *, name: str = "positions") -> Tensor:
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(positions).__name__}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {positions.dtype}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{name} must be non-negative, got {int(positions.min())}")
    return positions


def _check_input(x: object, dim: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"x must have shape [batch, seq, {dim}], got {tuple(x.shape)}")
    return x


def _positions_for(x: Tensor, positions: Tensor | None) -> Tensor:
    """Default ``0 .. L-1``; otherwise check that ``positions`` is ``[L]`` or ``[B, L]``."""
    batch, length, _ = x.shape
    if positions is None:
        return torch.arange(length, device=x.device)
    positions = _check_positions(positions)
    if positions.shape not in ((length,), (batch, length)):
        raise ValueError(
            f"positions must have shape [{length}] or [{batch}, {length}], "
            f"got {tuple(positions.shape)}"
        )
    return positions.to(x.device)


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> Tensor:
    """The angular frequencies ``ω_i = base ** (-2i / dim)`` of the sinusoidal table, in float64.

    Vaswani et al. (2017), §3.5: column ``2i`` of the table is ``sin(pos · ω_i)`` and
    column ``2i + 1`` is ``cos(pos · ω_i)``; the wavelength of pair ``i`` is
    ``2π / ω_i = 2π · base ** (2i / dim)``.

    Shapes::

        returns: [dim // 2] (float64, CPU), ω_0 = 1 > ω_1 > ... > ω_{dim/2-1} = base ** (2/dim - 1)

    Raises:
        TypeError: ``dim`` is not an int or ``base`` is not a real number.
        ValueError: ``dim`` is not an even number ``>= 2``, or ``base`` is not a
            finite number greater than 1.
    """
    dim = _check_dim(dim)
    base = _check_base(base)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i / dim
    return torch.pow(torch.tensor(base, dtype=torch.float64), -exponents)


def sinusoidal_encoding(
    positions: Tensor,
    dim: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sinusoidal encoding of arbitrary integer positions (Vaswani et al. 2017, §3.5).

    ``PE(pos, 2i) = sin(pos / base**(2i/dim))`` and ``PE(pos, 2i+1) = cos(pos / base**(2i/dim))``.
    Frequencies and angles ``pos · ω_i`` are formed and reduced in float64 on the CPU,
    then cast to ``dtype`` and moved to ``positions.device``: a float32 angle would be off
    by up to ``ulp(pos) / 2`` (0.03 rad at ``pos = 10**6``), and float32 frequencies would
    add up to ``pos * 2**-25`` more (another 0.03 rad); the float64 angle is off by about
    ``1e-10``.

    Shapes::

        positions: [...] (integer, non-negative)
        returns:   [..., dim] (``dtype``, on ``positions.device``)

    Raises:
        TypeError: ``positions`` is not an integer tensor, ``dtype`` is not floating,
            or ``dim`` / ``base`` have the wrong type.
        ValueError: a position is negative, ``dim`` is odd or below 2, or ``base <= 1``.
    """
    positions = _check_positions(positions)
    dtype = _check_float_dtype(dtype)
    freqs = sinusoidal_frequencies(dim, base)
    flat = positions.detach().to("cpu", torch.float64).reshape(-1)
    out = torch.empty(flat.numel(), dim, dtype=dtype)
    # in chunks of rows, so the float64 intermediates stay small for long tables
    for start in range(0, flat.numel(), _CHUNK_ROWS):
        angles = flat[start : start + _CHUNK_ROWS].unsqueeze(-1) * freqs
        out[start : start + _CHUNK_ROWS, 0::2] = angles.sin()
        out[start : start + _CHUNK_ROWS, 1::2] = angles.cos()
    return out.view(*positions.shape, dim).to(positions.device)


def sinusoidal_table(
    num_positions: int,
    dim: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The sinusoidal table of Vaswani et al. (2017), §3.5, for ``pos = 0 .. num_positions - 1``.

    Column ``2i`` is ``sin(pos / base**(2i/dim))``, column ``2i+1`` the matching ``cos``.
    Computed as :func:`sinusoidal_encoding` does (float64 angles), so it is accurate
    to float32 rounding at positions up to ``10**6`` and beyond.

    Shapes::

        returns: [num_positions, dim] (``dtype``, on ``device``)

    Raises:
        TypeError: an argument has the wrong type (``dtype`` must be floating).
        ValueError: ``num_positions < 0``, ``dim`` is odd or below 2, or ``base <= 1``.
    """
    check_int("num_positions", num_positions, 0)
    positions = torch.arange(num_positions)
    return sinusoidal_encoding(positions, dim, base, dtype=dtype).to(device)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to token embeddings (Vaswani et al. 2017, §3.5).

    ``forward(x) = x * input_scale + PE[positions]``. Vaswani et al. multiply the
    embeddings by ``sqrt(dim)`` before adding the table (§3.4); pass
    ``input_scale=math.sqrt(dim)`` for that, the default ``1.0`` adds the table alone.
    The table is a non-persistent buffer (it is not saved in ``state_dict``: it is a
    function of ``dim`` and ``base``) and grows, to the next power of two, when a
    position past its end arrives.

    Args:
        dim: model width, even.
        base: the ``10000`` of the formula.
        max_len: rows built up front (the table grows past it on demand).
        input_scale: factor on ``x`` before the table is added.

    Raises:
        TypeError, ValueError: as :func:`sinusoidal_table`; ``max_len`` must be a
            positive int and ``input_scale`` a finite number.
    """

    table: Tensor

    def __init__(
        self, dim: int, base: float = 10000.0, *, max_len: int = 2048, input_scale: float = 1.0
    ) -> None:
        super().__init__()
        self.dim = _check_dim(dim)
        self.base = _check_base(base)
        check_int("max_len", max_len, 1)
        if isinstance(input_scale, bool) or not isinstance(input_scale, int | float):
            raise TypeError(f"input_scale must be a real number, got {type(input_scale).__name__}")
        if not math.isfinite(input_scale):
            raise ValueError(f"input_scale must be finite, got {input_scale}")
        self.input_scale = float(input_scale)
        self.register_buffer("table", sinusoidal_table(max_len, dim, base), persistent=False)

    def _grow(self, needed: int) -> None:
        """Rebuild the table with at least ``needed`` rows (next power of two)."""
        rows = 1 << (needed - 1).bit_length()
        self.table = sinusoidal_table(
            rows, self.dim, self.base, dtype=self.table.dtype, device=self.table.device
        )

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Return ``x * input_scale + PE[positions]``.

        Shapes::

            x:         [batch, seq, dim] (floating)
            positions: [seq] or [batch, seq] (integer, non-negative); default 0 .. seq-1
            returns:   [batch, seq, dim] (dtype of x)

        Raises:
            TypeError: ``x`` is not floating or ``positions`` is not integer.
            ValueError: ``x`` is not ``[batch, seq, dim]``, ``positions`` does not fit
                it, or a position is negative.
        """
        x = _check_input(x, self.dim)
        positions = _positions_for(x, positions)
        if positions.numel() and int(positions.max()) >= self.table.shape[0]:
            self._grow(int(positions.max()) + 1)
        encoding = self.table.to(x.device)[positions].to(x.dtype)
        if self.input_scale == 1.0:  # the default: skip a full pass over x
            return x + encoding
        return x * self.input_scale + encoding

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, base={self.base}, rows={self.table.shape[0]}, "
            f"input_scale={self.input_scale}"
        )


class LearnedPositionalEncoding(nn.Module):
    """Adds a learned vector per position, as BERT and GPT-2 do (Devlin et al. 2019, §3).

    ``forward(x) = x + weight[positions]`` with ``weight`` a trained
    ``[max_len, dim]`` parameter, initialized from ``N(0, init_std**2)``, as Hugging
    Face's BERT and GPT-2 ports do with 0.02 (BERT's released TensorFlow code draws from a
    normal truncated at two standard deviations with parameter 0.02; OpenAI's GPT-2 code
    uses 0.01 for the position table and 0.02 for the token table). Positions
    ``>= max_len`` have no row; they raise a ``ValueError`` instead of an index error
    (or, on a GPU, a device-side assert) from inside torch.

    Args:
        max_len: number of positions the table can represent, ``0 .. max_len - 1``.
        dim: model width (any positive int).
        init_std: standard deviation of the initial entries.

    Raises:
        TypeError, ValueError: ``max_len`` or ``dim`` is not a positive int, or
            ``init_std`` is negative or not finite.
    """

    def __init__(self, max_len: int, dim: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, 1)
        self.dim = check_int("dim", dim, 1)
        if isinstance(init_std, bool) or not isinstance(init_std, int | float):
            raise TypeError(f"init_std must be a real number, got {type(init_std).__name__}")
        if not math.isfinite(init_std) or init_std < 0:
            raise ValueError(f"init_std must be finite and non-negative, got {init_std}")
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        nn.init.normal_(self.weight, mean=0.0, std=float(init_std))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Return ``x + weight[positions]``.

        Shapes::

            x:         [batch, seq, dim] (floating)
            positions: [seq] or [batch, seq] (integer, in 0 .. max_len-1); default 0 .. seq-1
            returns:   [batch, seq, dim] (dtype of x)

        Raises:
            TypeError: ``x`` is not floating or ``positions`` is not integer.
            ValueError: ``x`` is not ``[batch, seq, dim]``, ``positions`` does not fit
                it, or a position is negative or ``>= max_len``.
        """
        x = _check_input(x, self.dim)
        positions = _positions_for(x, positions)
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"position {int(positions.max())} is at or past max_len={self.max_len}: "
                f"a learned table has rows for positions 0..{self.max_len - 1} only"
            )
        return x + self.weight[positions].to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.dim}"
