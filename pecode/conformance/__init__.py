"""Published RoPE configs and the conformance vectors computed from them (chapter 11.1).

``published_configs.json`` holds the rope keys of published models' ``config.json``, each
with where it was read. ``vectors_v1.json`` holds float64 reference values computed from
them by ``tools/make_conformance_vectors.py``, one case per config, layer type and (for
LongRoPE) current length: the frequencies ``inv_freq``, the ``attention_factor``, the
unscaled ``cos``/``sin`` tables at a few ``positions`` on both sides of the trained
length, a fixed query ``q`` and ``q_rotated`` (q rotated there in the half layout and
multiplied by the attention factor), and the log-length query temperature where the
config asks for one. Both files are plain JSON, so that an engine in any language can
check itself: read the file, and for each case compute from ``hf_config`` (with
``layer_type`` and ``seq_len``) what the engine would, then compare with the tolerances
the file's ``conventions`` state (:func:`check_rope_engine` applies them in Python; with
the float32 tolerances it leaves out the entries at angles too large for float32, which
each case's ``float32_beyond`` counts). Its ``conventions`` entry defines every quantity
in plain words.

:func:`check_rope_engine` runs such an engine written in Python, :func:`pecode_engine`
is pecode's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "FLOAT32_TABLE_CAP",
    "CaseResult",
    "ConformanceReport",
    "check_rope_engine",
    "conformance_vectors",
    "float32_beyond",
    "pecode_engine",
    "published_configs",
]

VECTORS_FILE = "vectors_v1.json"
ENGINE_KEYS = ("inv_freq", "attention_factor", "cos", "sin", "q_rotated", "query_scale")
#: With the float32 tolerances, a cos/sin entry whose tolerance would exceed this (absolute)
#: is not compared, nor are the q_rotated entries of that pair at that position.
FLOAT32_TABLE_CAP = 0.05


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


def published_configs() -> dict[str, dict[str, Any]]:
    """The published configs, by name: each entry has ``model`` (the checkpoint),
    ``source`` (where the values were read), ``note`` and ``config`` (the keys as
    published, a dict :func:`pecode.scaling.hf_rope_arguments` reads). A fresh copy."""
    return json.loads(json.dumps(_load("published_configs.json")["configs"]))


def conformance_vectors() -> dict[str, Any]:
    """The conformance vectors (``vectors_v1.json``) as a dict, a fresh copy.

    Keys: ``format`` (``"pecode-rope-conformance"``), ``version`` (1), ``generated_by``,
    ``pecode_version``, ``description``, ``conventions`` (the definitions, in words) and
    ``cases``, a list of dicts with ``id``, ``config``, ``model``, ``source``,
    ``hf_config``, ``layer_type``, ``rope_type``, ``head_dim``, ``rotary_dim``, ``base``,
    ``original_length``, ``max_position_embeddings``, ``seq_len``, ``positions``,
    ``inv_freq``, ``attention_factor``, ``cos``, ``sin``, ``q``, ``q_rotated``,
    ``query_temperature`` and ``note``.
    """
    return json.loads(json.dumps(_load(VECTORS_FILE)))


# ----------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class CaseResult:
    """How one engine's values for one case compare with the reference.

    A case is *skipped* when the engine returned nothing for it (an empty dict), and
    *incomplete* when it compared values but neither the frequencies (``inv_freq``) nor
    the tables (``cos`` and ``sin``, or ``q_rotated``): an ``attention_factor`` alone
    does not show that the engine rotates anything right. Only a case that is neither
    and has every compared key within its tolerance *passed*.

    Attributes:
        case: the case's ``id`` (``config/layer_type``, ``@seq_len`` for LongRoPE).
        compared: the keys compared (returned by the engine, with at least one entry
            compared), in the order ``inv_freq``, ``attention_factor``, ``cos``, ``sin``,
            ``q_rotated``, ``query_scale``.
        errors: per compared key, the largest absolute error over its compared entries
            (relative for ``inv_freq``, ``attention_factor`` and ``query_scale``).
        ratios: per compared key, the largest error divided by its tolerance (pass: at
            most 1).
        entries: per compared key, how many entries were compared.
        beyond: per returned ``cos``, ``sin`` or ``q_rotated``, how many entries were not
            compared because their float32 tolerance would exceed
            :data:`FLOAT32_TABLE_CAP` (float32 mode only; see :func:`check_rope_engine`).
    """

    case: str
    compared: tuple[str, ...]
    errors: Mapping[str, float]
    ratios: Mapping[str, float]
    entries: Mapping[str, int] = field(default_factory=dict)
    beyond: Mapping[str, int] = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        """True when nothing was compared (the engine returned an empty dict for this case)."""
        return not self.compared

    @property
    def complete(self) -> bool:
        """The frequencies (``inv_freq``) or the tables (``cos`` and ``sin``, or
        ``q_rotated``) were compared."""
        keys = set(self.compared)
        return "inv_freq" in keys or {"cos", "sin"} <= keys or "q_rotated" in keys

    @property
    def failed_keys(self) -> tuple[str, ...]:
        """The keys outside their tolerance."""
        return tuple(key for key in self.compared if self.ratios[key] > 1.0)

    @property
    def failed(self) -> bool:
        """Some compared key is outside its tolerance."""
        return bool(self.failed_keys)

    @property
    def passed(self) -> bool:
        """Complete (so not skipped) and every compared key within its tolerance."""
        return self.complete and not self.failed

    @property
    def status(self) -> str:
        """``ok``, ``FAIL``, ``skip`` (nothing compared) or ``part`` (incomplete)."""
        if self.failed:
            return "FAIL"
        if self.skipped:
            return "skip"
        return "ok" if self.complete else "part"


@dataclass(frozen=True)
class ConformanceReport:
    """An engine's results over all cases it was given (the conformance vectors, or the
    subset passed as ``vectors``).

    Attributes:
        results: one :class:`CaseResult` per case, in the file's order.
        float32: whether the float32 tolerances were applied (else the float64 ones).
        version: the vectors' version.
    """

    results: tuple[CaseResult, ...]
    float32: bool
    version: int

    @property
    def passed(self) -> bool:
        """Every case was checked (none skipped), compared the frequencies or the tables
        (none incomplete) and is within tolerance."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def checked(self) -> tuple[CaseResult, ...]:
        """The cases where something was compared (not skipped)."""
        return tuple(r for r in self.results if not r.skipped)

    @property
    def skipped(self) -> tuple[CaseResult, ...]:
        """The cases the engine returned nothing for."""
        return tuple(r for r in self.results if r.skipped)

    @property
    def incomplete(self) -> tuple[CaseResult, ...]:
        """The checked cases that compared neither the frequencies nor the tables."""
        return tuple(r for r in self.results if not r.skipped and not r.complete)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        """The cases with a compared key outside its tolerance."""
        return tuple(r for r in self.results if r.failed)

    @property
    def beyond(self) -> dict[str, int]:
        """Per key (``cos``, ``sin``, ``q_rotated``), the entries over all cases that were
        not compared because their float32 tolerance would exceed
        :data:`FLOAT32_TABLE_CAP` (empty with the float64 tolerances)."""
        total: dict[str, int] = {}
        for result in self.results:
            for key, count in result.beyond.items():
                total[key] = total.get(key, 0) + count
        return {key: total[key] for key in ENGINE_KEYS if key in total}

    @property
    def worst(self) -> dict[str, float]:
        """Per key, the largest error over all cases (see :attr:`CaseResult.errors`)."""
        worst: dict[str, float] = {}
        for result in self.results:
            for key, error in result.errors.items():
                worst[key] = max(worst.get(key, 0.0), error)
        return {key: worst[key] for key in ENGINE_KEYS if key in worst}

    @property
    def worst_ratio(self) -> dict[str, float]:
        """The largest ratio of error to tolerance over all cases, for each key compared
        (the cases pass where it is at most 1)."""
        worst: dict[str, float] = {}
        for result in self.results:
            for key, ratio in result.ratios.items():
                worst[key] = max(worst.get(key, 0.0), ratio)
        return {key: worst[key] for key in ENGINE_KEYS if key in worst}

    def table(self) -> str:
        """One line per case: its id, its status (``ok``, ``FAIL``, ``skip``, ``part``),
        error/tolerance per key and, with the float32 tolerances, how many entries were
        beyond float32 (not compared)."""
        keys = [k for k in ENGINE_KEYS if any(k in r.ratios for r in self.results)]
        width = max([len(r.case) for r in self.results] + [4])
        head = f"{'case':<{width}}  {'':4}  " + "  ".join(f"{k:>9}" for k in keys)
        if self.float32:
            head += f"  {'beyond':>6}"
        lines = [head, "-" * len(head)]
        for r in self.results:
            cells = "  ".join(
                f"{r.ratios[k]:>{max(9, len(k))}.3g}"
                if k in r.ratios
                else f"{'-':>{max(9, len(k))}}"
                for k in keys
            )
            if self.float32:
                cells += f"  {sum(r.beyond.values()):>6}"
            lines.append(f"{r.case:<{width}}  {r.status:4}  {cells}")
        return "\n".join(lines)

    def __str__(self) -> str:
        kind = "float32" if self.float32 else "float64"
        verdict = "PASSED" if self.passed else "FAILED"
        total = len(self.results)
        passing = sum(r.passed for r in self.results)
        summary = (
            f"RoPE conformance v{self.version} ({kind} tolerances): {verdict}, "
            f"{passing}/{total} cases pass\n"
            f"cases: {total} given, {len(self.checked)} checked, {len(self.skipped)} skipped "
            f"(nothing returned), {len(self.incomplete)} incomplete (neither inv_freq nor "
            f"cos+sin nor q_rotated compared), {len(self.failures)} failed"
        )
        if self.float32:
            beyond = self.beyond
            counts = ", ".join(f"{k} {v}" for k, v in beyond.items()) or "none"
            summary += (
                f"\nbeyond float32 (tolerance above {FLOAT32_TABLE_CAP}, not compared): "
                f"{sum(beyond.values())} entries ({counts})"
            )
        worst = ", ".join(f"{k} {v:.3g}" for k, v in self.worst.items()) or "nothing compared"
        return (
            f"{summary}\nworst error per key: {worst}\n"
            f"table: error / tolerance per key (pass: <= 1)\n{self.table()}"
        )


