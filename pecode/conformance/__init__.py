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
the file's ``conventions`` state (:func:`check_rope_engine` applies them in Python). Its
``conventions`` entry defines every quantity in plain words.

:func:`check_rope_engine` runs such an engine written in Python, :func:`pecode_engine`
is pecode's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "CaseResult",
    "ConformanceReport",
    "check_rope_engine",
    "conformance_vectors",
    "pecode_engine",
    "published_configs",
]

VECTORS_FILE = "vectors_v1.json"
ENGINE_KEYS = ("inv_freq", "attention_factor", "cos", "sin", "q_rotated", "query_scale")


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

    Attributes:
        case: the case's ``id`` (``config/layer_type``, ``@seq_len`` for LongRoPE).
        compared: the keys the engine returned, in the order ``inv_freq``,
            ``attention_factor``, ``cos``, ``sin``, ``q_rotated``, ``query_scale``.
        errors: per key, the largest absolute error (relative for ``inv_freq``,
            ``attention_factor`` and ``query_scale``).
        ratios: per key, the largest error divided by its tolerance (pass: at most 1).
    """

    case: str
    compared: tuple[str, ...]
    errors: Mapping[str, float]
    ratios: Mapping[str, float]

    @property
    def passed(self) -> bool:
        """Every compared key within its tolerance."""
        return all(ratio <= 1.0 for ratio in self.ratios.values())

    @property
    def failed_keys(self) -> tuple[str, ...]:
        """The keys outside their tolerance."""
        return tuple(key for key in self.compared if self.ratios[key] > 1.0)


@dataclass(frozen=True)
class ConformanceReport:
    """An engine's results over all cases of the conformance vectors.

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
        """Every case passed, and at least one value was compared."""
        return any(r.compared for r in self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        """The cases that failed."""
        return tuple(r for r in self.results if not r.passed)

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
        """Per key, the largest error over tolerance over all cases (pass: at most 1)."""
        worst: dict[str, float] = {}
        for result in self.results:
            for key, ratio in result.ratios.items():
                worst[key] = max(worst.get(key, 0.0), ratio)
        return {key: worst[key] for key in ENGINE_KEYS if key in worst}

    def table(self) -> str:
        """One line per case: its id, pass or FAIL, and error/tolerance per key."""
        keys = [k for k in ENGINE_KEYS if any(k in r.ratios for r in self.results)]
        width = max([len(r.case) for r in self.results] + [4])
        head = f"{'case':<{width}}  {'':4}  " + "  ".join(f"{k:>9}" for k in keys)
        lines = [head, "-" * len(head)]
        for r in self.results:
            cells = "  ".join(
                f"{r.ratios[k]:>{max(9, len(k))}.3g}"
                if k in r.ratios
                else f"{'-':>{max(9, len(k))}}"
                for k in keys
            )
            lines.append(f"{r.case:<{width}}  {'ok' if r.passed else 'FAIL':4}  {cells}")
        return "\n".join(lines)

    def __str__(self) -> str:
        kind = "float32" if self.float32 else "float64"
        verdict = "PASSED" if self.passed else "FAILED"
        summary = (
            f"RoPE conformance v{self.version} ({kind} tolerances): {verdict}, "
            f"{len(self.results) - len(self.failures)}/{len(self.results)} cases pass"
        )
        worst = ", ".join(f"{k} {v:.3g}" for k, v in self.worst.items()) or "nothing compared"
        return (
            f"{summary}\nworst error per key: {worst}\n"
            f"table: error / tolerance per key (pass: <= 1)\n{self.table()}"
        )


def _tolerances(float32: bool) -> tuple[float, float]:
    """(the floor, the rounding unit of an angle) of the float32 or float64 tolerances."""
    return (1e-6, 2.0**-24) if float32 else (1e-12, 2.0**-53)


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

    floor, unit = _tolerances(float32)
    case_id = case["id"]
    errors: dict[str, float] = {}
    ratios: dict[str, float] = {}
    positions = torch.tensor(case["positions"], dtype=torch.float64)
    inv_freq = torch.tensor(case["inv_freq"], dtype=torch.float64)
    rel = floor  # relative tolerance of frequencies, factors and scales
    # a frequency off by `rel` moves the angle p θ_i by rel |p θ_i|, and the angle is rounded
    # to `unit` of its size: the error grows with the angle
    angle_tol = (rel + 4 * unit) * (1 + (positions[:, None] * inv_freq).abs())

    def relative(key: str, ref: Any, got: Any) -> None:
        diff = (got - ref).abs()
        error = (diff / ref.abs().clamp_min(1e-300)).where(ref != 0, diff)
        errors[key] = float(error.max()) if error.numel() else 0.0
        ratios[key] = errors[key] / rel

    def absolute(key: str, ref: Any, got: Any, tol: Any) -> None:
        diff = (got - ref).abs()
        errors[key] = float(diff.max()) if diff.numel() else 0.0
        ratios[key] = float((diff / tol).max()) if diff.numel() else 0.0

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
            absolute(key, ref, got, floor + angle_tol)
    if "q_rotated" in values:
        ref = torch.tensor(case["q_rotated"], dtype=torch.float64)
        got = _as_floats(case_id, "q_rotated", values["q_rotated"], tuple(ref.shape))
        q = torch.tensor(case["q"], dtype=torch.float64)
        half = case["rotary_dim"] // 2
        size = q[:half].abs() + q[half : 2 * half].abs()  # |a| + |b| of each pair
        rotated_tol = case["attention_factor"] * size * angle_tol
        tol = torch.full_like(ref, floor * max(1.0, case["attention_factor"]))
        tol[:, : 2 * half] += torch.cat((rotated_tol, rotated_tol), dim=-1)
        absolute("q_rotated", ref, got, tol)
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
    return CaseResult(case_id, compared, errors, ratios)


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
    ``p`` and pair ``i``. The angle ``p θ_i`` is off by ``r |p θ_i|`` when the frequency
    is off by the ``r`` it is allowed, and float32 rounds it to ``2^-24`` of its size
    again: the error grows with the angle (at position 131071 and ``θ_0 = 1`` that allows
    0.16). For ``q_rotated`` the angle term is multiplied by ``attention_factor · (|a| +
    |b|)`` of the pair ``(a, b)``, and the floor by ``max(1, attention_factor)``. With
    ``float32=False`` (float64 engines): 1e-12 in place of 1e-6 and ``2^-53`` in place
    of ``2^-24``.

    Args:
        engine: a callable ``engine(case) -> dict`` as above.
        vectors: the data set to check against (default: :func:`conformance_vectors`);
            a subset of its cases checks only those.
        float32: the float32 tolerances (default) or the float64 ones.

    Returns:
        A :class:`ConformanceReport`; its ``passed`` is True when every compared value is
        within tolerance (and anything was compared), ``str(report)`` a table.

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
