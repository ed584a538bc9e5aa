"""Which layers of a stack carry positions: RoPE layers and NoPE layers interleaved.

Several 2025–26 models rotate queries and keys in most layers and leave every few layers
with no positional encoding at all (*NoPE*, Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers"): the causal mask alone
tells those layers where they are. The pattern is a plain interval, spelled three ways
in the configs of Hugging Face transformers (read in version 5.23):

* **Llama 4** (``Llama4TextConfig``, ``model_type="llama4_text"``) and **SmolLM3**
  (``SmolLM3Config``): ``no_rope_layers`` holds one int per layer, and despite the name
  ``1`` means *uses RoPE* and ``0`` means NoPE (``Llama4TextAttention.use_rope =
  config.no_rope_layers[layer_idx]``, and likewise ``SmolLM3Attention``). Left unset it is
  ``int((i + 1) % no_rope_layer_interval != 0)``, default interval 4: layers 3, 7, 11, …
  are NoPE, the last of each group of four. (Llama 4 also falls back to that default for
  an *empty* list; SmolLM3 only for ``None``.)
* **Cohere2** (Command R7B, Command A; ``Cohere2Config``): ``layer_types``, and the
  attention rotates only where it has a sliding window
  (``if self.sliding_window is not None: apply_rotary_pos_emb(...)``), so the
  ``"sliding_attention"`` layers use RoPE and the ``"full_attention"`` layers are NoPE.
  Left unset, ``layer_types`` puts full attention on every ``sliding_window_pattern``-th
  layer (default 4), again the last of each group. A config whose ``sliding_window`` is
  ``None`` has no window anywhere, so the Hugging Face code rotates no layer at all.

:func:`nope_layers` builds the pattern; :func:`nope_layers_from_hf` reads it from a
config of those three families. Both return one bool per layer, ``True`` where the
layer has **no** positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pecode._checks import check_bool, check_int

__all__ = ["NOPE_MODEL_TYPES", "nope_layers", "nope_layers_from_hf"]

NOPE_MODEL_TYPES: tuple[str, ...] = ("llama4_text", "llama4", "smollm3", "cohere2")
"""The ``model_type`` values :func:`nope_layers_from_hf` reads (``"llama4"``: the
multimodal config, read through its ``text_config``)."""


def nope_layers(num_layers: int, *, every: int, last_in_group: bool = True) -> tuple[bool, ...]:
    """One NoPE layer in every group of ``every`` layers; the others use positions.

    With ``last_in_group=True`` (Llama 4, SmolLM3, Cohere2) layer ``i`` is NoPE when
    ``(i + 1) % every == 0``: layers ``every - 1, 2 every - 1, …``, the rule of
    ``no_rope_layers``' default in transformers' ``Llama4TextConfig`` and
    ``SmolLM3Config`` (``no_rope_layer_interval``, 4) and of ``Cohere2Config``'s
    ``layer_types`` (``sliding_window_pattern``, 4). With ``last_in_group=False``, the
    first of each group instead: ``i % every == 0``. A stack shorter than ``every`` has
    no NoPE layer with the last-in-group rule.

    Shapes::

        returns: tuple of num_layers bools, True = the layer has no positions (NoPE)

    Raises:
        TypeError: ``num_layers`` or ``every`` is not an int, ``last_in_group`` not a bool.
        ValueError: ``num_layers`` or ``every`` is not positive.
    """
    check_int("num_layers", num_layers, 1)
    check_int("every", every, 1)
    check_bool("last_in_group", last_in_group)
    shift = 1 if last_in_group else 0
    return tuple((i + shift) % every == 0 for i in range(num_layers))


def _read(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for a mapping (a ``config.json``), ``config.key`` for an object."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _from_no_rope_layers(config: Any, model_type: str, num_layers: int) -> tuple[bool, ...]:
    """Llama 4's and SmolLM3's ``no_rope_layers`` (1: RoPE, 0: NoPE), defaults included."""
    listed = _read(config, "no_rope_layers")
    # Llama 4 replaces any falsy list (None or []), SmolLM3 only None
    if listed is None or (model_type == "llama4_text" and not listed):
        interval = check_int("no_rope_layer_interval", _read(config, "no_rope_layer_interval", 4))
        return nope_layers(num_layers, every=interval)
    if isinstance(listed, str | bytes) or not isinstance(listed, Sequence):
        raise TypeError(f"no_rope_layers must be a list of 0/1, got {type(listed).__name__}")
    if len(listed) < num_layers:
        raise ValueError(
            f"no_rope_layers has {len(listed)} entries for num_hidden_layers={num_layers}"
        )
    flags = list(listed[:num_layers])  # longer lists are allowed; the first entries count
    if any(isinstance(f, bool) or f not in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers must hold 0 (NoPE) or 1 (RoPE), got {flags}")
    return tuple(flag == 0 for flag in flags)


def _from_layer_types(config: Any, num_layers: int) -> tuple[bool, ...]:
    """Cohere2: RoPE on the sliding layers, NoPE on the full-attention ones."""
    if _read(config, "sliding_window") is None:
        return (True,) * num_layers  # no window anywhere: the attention never rotates
    layer_types = _read(config, "layer_types")
    if layer_types is None:  # a config.json from before layer_types
        pattern = check_int("sliding_window_pattern", _read(config, "sliding_window_pattern", 4))
        return nope_layers(num_layers, every=pattern)
    if isinstance(layer_types, str | bytes) or not isinstance(layer_types, Sequence):
        raise TypeError(f"layer_types must be a list of str, got {type(layer_types).__name__}")
    if len(layer_types) < num_layers:
        raise ValueError(
            f"layer_types has {len(layer_types)} entries for num_hidden_layers={num_layers}"
        )
    return tuple(kind != "sliding_attention" for kind in layer_types[:num_layers])


def nope_layers_from_hf(config: Any) -> tuple[bool, ...]:
    """Which layers of a Llama 4, SmolLM3 or Cohere2 model have no positions.

    ``config`` is a transformers config object or its dict (``config.json``): what the
    config's own defaults give when a key is missing is filled in as transformers 5.23
    fills it (see the module's docstring), and the answer is what the model's attention
    does, layer by layer: ``Llama4TextAttention.use_rope`` and
    ``SmolLM3Attention.use_rope`` are ``no_rope_layers[i]`` (1: RoPE), so ``True`` here
    where it is 0; ``Cohere2Attention`` rotates only where ``sliding_window`` is set,
    so ``True`` here on every ``"full_attention"`` layer (on every layer when the config
    has no ``sliding_window``).

    Shapes::

        returns: tuple of num_hidden_layers bools, True = the layer has no positions

    Raises:
        ValueError: ``model_type`` is none of ``NOPE_MODEL_TYPES`` (named in the message),
            ``no_rope_layers`` or ``layer_types`` is shorter than the stack, or
            ``no_rope_layers`` holds something other than 0 and 1.
        TypeError: ``num_hidden_layers`` is not an int, or a list is not a list.
    """
    model_type = _read(config, "model_type")
    if model_type == "llama4":  # the multimodal config: its language model's
        config = _read(config, "text_config")
        if config is None:
            raise ValueError("a 'llama4' config without a text_config")
        model_type = "llama4_text"
    if model_type not in NOPE_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} has no NoPE layers that pecode reads; "
            f"accepted: {list(NOPE_MODEL_TYPES)}"
        )
    num_layers = check_int("num_hidden_layers", _read(config, "num_hidden_layers"))
    if model_type == "cohere2":
        return _from_layer_types(config, num_layers)
    return _from_no_rope_layers(config, model_type, num_layers)
