"""pecode: positional encodings for Transformers, proven, tested and measured.

The package behind the book *Positional Encoding, Verified*. Math lives in pure
functions over tensors; ``nn.Module`` classes are thin wrappers around them.

Modules
-------
utils
    The device, seeding, and showing pecode's own source in a notebook.
attention
    Multi-head attention whose position scheme is a constructor argument.
proofs
    sympy derivations that return a residual (zero when the identity holds).
reference
    Slow float64 loops that tests and notebooks check the fast code against.
"""

from pecode.utils import SourceListing, device, set_seed, show_source

__all__ = ["SourceListing", "__version__", "device", "set_seed", "show_source"]

__version__ = "0.1.0"
