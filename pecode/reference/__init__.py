"""Slow, obviously correct references that tests and notebooks check pecode against.

Each function spells out a definition from a paper one scalar at a time, in float64,
with Python loops and no vectorization tricks. They are far too slow for use; their
job is to be easy to read and independent of the fast code they check. One submodule
per family; the names below are re-exported for convenience.
"""

from pecode.reference.attention import attention_layer_loop, multi_head_attention_loop
from pecode.reference.mla import latent_attention_loop

__all__ = ["attention_layer_loop", "latent_attention_loop", "multi_head_attention_loop"]
