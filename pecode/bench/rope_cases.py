"""The RoPE cases: every way to rotate q and k, timed against ``copy_``, ``clone`` and the peers.

* :func:`rope_methods` builds the methods of one case (:class:`RopeSetup`: the
  :class:`RopeMethod` of each, on shared :class:`RopeInputs`): the yardsticks ``copy_``
  and ``clone`` (the package's docstring says what each bounds), ``apply_rope`` in both
  layouts, the textbook forms, and the peers (Hugging Face, torchtune,
  rotary-embedding-torch) that import, forward and forward + backward;
* :func:`bench_rope_case` checks every method against the rotation in float64, then times
  them in interleaved rounds: one :class:`Case`, whose :class:`Row` lines
  :func:`format_cases` prints; :func:`bench_rope_sweep` runs a case per length and
  :func:`bench_rope_decode` the single-token decode step.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.bench.harness import (
    Spread,
    _check_device,
    _device_name,
    _torch_threads,
    ratio_spread,
    time_interleaved,
)
from pecode.rope import (
    apply_rope,
    apply_rope_complex,
    apply_rope_rotate_half,
    rope_cos_sin,
    rope_inv_freq,
)
from pecode.utils import Table

__all__ = [
    "Case",
    "RopeInputs",
    "RopeMethod",
    "RopeSetup",
    "Row",
    "bench_rope_case",
    "bench_rope_decode",
    "bench_rope_sweep",
    "cases_table",
    "format_cases",
    "rope_methods",
]

# --------------------------------------------------------------------------------------
# RoPE: the methods, one case, a sweep of sizes, the decode step
# --------------------------------------------------------------------------------------

YARDSTICK, FORWARD, TRAINING = "yardstick", "forward", "forward+backward"
_MODE_SHORT = {FORWARD: "fwd", TRAINING: "fwd+bwd"}

# Peers: (name, module, attribute, pip package). Each one is imported when a case is
# built; one that cannot be imported is skipped with a note.
_PEERS = (
    ("hf", "transformers.models.llama.modeling_llama", "apply_rotary_pos_emb", "transformers"),
    ("torchtune", "torchtune.modules", "RotaryPositionalEmbeddings", "torchtune"),
    (
        "rotary-embedding-torch",
        "rotary_embedding_torch",
        "RotaryEmbedding",
        "rotary-embedding-torch",
    ),
)


def _import_peer(module: str, attribute: str) -> tuple[Any, str]:
    """The peer's function or class and ``""``, or None and why it could not be imported."""
    try:
        return getattr(importlib.import_module(module), attribute), ""
    except Exception as err:  # a peer's own import errors (missing extras) mean "skip"
        return None, f"{type(err).__name__}: {err}".splitlines()[0]


def _accepts(fn: Callable[..., Any], argument: str) -> bool:
    """Whether ``fn`` takes ``argument`` (an older pecode's apply_rope may not)."""
    try:
        return argument in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _compiled_unavailable(device: torch.device) -> str | None:
    """Why this case has no compiled rows, or None when pecode can build its CPU kernel."""
    if device.type != "cpu":
        return f"the compiled kernel is the CPU's ({device.type} has its own paths)"
    try:
        rope_compiled = importlib.import_module("pecode.rope_compiled")
    except ImportError:
        return "this pecode has no pecode.rope_compiled"
    return rope_compiled.unavailable_reason() or rope_compiled.compiler_missing()


@dataclass(frozen=True)
class RopeInputs:
    """The tensors of one RoPE case, shared by all its methods.

    Attributes:
        q: the query, ``[B, H, L, Dh]``, no gradient.
        k: the key, like ``q``.
        q_leaf: a copy of ``q`` that requires a gradient (forward + backward methods).
        k_leaf: a copy of ``k`` that requires a gradient.
        grad_q: the upstream gradient given to ``backward`` for the rotated query.
        grad_k: the upstream gradient for the rotated key.
        cos: the half-width table ``[L, Dh // 2]`` (float32, :func:`~pecode.rope.rope_cos_sin`).
        sin: like ``cos``.
        positions: the ``L`` positions, ``start, ..., start + L - 1``.
        inv_freq: the ``Dh // 2`` frequencies (:func:`~pecode.rope.rope_inv_freq`).
    """

    q: Tensor
    k: Tensor
    q_leaf: Tensor
    k_leaf: Tensor
    grad_q: Tensor
    grad_k: Tensor
    cos: Tensor
    sin: Tensor
    positions: Tensor
    inv_freq: Tensor