def _tolerances(float32: bool) -> tuple[float, float]:
    """(the floor, the rounding unit of an angle) of the float32 or float64 tolerances."""
    return (1e-6, 2.0**-24) if float32 else (1e-12, 2.0**-53)


def _angle_tolerance(positions: Any, inv_freq: Any, float32: bool) -> Any:
    """[positions, pairs]: the angle term of the cos/sin tolerance (see check_rope_engine)."""
    import torch

    floor, unit = _tolerances(float32)
    positions = torch.as_tensor(positions, dtype=torch.float64)
    inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64)
    # a frequency off by `floor` (its relative tolerance) moves the angle p θ_i by that
    # much of |p θ_i|, and the angle is rounded to `unit` of its size: the error grows
    # with the angle
    return (floor + 4 * unit) * (1 + (positions[:, None] * inv_freq).abs())


def float32_beyond(positions: Any, inv_freq: Any) -> Any:
    """[positions, pairs] bool: the entries a float32 engine is not checked at, where the
    float32 cos/sin tolerance would exceed :data:`FLOAT32_TABLE_CAP`."""
    floor, _ = _tolerances(True)
    return floor + _angle_tolerance(positions, inv_freq, True) > FLOAT32_TABLE_CAP


def _as_floats(case_id: str, key: str, value: Any, shape: tuple[int, ...]) -> Any:
    """The engine's value as a float64 tensor of the reference's shape."""
    import torch

    try:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to("cpu", torch.float64)
        else:
            tensor = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"engine(case) for {case_id!r}: {key!r} must be numbers (a list or tensor), got "
            f"{type(value).__name__} ({error})"
        ) from None
    if tuple(tensor.shape) != shape:
        raise ValueError(
            f"engine(case) for {case_id!r}: {key!r} must have shape {list(shape)}, got "
            f"{list(tensor.shape)}"
        )
    return tensor


