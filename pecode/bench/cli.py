"""The command line, ``python -m pecode.bench`` (``pecode/bench/__main__.py`` calls :func:`main`).

It prints the RoPE tables of :mod:`pecode.bench.rope_cases` for each dtype asked for,
optionally writes the cases as JSON (the format :mod:`pecode.bench.records` reads back),
and with ``--attention`` adds the comparisons of :mod:`pecode.bench.attention_cases`.
``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from pecode.bench.attention_cases import bench_bias_attention, bench_shaw, prefill_memory
from pecode.bench.harness import _check_device, _device_name
from pecode.bench.rope_cases import Case, bench_rope_decode, bench_rope_sweep, format_cases

__all__ = ["main"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv: Sequence[str] | None = None) -> list[Case]:
    """Command line: ``python -m pecode.bench [--quick] [--device D] [--rounds N] ...``.

    Prints :func:`format_cases` of :func:`bench_rope_sweep` and :func:`bench_rope_decode`
    for each ``--dtype`` (``--help`` lists the options), and returns the cases; with
    ``--json PATH`` also writes their :meth:`Case.as_dict` records. ``--attention``
    adds chapter 12's comparisons of Shaw's two forms and of the bias attentions.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pecode.bench",
        description="RoPE timed against copy_, clone and its peers, in interleaved rounds.",
    )
    parser.add_argument("--quick", action="store_true", help="two lengths, 3 rounds, short samples")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32"], choices=list(_DTYPES), help="default float32"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 3)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the order in each round")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument(
        "--target-s", type=float, help="seconds per sample (default 0.05, quick 0.005)"
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="L of the sweep (default 64 256 1024 2048 4096)"
    )
    parser.add_argument("--batch", type=int, default=1, help="B (default 1)")
    parser.add_argument("--heads", type=int, default=32, help="H (default 32)")
    parser.add_argument("--head-dim", type=int, default=128, help="Dh (default 128)")
    parser.add_argument(
        "--position", type=int, default=4096, help="position of the decode step (default 4096)"
    )
    parser.add_argument("--no-decode", action="store_true", help="skip the decode step")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--no-peers", action="store_true", help="leave out the other libraries")
    parser.add_argument(
        "--no-compiled",
        action="store_true",
        help="leave out the rows of the kernel torch.compile builds on the CPU",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the cases as JSON")
    parser.add_argument(
        "--attention", action="store_true", help="also the Shaw and bias-attention tables"
    )
    parser.add_argument(
        "--prefill-memory",
        action="store_true",
        help="also a causal prefill's memory in a transformers model (needs transformers)",
    )
    args = parser.parse_args(argv)
    device = _check_device(args.device)
    rounds = args.rounds or (3 if args.quick else 5)
    target_s = args.target_s or (0.005 if args.quick else 0.05)
    lengths = args.lengths or ([64, 1024] if args.quick else [64, 256, 1024, 2048, 4096])
    print(f"torch {torch.__version__}, device {_device_name(device)}, threads {args.threads}")
    cases: list[Case] = []
    for name in args.dtype:
        options: dict[str, Any] = {
            "dtype": _DTYPES[name],
            "device": device,
            "rounds": rounds,
            "shuffle": args.shuffle,
            "target_s": target_s,
            "num_threads": args.threads,
            "peers": not args.no_peers,
            "compiled": not args.no_compiled,
            "batch": args.batch,
            "heads": args.heads,
            "head_dim": args.head_dim,
        }
        sweep = bench_rope_sweep(lengths, backward=not args.no_backward, **options)
        decode = [] if args.no_decode else [bench_rope_decode(position=args.position, **options)]
        print(format_cases([*sweep, *decode]))
        cases += [*sweep, *decode]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump([case.as_dict() for case in cases], file, indent=1)
    if args.attention:
        options = {"device": device, "rounds": rounds, "num_threads": args.threads}
        for length in [256] if args.quick else [512, 1024]:
            shaw = bench_shaw(length, **options)
            print(f"\nShaw key + value terms, {shaw.label}: median, / direct, new tensors")
            print("\n".join(shaw.lines()))
            for name, compared in bench_bias_attention(length, **options).items():
                print(f"\n{name} attention, {compared.label}: median, / by hand, new tensors")
                print("\n".join(compared.lines()))
    if args.prefill_memory:
        length = 2048 if args.quick else 8192
        print(f"\nprefill of {length} tokens, one Llama layer: peak tensor memory")
        for padding in (0, 16):
            peaks = prefill_memory(length, padding=padding)
            ratio = peaks["pecode"] / peaks["transformers sdpa"]
            print(
                f"  {'left-padded' if padding else 'no padding '}  "
                + "  ".join(f"{name} {bytes_ / 2**20:7.1f} MiB" for name, bytes_ in peaks.items())
                + f"  pecode / transformers {ratio:.2f}"
            )
    return cases