@dataclass(frozen=True)
class RopeMethod:
    """One way to rotate the query and the key, as a timed call.

    Attributes:
        fn: the call that is timed (no arguments). It returns the rotated query and
            key; a forward + backward call first sets its inputs' ``.grad`` to None,
            then runs the forward and ``torch.autograd.backward`` with the case's
            upstream gradients.
        mode: ``"forward"`` or ``"forward+backward"``.
        kind: ``"yardstick"``, ``"pecode"``, ``"textbook"`` (a form chapters 8 and 9
            teach) or ``"peer"`` (another library).
        layout: the pairing its result follows (``"half"`` or ``"interleaved"``), or
            None for a yardstick.
        check: calls ``fn`` once and returns the rotated query, the rotated key and,
            for forward + backward, the gradients of the query and the key (else None),
            all as ``[B, H, L, Dh]``.
    """

    fn: Callable[[], Any]
    mode: str
    kind: str
    layout: str | None
    check: Callable[[], tuple[Tensor, Tensor, Tensor | None, Tensor | None]]


@dataclass(frozen=True)
class RopeSetup:
    """What :func:`rope_methods` builds.

    Attributes:
        methods: name -> :class:`RopeMethod`, yardsticks first.
        inputs: the shared tensors.
        notes: one line per method left out, and why.
    """

    methods: dict[str, RopeMethod]
    inputs: RopeInputs
    notes: tuple[str, ...]


def _check_shape(shape: Sequence[int]) -> tuple[int, int, int, int]:
    shape = tuple(shape)
    if (
        len(shape) != 4
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
        or shape[-1] % 2
    ):
        raise ValueError(f"shape must be [B, H, L, Dh] of positive ints, Dh even, got {shape}")
    return shape  # type: ignore[return-value]