def _check_case(case: Mapping[str, Any], values: Mapping[str, Any], float32: bool) -> CaseResult:
    import torch

    floor, _ = _tolerances(float32)
    case_id = case["id"]
    errors: dict[str, float] = {}
    ratios: dict[str, float] = {}
    positions = torch.tensor(case["positions"], dtype=torch.float64)
    inv_freq = torch.tensor(case["inv_freq"], dtype=torch.float64)
    rel = floor  # relative tolerance of frequencies, factors and scales
    entries: dict[str, int] = {}
    beyond: dict[str, int] = {}
    angle_tol = _angle_tolerance(positions, inv_freq, float32)
    # float32: where the cos/sin tolerance would exceed the cap, the entry says nothing (a
    # wrong value could hide there), so it is not compared; float64 compares everything
    if float32:
        far = float32_beyond(positions, inv_freq)
    else:
        far = torch.zeros_like(angle_tol, dtype=torch.bool)

    def relative(key: str, ref: Any, got: Any) -> None:
        diff = (got - ref).abs()
        error = (diff / ref.abs().clamp_min(1e-300)).where(ref != 0, diff)
        errors[key] = float(error.max()) if error.numel() else 0.0
        ratios[key] = errors[key] / rel
        entries[key] = error.numel()

    def absolute(key: str, ref: Any, got: Any, tol: Any, skip: Any) -> None:
        keep = ~skip
        diff = (got - ref).abs()[keep]
        if int(skip.sum()):
            beyond[key] = int(skip.sum())
        if diff.numel():
            errors[key] = float(diff.max())
            ratios[key] = float((diff / tol.expand_as(ref)[keep]).max())
            entries[key] = diff.numel()

    for key in values:
        if key not in ENGINE_KEYS:
            raise ValueError(
                f"engine(case) for {case_id!r} returned the key {key!r}; the keys it may "
                f"return are {list(ENGINE_KEYS)}"
            )
    if "inv_freq" in values:
        got = _as_floats(case_id, "inv_freq", values["inv_freq"], tuple(inv_freq.shape))
        relative("inv_freq", inv_freq, got)
    if "attention_factor" in values:
        factor = values["attention_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            try:
                factor = float(factor)  # a 0-d tensor or numpy scalar
            except (TypeError, ValueError):
                raise TypeError(
                    f"engine(case) for {case_id!r}: 'attention_factor' must be a number, "
                    f"got {type(factor).__name__}"
                ) from None
        ref = torch.tensor([case["attention_factor"]], dtype=torch.float64)
        relative("attention_factor", ref, torch.tensor([float(factor)], dtype=torch.float64))
    for key in ("cos", "sin"):
        if key in values:
            ref = torch.tensor(case[key], dtype=torch.float64)
            got = _as_floats(case_id, key, values[key], tuple(ref.shape))
            absolute(key, ref, got, floor + angle_tol, far)
    if "q_rotated" in values:
        ref = torch.tensor(case["q_rotated"], dtype=torch.float64)
        got = _as_floats(case_id, "q_rotated", values["q_rotated"], tuple(ref.shape))
        q = torch.tensor(case["q"], dtype=torch.float64)
        half = case["rotary_dim"] // 2
        size = q[:half].abs() + q[half : 2 * half].abs()  # |a| + |b| of each pair
        rotated_tol = case["attention_factor"] * size * angle_tol
        tol = torch.full_like(ref, floor * max(1.0, case["attention_factor"]))
        tol[:, : 2 * half] += torch.cat((rotated_tol, rotated_tol), dim=-1)
        skip = torch.zeros_like(ref, dtype=torch.bool)
        skip[:, : 2 * half] = torch.cat((far, far), dim=-1)
        absolute("q_rotated", ref, got, tol, skip)
    if "query_scale" in values:
        temperature = case["query_temperature"]
        if temperature is None:
            raise ValueError(
                f"engine(case) for {case_id!r} returned 'query_scale', but the case's config "
                "asks for no query temperature (return it only where query_temperature is set)"
            )
        ref = torch.tensor(temperature["scale"], dtype=torch.float64)
        got = _as_floats(case_id, "query_scale", values["query_scale"], tuple(ref.shape))
        relative("query_scale", ref, got)
    compared = tuple(key for key in ENGINE_KEYS if key in errors)
    return CaseResult(case_id, compared, errors, ratios, entries, beyond)


def check_rope_engine(
    engine: Callable[[dict[str, Any]], Mapping[str, Any]],
    *,
    vectors: Mapping[str, Any] | None = None,
    float32: bool = True,
) -> ConformanceReport:
    """Compare a RoPE engine with the conformance vectors, case by case.

    ``engine(case)`` gets each case (a dict of :func:`conformance_vectors`; it reads
    ``hf_config``, ``layer_type``, ``seq_len``, ``positions`` and ``q``) and returns a
    dict with some of the keys ``inv_freq`` ([rotary_dim / 2]), ``attention_factor``
    (a number), ``cos`` and ``sin`` ([positions, rotary_dim / 2], unscaled),
    ``q_rotated`` ([positions, head_dim], half layout, times the attention factor) and
    ``query_scale`` ([positions], only where the case has a ``query_temperature``), as
    lists or tensors; a key it leaves out is not compared, an empty dict skips the case.

    Tolerances, for float32 engines (``float32=True``): relative error ``r = 1e-6`` for
    ``inv_freq``, ``attention_factor`` and ``query_scale``; absolute error
    ``1e-6 + (r + 4 · 2^-24) · (1 + |p θ_i|)`` per ``cos`` and ``sin`` entry at position
    ``p`` and pair ``i``. The angle ``p θ_i`` computed in float32 is off by about
    ``2^-24 · |p θ_i|`` (its rounding), plus ``r |p θ_i|`` when the frequency is off by
    the ``r`` it is allowed (its own float32 rounding): the error grows with the angle.
    For ``q_rotated`` the angle term is multiplied by ``attention_factor · (|a| + |b|)``
    of the pair ``(a, b)``, and the floor by ``max(1, attention_factor)``. With
    ``float32=False`` (float64 engines): 1e-12 in place of 1e-6 and ``2^-53`` in place
    of ``2^-24``, every entry compared.

    Beyond float32: the cos/sin tolerance is 1.24e-6 per radian of angle, so it reaches
    0.16 at ``|p θ_i| = 131071``, 0.33 at 262147 (Gemma 3 4B's sliding and Gemma 4's
    layers, ``θ_0 = 1``), 0.65 at 524291 (Qwen3.5) and 13 at 10,485,759 (Llama 4 Scout),
    where it says nothing: cos and sin lie in [-1, 1], and a float32 engine cannot get
    such an angle right to better than that. So with the float32 tolerances an entry
    whose cos/sin tolerance would exceed :data:`FLOAT32_TABLE_CAP` (0.05, an angle
    ``|p θ_i|`` above about 40,372 radians) is not compared, for ``cos``, ``sin`` and
    both features of the pair in ``q_rotated``; the report counts those entries as
    *beyond float32*, per case (:attr:`CaseResult.beyond`) and in all
    (:attr:`ConformanceReport.beyond`). In the vectors these are the low pairs (large
    ``θ_i``) at positions ``2 L0 + 3`` and ``max_position_embeddings - 1``, and also at
    ``L0 - 1`` and ``L0`` where ``θ_0 L0`` exceeds that angle (Qwen3 0.6B, Qwen3.5,
    Gemma 3 4B's sliding layers, Gemma 4, SmolLM3, OLMo 3's sliding layers); each case's
    ``float32_beyond`` gives their number per position. Positions 0 and 1 (and the
    high pairs everywhere) are always compared, so every case keeps checked entries.
    A float64 engine is checked at every entry with ``float32=False``.

    Args:
        engine: a callable ``engine(case) -> dict`` as above.
        vectors: the data set to check against (default: :func:`conformance_vectors`);
            a subset of its cases checks only those (and "every case" below means every
            case of that subset).
        float32: the float32 tolerances (default) or the float64 ones.

    Returns:
        A :class:`ConformanceReport`. Its ``passed`` is True only when every case was
        checked (none skipped: an empty dict is a skip, not a pass), each compared the
        frequencies (``inv_freq``) or the tables (``cos`` and ``sin``, or
        ``q_rotated``), and every compared value is within tolerance; ``str(report)``
        gives the checked / skipped / incomplete / failed counts, the entries beyond
        float32 and a table.

    Raises:
        TypeError: ``engine`` is not callable, ``float32`` is not a bool, ``vectors`` is
            not a dict, or the engine returns something other than a dict or a value
            that is not numbers.
        ValueError: ``vectors`` is not the conformance format or has no cases, or the
            engine returns an unknown key or a value of the wrong shape.
    """
    if not callable(engine):
        raise TypeError(f"engine must be callable as engine(case), got {type(engine).__name__}")
    if not isinstance(float32, bool):
        raise TypeError(f"float32 must be a bool, got {type(float32).__name__}")
    if vectors is None:
        vectors = _load(VECTORS_FILE)
    elif not isinstance(vectors, Mapping):
        raise TypeError(
            f"vectors must be a dict (conformance_vectors()), got {type(vectors).__name__}"
        )
    if vectors.get("format") != "pecode-rope-conformance" or vectors.get("version") != 1:
        raise ValueError(
            "vectors must be the pecode-rope-conformance format, version 1 "
            "(conformance_vectors()), "
            f"got format={vectors.get('format')!r}, version={vectors.get('version')!r}"
        )
    cases = vectors.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("vectors['cases'] must be a non-empty list of cases")
    results = []
    for case in cases:
        values = engine(json.loads(json.dumps(case)))  # a copy: the engine cannot edit ours
        if not isinstance(values, Mapping):
            raise TypeError(
                f"engine(case) must return a dict, got {type(values).__name__} for {case['id']!r}"
            )
        results.append(_check_case(case, values, float32))
    return ConformanceReport(tuple(results), float32, vectors["version"])


# ----------------------------------------------------------------------------- pecode's engine


def pecode_engine(case: Mapping[str, Any], *, dtype: Any = None) -> dict[str, Any]:
    """pecode as a conformance engine: reads the case's ``hf_config`` as a model would.

    :func:`~pecode.scaling.frequencies_from_hf_config` gives the frequencies and the
    attention factor at the case's ``layer_type`` and ``seq_len``;
    :func:`~pecode.rope.rope_cos_sin` the tables, :func:`~pecode.rope.apply_partial_rope`
    the rotated query (times the factor), :func:`~pecode.scaling.log_length_query_scale`
    the query temperature, all in ``dtype``. ``check_rope_engine(pecode_engine,
    float32=False)`` checks the float64 engine, ``check_rope_engine(partial(pecode_engine,
    dtype=torch.float32))`` the float32 one.

    Args:
        case: one case of :func:`conformance_vectors`.
        dtype: ``torch.float64`` (default) or ``torch.float32``.

    Returns:
        A dict with ``inv_freq``, ``attention_factor``, ``cos``, ``sin``, ``q_rotated``
        and, where the case has a query temperature, ``query_scale``.

    Raises:
        TypeError: ``case`` is not a dict, or ``dtype`` is not float32 or float64.
        ValueError: ``case`` lacks a key the engine reads.
    """
    import torch

    from pecode.rope import apply_partial_rope, rope_cos_sin
    from pecode.scaling import (
        frequencies_from_hf_config,
        hf_query_temperature,
        log_length_query_scale,
    )

    dtype = torch.float64 if dtype is None else dtype
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    if not isinstance(case, Mapping):
        raise TypeError(
            f"case must be a dict (a case of conformance_vectors()), got {type(case).__name__}"
        )
    missing = [k for k in ("hf_config", "layer_type", "seq_len", "positions", "q") if k not in case]
    if missing:
        raise ValueError(f"case lacks the keys {missing} the engine reads")
    config = case["hf_config"]
    inv_freq, factor = frequencies_from_hf_config(
        config, layer_type=case["layer_type"], seq_len=case["seq_len"], dtype=dtype
    )
    positions = torch.tensor(case["positions"], dtype=torch.int64)
    cos, sin = rope_cos_sin(positions, inv_freq)
    q = torch.tensor(case["q"], dtype=dtype).expand(len(case["positions"]), -1)
    rotary_dim = 2 * inv_freq.shape[0]
    head = apply_partial_rope(q[:, :rotary_dim], cos, sin, "half") * factor
    rotated = torch.cat((head, q[:, rotary_dim:]), dim=-1)
    values: dict[str, Any] = {
        "inv_freq": inv_freq,
        "attention_factor": factor,
        "cos": cos,
        "sin": sin,
        "q_rotated": rotated,
    }
    temperature = hf_query_temperature(config)
    if temperature is not None:
        values["query_scale"] = log_length_query_scale(
            positions, temperature["beta"], temperature["length"], offset=temperature["offset"]
        )
    return values
