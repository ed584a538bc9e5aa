"""pecode: positional encodings for Transformers, proven, tested and measured.

The package behind the book *Positional Encoding, Verified*. Math lives in pure
functions over tensors; ``nn.Module`` classes are thin wrappers around them.

Modules
-------
utils
    The device, seeding, a fixed CPU thread count, showing pecode's own source and tables
    of results in a notebook.
attention
    Multi-head attention whose position scheme is a constructor argument, with grouped
    key/value heads (GQA, MQA), cross-attention and a KV cache.
absolute
    Sinusoidal and learned absolute position tables (chapters 2-3).
relative
    Shaw et al., Transformer-XL/XLNet, T5 and DeBERTa (chapters 4-5).
alibi
    ALiBi slopes, biases and the attention scheme (chapter 6).
complex_plane
    Partial sums of the exponential series (chapter 7).
frequencies
    RoPE's frequencies ``rope_inv_freq`` and the checks of their arguments, shared by
    ``rope`` and ``scaling`` (neither imports the other).
rope
    Rotary position embedding: tables, both layouts, RotaryEmbedding, with Hugging
    Face's ``forward(x, position_ids)`` and ``RotaryEmbedding.from_hf_config``
    (chapters 8-9).
scaling
    Long-context RoPE frequencies: linear, NTK-aware, dynamic, YaRN, Llama 3.1, LongRoPE
    (Phi-3), proportional (Gemma 4), a base change (chapter 11); ``hf_rope_arguments``
    and ``frequencies_from_hf_config`` read a Hugging Face ``config.json`` as it is.
rope_kernels, rope_compiled, rope_triton
    The fast paths of ``apply_rope``: blocked CPU passes, the autograd Function whose
    backward is the inverse rotation, one fused CPU kernel built by ``torch.compile``
    (the switch ``compiled=``, environment variable ``PECODE_ROPE_COMPILE``) and one
    Triton kernel on CUDA (chapter 12).
hf
    Hugging Face attention layers rebuilt on pecode, weights copied (page 9b).
bench
    The benchmark of chapter 12, a package: the interleaved-rounds harness, the RoPE and
    attention cases, the recorded GPU run and the command line (``python -m pecode.bench``).
experiments
    The training experiments of chapters 13 and 14.
proofs
    sympy derivations that return a residual (zero when the identity holds), one
    submodule per chapter.
reference
    Slow float64 loops that tests and notebooks check the fast code against.
"""

from pecode.utils import SourceListing, Table, device, set_seed, show_source

__all__ = ["SourceListing", "Table", "__version__", "device", "set_seed", "show_source"]

__version__ = "0.1.0"