def rope_methods(
    shape: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    position: int = 0,
    layouts: Sequence[str] = ("half", "interleaved"),
    backward: bool = True,
    peers: bool = True,
    textbook: bool = True,
    compiled: bool = True,
    seed: int = 0,
) -> RopeSetup:
    """The methods one RoPE case times, on one query and one key of ``shape``.

    In order:

    * yardsticks: ``copy_`` (q and k into tensors allocated beforehand), ``clone``;
    * ``apply_rope <layout>`` for each of ``layouts``, and ``apply_rope <layout> out=``
      into preallocated tensors when :func:`~pecode.rope.apply_rope` takes ``out``: the
      eager paths (``compiled=False``);
    * with ``compiled``, on a CPU where :mod:`pecode.rope_compiled` can build its kernel,
      the same as ``apply_rope <layout> compiled`` (and ``... compiled out=``):
      ``compiled=True``, one pass built by ``torch.compile``;
    * with ``textbook``: ``rotate_half textbook`` (:func:`~pecode.rope.apply_rope_rotate_half`
      with full-width tables made beforehand, half layout) and ``complex textbook``
      (:func:`~pecode.rope.apply_rope_complex`, interleaved; it builds its table at
      every call, as its signature asks). The rotation-matrix form is left out: its
      ``O(Dh²)`` work per token is chapter 9's point, not a contender;
    * with ``peers``, each one that imports: Hugging Face's ``apply_rotary_pos_emb``
      (``transformers.models.llama.modeling_llama``, half layout, tables of ``x``'s dtype
      as its model passes them), torchtune's ``RotaryPositionalEmbeddings``
      (interleaved, on ``[B, L, H, Dh]`` copies of q and k: its layout) and
      rotary-embedding-torch's ``RotaryEmbedding.rotate_queries_or_keys``
      (interleaved); a peer builds or looks up its own tables;
    * with ``backward``, the same as forward + backward: ``identity fwd+bwd``
      (clone q and k, backward: the least arithmetic a training path can do, though
      not always the least time, since its outputs and gradients are new memory),
      ``apply_rope <layout> fwd+bwd`` (and ``... compiled fwd+bwd``) and the peers'
      ``... fwd+bwd``.

    The tables hold positions ``position, ..., position + L - 1``; a decode step is
    ``L = 1`` at a large ``position``. Random data is made on the CPU with ``seed``,
    then moved to ``device``.

    Shapes::

        shape: [B, H, L, Dh]   (q, k, the upstream gradients)
        cos, sin: [L, Dh // 2] float32

    Raises:
        ValueError: ``shape``, ``position``, ``layouts`` or ``device`` is invalid.
        TypeError: ``dtype`` is not a floating dtype.
    """
    batch, _, length, head_dim = _check_shape(shape)
    device = _check_device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be a non-negative int, got {position!r}")
    layouts = tuple(layouts)
    if not layouts or any(layout not in ("half", "interleaved") for layout in layouts):
        raise ValueError(f"layouts must be 'half' and/or 'interleaved', got {layouts}")
    generator = torch.Generator().manual_seed(seed)

    def randn() -> Tensor:
        return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)

    q, k, grad_q, grad_k = randn(), randn(), randn(), randn()
    positions = torch.arange(position, position + length, device=device)
    inv_freq = rope_inv_freq(head_dim).to(device)
    cos, sin = rope_cos_sin(positions, inv_freq)
    inputs = RopeInputs(
        q,
        k,
        q.detach().clone().requires_grad_(),
        k.detach().clone().requires_grad_(),
        grad_q,
        grad_k,
        cos,
        sin,
        positions,
        inv_freq,
    )
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    methods: dict[str, RopeMethod] = {}
    notes: list[str] = []

    def same(t: Tensor) -> Tensor:
        return t

    def forward(
        name: str,
        fn: Callable[[], tuple[Tensor, Tensor]],
        kind: str,
        layout: str | None,
        to_bhld: Callable[[Tensor], Tensor] = same,
    ) -> None:
        def check() -> tuple[Tensor, Tensor, None, None]:
            rotated_q, rotated_k = fn()
            return to_bhld(rotated_q), to_bhld(rotated_k), None, None

        methods[name] = RopeMethod(fn, FORWARD, kind, layout, check)

    def training(
        name: str,
        rotate: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
        kind: str,
        layout: str | None,
        leaves: tuple[Tensor, Tensor] = (inputs.q_leaf, inputs.k_leaf),
        upstream: tuple[Tensor, Tensor] = (grad_q, grad_k),
        to_bhld: Callable[[Tensor], Tensor] = same,
    ) -> None:
        if not backward:
            return
        leaf_q, leaf_k = leaves

        def fn() -> tuple[Tensor, Tensor]:
            leaf_q.grad = leaf_k.grad = None  # as optimizer.zero_grad() leaves them
            rotated = rotate(leaf_q, leaf_k)
            torch.autograd.backward(rotated, upstream)
            return rotated

        def check() -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
            rotated_q, rotated_k = fn()
            grads = [None if g is None else to_bhld(g) for g in (leaf_q.grad, leaf_k.grad)]
            return to_bhld(rotated_q.detach()), to_bhld(rotated_k.detach()), *grads

        methods[name] = RopeMethod(fn, TRAINING, kind, layout, check)

    forward("copy_", lambda: (q_out.copy_(q), k_out.copy_(k)), YARDSTICK, None)
    forward("clone", lambda: (q.clone(), k.clone()), YARDSTICK, None)
    has_out = _accepts(apply_rope, "out")
    has_switch = _accepts(apply_rope, "compiled")
    paths = {"": {"compiled": False} if has_switch else {}}
    if compiled:
        reason = _compiled_unavailable(device) or (
            None if has_switch else "apply_rope takes no compiled= argument"
        )
        if reason is None:
            paths[" compiled"] = {"compiled": True}
        else:
            notes.append(f"no compiled rows: {reason}")
    for (suffix, switch), layout in itertools.product(paths.items(), layouts):
        forward(
            f"apply_rope {layout}{suffix}",
            lambda layout=layout, switch=switch: (
                apply_rope(q, cos, sin, layout, **switch),
                apply_rope(k, cos, sin, layout, **switch),
            ),
            "pecode",
            layout,
        )
        if has_out:
            forward(
                f"apply_rope {layout}{suffix} out=",
                lambda layout=layout, switch=switch: (
                    apply_rope(q, cos, sin, layout, out=q_out, **switch),
                    apply_rope(k, cos, sin, layout, out=k_out, **switch),
                ),
                "pecode",
                layout,
            )
    if not has_out:
        notes.append("apply_rope takes no out= argument: no out= rows")
    if textbook:
        cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        if "half" in layouts:
            forward(
                "rotate_half textbook",
                lambda: (
                    apply_rope_rotate_half(q, cos_full, sin_full).to(dtype),
                    apply_rope_rotate_half(k, cos_full, sin_full).to(dtype),
                ),
                "textbook",
                "half",
            )
        if "interleaved" in layouts:
            forward(
                "complex textbook",
                lambda: (
                    apply_rope_complex(q, positions, inv_freq).to(dtype),
                    apply_rope_complex(k, positions, inv_freq).to(dtype),
                ),
                "textbook",
                "interleaved",
            )
    training("identity fwd+bwd", lambda a, b: (a.clone(), b.clone()), YARDSTICK, None)
    for (suffix, switch), layout in itertools.product(paths.items(), layouts):
        training(
            f"apply_rope {layout}{suffix} fwd+bwd",
            lambda a, b, layout=layout, switch=switch: (
                apply_rope(a, cos, sin, layout, **switch),
                apply_rope(b, cos, sin, layout, **switch),
            ),
            "pecode",
            layout,
        )
    if peers:
        _add_peers(
            inputs, dtype, position, layouts, forward, training, notes, (batch, length, head_dim)
        )
    forward_first = sorted(methods.items(), key=lambda item: item[1].mode == TRAINING)
    return RopeSetup(dict(forward_first), inputs, tuple(notes))


def _add_peers(
    inputs: RopeInputs,
    dtype: torch.dtype,
    position: int,
    layouts: tuple[str, ...],
    forward: Callable[..., None],
    training: Callable[..., None],
    notes: list[str],
    sizes: tuple[int, int, int],
) -> None:
    """Add the peers that import, each in the layout it implements; note the others."""
    batch, length, head_dim = sizes
    q, k, cos, sin = inputs.q, inputs.k, inputs.cos, inputs.sin
    device = q.device
    for name, module, attribute, package in _PEERS:
        layout = "half" if name == "hf" else "interleaved"
        if layout not in layouts:
            continue
        peer, why = _import_peer(module, attribute)
        if peer is None:
            notes.append(f"{name} ({package}) not importable, skipped: {why}")
            continue
        if name == "hf":
            # [1, L, Dh] full-width tables in x's dtype, as LlamaRotaryEmbedding returns them
            cos_hf = torch.cat((cos, cos), -1).to(dtype).unsqueeze(0)
            sin_hf = torch.cat((sin, sin), -1).to(dtype).unsqueeze(0)
            label = "hf apply_rotary_pos_emb"
            forward(label, lambda f=peer, c=cos_hf, s=sin_hf: f(q, k, c, s), "peer", layout)
            training(
                f"{label} fwd+bwd",
                lambda a, b, f=peer, c=cos_hf, s=sin_hf: f(a, b, c, s),
                "peer",
                layout,
            )
        elif name == "torchtune":
            # its input is [B, L, H, Dh]; positions as input_pos [B, L] after a prompt
            rope = peer(head_dim, max_seq_len=position + length).to(device)
            input_pos = None if position == 0 else inputs.positions.expand(batch, length)

            def to_bhld(t: Tensor) -> Tensor:
                return t.transpose(1, 2)

            q_t, k_t = (t.transpose(1, 2).contiguous() for t in (q, k))
            leaves = tuple(t.detach().clone().requires_grad_() for t in (q_t, k_t))
            upstream = tuple(g.transpose(1, 2).contiguous() for g in (inputs.grad_q, inputs.grad_k))
            forward(
                "torchtune",
                lambda r=rope, p=input_pos, a=q_t, b=k_t: (r(a, input_pos=p), r(b, input_pos=p)),
                "peer",
                layout,
                to_bhld,
            )
            training(
                "torchtune fwd+bwd",
                lambda a, b, r=rope, p=input_pos: (r(a, input_pos=p), r(b, input_pos=p)),
                "peer",
                layout,
                leaves,
                upstream,
                to_bhld,
            )
        else:
            rotary = peer(dim=head_dim).to(device)
            forward(
                "rotary-embedding-torch",
                lambda r=rotary: (
                    r.rotate_queries_or_keys(q, offset=position),
                    r.rotate_queries_or_keys(k, offset=position),
                ),
                "peer",
                layout,
            )
            training(
                "rotary-embedding-torch fwd+bwd",
                lambda a, b, r=rotary: (
                    r.rotate_queries_or_keys(a, offset=position),
                    r.rotate_queries_or_keys(b, offset=position),
                ),
                "peer",
                layout,
            )


def _rotate_reference(x: Tensor, cos: Tensor, sin: Tensor, layout: str, sign: float) -> Tensor:
    """``x`` rotated by ``sign`` times the tables' angles, as complex numbers in float64.

    The harness's own check of every method's output (``sign=1``) and gradient
    (``sign=-1``: the gradient of a rotation is the rotation back), with the tables
    the case gave ``apply_rope`` promoted to float64, so that the error measures the
    method's arithmetic, not the tables'.
    """
    half = x.shape[-1] // 2
    rotor = torch.complex(cos.double(), sign * sin.double())
    if layout == "interleaved":
        z = torch.view_as_complex(x.detach().double().unflatten(-1, (half, 2)).contiguous())
        return torch.view_as_real(z * rotor).flatten(-2)
    z = torch.complex(x[..., :half].detach().double(), x[..., half:].detach().double())
    turned = z * rotor
    return torch.cat((turned.real, turned.imag), dim=-1)


def _max_errors(setup: RopeSetup) -> dict[str, float]:
    """Largest absolute error of each method's output (and gradients) against float64."""
    inputs = setup.inputs
    errors = {name: math.nan for name in setup.methods}
    for layout in ("half", "interleaved"):
        names = [n for n, m in setup.methods.items() if m.layout == layout]
        if not names:
            continue
        want_q, want_k = (
            _rotate_reference(x, inputs.cos, inputs.sin, layout, 1.0) for x in (inputs.q, inputs.k)
        )
        want_gq, want_gk = (
            _rotate_reference(g, inputs.cos, inputs.sin, layout, -1.0)
            for g in (inputs.grad_q, inputs.grad_k)
        )
        for name in names:
            got = setup.methods[name].check()
            pairs = [(got[0], want_q), (got[1], want_k)]
            if setup.methods[name].mode == TRAINING:
                pairs += [(got[2], want_gq), (got[3], want_gk)]
            errors[name] = max(
                math.inf if a is None else float((a.double() - b).abs().max()) for a, b in pairs
            )
        del want_q, want_k, want_gq, want_gk
    return errors


@dataclass(frozen=True)
class Row:
    """One method of one case, summarised: a line of :func:`format_cases`.

    Attributes:
        method: the method's name (see :func:`rope_methods`).
        mode: ``"forward"`` or ``"forward+backward"``.
        kind: ``"yardstick"``, ``"pecode"``, ``"textbook"`` or ``"peer"``.
        case: the case's label (shape, dtype, bytes).
        time: seconds per call over the rounds.
        vs_copy: per-round ratio to ``copy_`` of q and k (the bandwidth bound).
        vs_clone: per-round ratio to ``clone`` of q and k.
        peer: the fastest peer of the same mode (by median time), or ``""``.
        vs_peer: per-round ratio to ``peer``, or None.
        max_error: largest absolute error against the float64 rotation (outputs and,
            for forward + backward, gradients), NaN for a yardstick.
    """

    method: str
    mode: str
    kind: str
    case: str
    time: Spread
    vs_copy: Spread
    vs_clone: Spread
    peer: str
    vs_peer: Spread | None
    max_error: float


@dataclass(frozen=True)
class Case:
    """Every method of one RoPE size, timed in the same interleaved rounds.

    :meth:`Case.time` and :meth:`Case.ratio` summarise any method against any other,
    so a page can quote a ratio the table does not print; :meth:`Case.rows` gives the
    table's lines and :meth:`Case.as_dict` a JSON-ready record.

    Attributes:
        label: shape, dtype and bytes per tensor, in words.
        shape: ``(B, H, L, Dh)`` of q and of k.
        dtype: q's dtype, e.g. ``"float32"``.
        device: ``"cpu"`` or ``"cuda"`` (with its name on CUDA).
        position: the first position of the tables.
        threads: torch's CPU threads while timing.
        rounds: samples per method.
        samples: method -> seconds per call, one per round.
        modes: method -> ``"forward"`` or ``"forward+backward"``.
        kinds: method -> ``"yardstick"``, ``"pecode"``, ``"textbook"`` or ``"peer"``.
        max_errors: method -> largest absolute error (NaN for yardsticks).
        notes: what was left out, and why.
    """

    label: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    position: int
    threads: int | None
    rounds: int
    samples: Mapping[str, tuple[float, ...]]
    modes: Mapping[str, str]
    kinds: Mapping[str, str]
    max_errors: Mapping[str, float]
    notes: tuple[str, ...] = ()

    def time(self, method: str) -> Spread:
        """Seconds per call of ``method`` over the rounds.

        Raises:
            ValueError: no such method in this case.
        """
        if method not in self.samples:
            raise ValueError(f"method {method!r} is not in this case; have {list(self.samples)}")
        return Spread.of(self.samples[method])

    def ratio(self, method: str, yardstick: str = "copy_") -> Spread:
        """Per-round ratio of ``method``'s time to ``yardstick``'s (:func:`ratio_spread`)."""
        return ratio_spread(self.samples, method, yardstick)

    def best_peer(self, mode: str) -> str | None:
        """The peer of ``mode`` with the smallest median time, or None if none ran."""
        peers = [n for n in self.samples if self.kinds[n] == "peer" and self.modes[n] == mode]
        return min(peers, key=lambda n: self.time(n).median, default=None)

    def rows(self) -> list[Row]:
        """One :class:`Row` per method, in the order they were timed."""
        rows = []
        for name in self.samples:
            peer = self.best_peer(self.modes[name]) or ""
            rows.append(
                Row(
                    name,
                    self.modes[name],
                    self.kinds[name],
                    self.label,
                    self.time(name),
                    self.ratio(name, "copy_"),
                    self.ratio(name, "clone"),
                    peer,
                    self.ratio(name, peer) if peer else None,
                    self.max_errors.get(name, math.nan),
                )
            )
        return rows

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record: the case's fields and its rows (NaN written as None)."""

        def clean(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [clean(v) for v in value]
            return value

        record = {
            "label": self.label,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "position": self.position,
            "threads": self.threads,
            "rounds": self.rounds,
            "notes": list(self.notes),
            "rows": [
                {**asdict(row), "seconds": list(self.samples[row.method])} for row in self.rows()
            ],
        }
        return clean(record)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Case:
        """The case an :meth:`as_dict` record describes (None read back as NaN).

        Raises:
            ValueError: ``record`` lacks a field of :meth:`as_dict`.
        """
        try:
            rows = record["rows"]
            return cls(
                label=record["label"],
                shape=tuple(record["shape"]),
                dtype=record["dtype"],
                device=record["device"],
                position=record["position"],
                threads=record["threads"],
                rounds=record["rounds"],
                samples={row["method"]: tuple(row["seconds"]) for row in rows},
                modes={row["method"]: row["mode"] for row in rows},
                kinds={row["method"]: row["kind"] for row in rows},
                max_errors={
                    row["method"]: math.nan if row["max_error"] is None else row["max_error"]
                    for row in rows
                },
                notes=tuple(record["notes"]),
            )
        except KeyError as err:
            raise ValueError(f"record lacks the field {err.args[0]!r} of Case.as_dict") from err


def _bytes_short(n: int) -> str:
    """``n`` bytes in KiB below 1 MiB, else in MiB."""
    return f"{n / 2**10:g} KiB" if n < 2**20 else f"{n / 2**20:g} MiB"


def _first_compiled_calls(setup: RopeSetup, names: Sequence[str]) -> list[str]:
    """Call each compiled row once (building its kernels); a note for each that ran eagerly.

    A row runs the compiled kernel twice a call (q and k), four times with the backward;
    a kernel call that ran no compiled graph (:func:`pecode.rope_compiled.run_count`)
    ran its formula eagerly: a new variant past ``MAX_GRAPHS``, or strides the kernel
    does not take. Checked on this first call only.
    """
    if not names:
        return []
    notes, runs = [], importlib.import_module("pecode.rope_compiled").run_count
    for name in names:
        before = runs()
        setup.methods[name].fn()
        ran, calls = runs() - before, 4 if setup.methods[name].mode == TRAINING else 2
        if ran < calls:
            notes.append(
                f"{name}: {calls - ran} of its {calls} kernel calls ran eagerly, not compiled "
                "(a new variant past pecode.rope_compiled.MAX_GRAPHS, or strides it does not take)"
            )
    return notes


def bench_rope_case(
    shape: Sequence[int] = (1, 32, 2048, 128),
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    position: int = 0,
    layouts: Sequence[str] = ("half", "interleaved"),
    backward: bool = True,
    peers: bool = True,
    textbook: bool = True,
    compiled: bool = True,
    rounds: int = 5,
    shuffle: bool = False,
    target_s: float = 0.05,
    num_threads: int | None = 1,
    seed: int = 0,
) -> Case:
    """Time every method of :func:`rope_methods` on one size, in interleaved rounds.

    Each method is first called once and its result (and gradients) compared with the
    rotation computed in float64 from the same tables (``max_errors``; a peer's error
    also holds the difference between its own tables and ours). Then
    :func:`time_interleaved` times all of them, ``rounds`` rounds, ``num_threads`` CPU
    threads (1 by default: on a shared machine a multi-threaded operator waits for its
    slowest thread). The compiled rows' first calls build their kernels: where the
    compiler fails, those rows are left out with a note ``no compiled rows: <why>``, and
    a row whose kernel ran eagerly on its first call gets a note too.

    Shapes::

        shape: [B, H, L, Dh]   q and k each; tables [L, Dh // 2]

    Raises:
        ValueError, TypeError: as :func:`rope_methods` and :func:`time_interleaved`.
    """
    device = _check_device(device)
    setup = rope_methods(
        shape,
        dtype=dtype,
        device=device,
        position=position,
        layouts=layouts,
        backward=backward,
        peers=peers,
        textbook=textbook,
        compiled=compiled,
        seed=seed,
    )
    compiled = [name for name in setup.methods if " compiled" in name]
    notes = list(setup.notes)
    with _torch_threads(num_threads):  # a kernel is built for the thread count it runs on
        start = time.perf_counter()
        try:
            notes += _first_compiled_calls(setup, compiled)
        except RuntimeError:  # compiled=True raises where the compiler fails to build
            reason = _compiled_unavailable(device)
            if reason is None:  # not the compiler
                raise
            for name in compiled:
                del setup.methods[name]
            notes.append(f"no compiled rows: {reason}")
            compiled = []
        building = time.perf_counter() - start
        errors = _max_errors(setup)
    if compiled:
        notes.append(
            f"the compiled rows' first calls took {building:.1f} s in all, outside the "
            "timed rounds (building the kernels, where this process had not built them yet)"
        )
    samples = time_interleaved(
        {name: m.fn for name, m in setup.methods.items()},
        rounds=rounds,
        target_s=target_s,
        shuffle=shuffle,
        seed=seed,
        num_threads=num_threads,
        device=device,
    )
    dtype_name = str(dtype).removeprefix("torch.")
    label = f"q,k {list(shape)} {dtype_name}, {_bytes_short(setup.inputs.q.nbytes)} each"
    if position:
        label += f", position {position}"
    return Case(
        label,
        tuple(shape),
        dtype_name,
        _device_name(device),
        position,
        num_threads,
        rounds,
        samples,
        {name: m.mode for name, m in setup.methods.items()},
        {name: m.kind for name, m in setup.methods.items()},
        errors,
        tuple(notes),
    )


def bench_rope_sweep(
    lengths: Sequence[int] = (64, 256, 1024, 2048, 4096),
    *,
    batch: int = 1,
    heads: int = 32,
    head_dim: int = 128,
    **options: Any,
) -> list[Case]:
    """:func:`bench_rope_case` for q and k of ``[batch, heads, L, head_dim]``, one case per L.

    The default lengths make q (and k) 1, 4, 16, 32 and 64 MiB in float32: across the
    sizes at which a CPU ``clone`` starts to take fresh pages from the operating system
    (see :mod:`pecode.bench`), so that the gap between ``clone`` and ``copy_`` shows
    where it opens.
    ``options`` go to :func:`bench_rope_case`.

    Raises:
        ValueError: ``lengths`` is empty or holds a non-positive length.
    """
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must not be empty")
    for length in lengths:
        check_int("lengths", length)
    return [bench_rope_case((batch, heads, length, head_dim), **options) for length in lengths]


def bench_rope_decode(
    *,
    position: int = 4096,
    batch: int = 1,
    heads: int = 32,
    head_dim: int = 128,
    backward: bool = False,
    **options: Any,
) -> Case:
    """One decoding step: q and k of ``[batch, heads, 1, head_dim]``, tables ``[1, head_dim // 2]``.

    Each call rotates a single new token at ``position``, so the tensors are tiny
    (16 KiB each at the defaults) and the time is the fixed cost of a call: argument
    checks, dispatch, allocation. The absolute time per call (µs) and the ratio to
    Hugging Face's ``apply_rotary_pos_emb`` are what matter here. Forward only by
    default (decoding needs no gradient). ``options`` go to :func:`bench_rope_case`.
    """
    return bench_rope_case(
        (batch, heads, 1, head_dim), position=position, backward=backward, **options
    )


def _seconds(value: float) -> str:
    """``value`` seconds with a unit that keeps 3-4 significant digits."""
    if value < 1e-3:
        return f"{value * 1e6:7.1f} µs"
    if value < 1:
        return f"{value * 1e3:7.2f} ms"
    return f"{value:7.3f} s "


def _ratio(spread: Spread | None) -> str:
    return "" if spread is None else str(spread)


def format_cases(cases: Sequence[Case]) -> str:
    """The cases as fixed-width text: one block per case, one line per method.

    Columns: the method; its mode (``fwd`` or ``fwd+bwd``); the median and the minimum
    time per call over the rounds; the median and quartiles ``m [q1, q3]`` of its
    per-round ratio to ``copy_`` of q and k, to ``clone`` of q and k, and to the fastest
    peer of the same mode (named under the block); the largest error against the
    float64 rotation. Notes (peers skipped, say) follow the last block.
    """
    if not cases:
        return ""
    first = cases[0]
    threads = {None: "default threads", 1: "1 thread"}.get(
        first.threads, f"{first.threads} threads"
    )
    lines = [
        f"RoPE on q and k, {first.device}, {threads}, {first.rounds} interleaved rounds; "
        "ratios: median [quartiles] of per-round ratios",
    ]
    width = max(31, *(len(name) for case in cases for name in case.samples))
    header = (
        f"{'method':{width}s} {'mode':7s} {'median':>10s} {'min':>10s}  {'x copy_':18s} "
        f"{'x clone':18s} {'x peer':18s} {'max |err|':>9s}"
    )
    notes: list[str] = []
    for case in cases:
        lines += ["", case.label, header, "-" * len(header)]
        for row in case.rows():
            error = "" if math.isnan(row.max_error) else f"{row.max_error:.1e}"
            lines.append(
                f"{row.method:{width}s} {_MODE_SHORT[row.mode]:7s} "
                f"{_seconds(row.time.median):>10s} {_seconds(row.time.min):>10s}  "
                f"{_ratio(row.vs_copy):18s} "
                f"{_ratio(row.vs_clone):18s} {_ratio(row.vs_peer):18s} {error:>9s}"
            )
        peers = [f"{_MODE_SHORT[m]} {case.best_peer(m)}" for m in _MODE_SHORT if case.best_peer(m)]
        lines.append("peer: " + ("; ".join(peers) if peers else "none ran"))
        notes += [note for note in case.notes if note not in notes]
    lines += [""] + [f"note: {note}" for note in notes]
    return "\n".join(lines).rstrip("\n")


def cases_table(cases: Sequence[Case]) -> Table:
    """The numbers of :func:`format_cases` as one :class:`~pecode.utils.Table`, for a page.

    One row per method and case. Columns: the case (``L``, dtype and, when not 0, the
    first position), the method, its mode, the median time per call, the median and
    quartiles of its per-round ratio to ``copy_``, to ``clone`` and to the fastest peer of
    its mode (named in the cell), and the largest error against the float64 rotation.
    """
    header = ["case", "method", "mode", "median", "× copy_", "× clone", "× fastest peer"]
    rows = []
    for case in cases:
        where = f"L = {case.shape[2]}, {case.dtype}"
        if case.position:
            where += f", at {case.position}"
        for row in case.rows():
            error = "" if math.isnan(row.max_error) else f"{row.max_error:.1e}"
            peer = f"{row.vs_peer} ({row.peer})" if row.vs_peer is not None else ""
            rows.append(
                [
                    where,
                    row.method,
                    _MODE_SHORT[row.mode],
                    _seconds(row.time.median).strip(),
                    str(row.vs_copy),
                    str(row.vs_clone),
                    peer,
                    error,
                ]
            )
    return Table([*header, "max |err|"], rows)
