"""Re-execute notebooks in place and normalize them, so their outputs can be committed.

Usage: python tools/execute_notebooks.py [notebooks/NN_topic.ipynb ...]   (default: all)

Each notebook runs top to bottom in a fresh kernel of this environment, with the
notebook's folder as working directory, exactly as nbval will re-run it. Afterwards
cell metadata that changes from run to run (timings, ids of widgets) is dropped; the
execution counts stay, because nbval only compares cells that have one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
VOLATILE_CELL_KEYS = ("execution", "ExecuteTime", "collapsed", "scrolled")


def merge_streams(outputs: list) -> list:
    """Join consecutive outputs of the same stream: the kernel splits prints arbitrarily."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and output.get("output_type") == "stream"
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def normalize(nb: nbformat.NotebookNode) -> None:
    """Drop run-dependent metadata; keep tags, outputs and execution counts."""
    nb.metadata.pop("widgets", None)
    nb.metadata.get("language_info", {}).pop("version", None)
    for index, cell in enumerate(nb.cells):
        cell["id"] = str(index)  # stable ids, numbered as nbstripout numbers them
        for key in VOLATILE_CELL_KEYS:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=1800,  # chapter 14 trains 25 models in one cell (about ten minutes)
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    client.execute()
    elapsed = time.perf_counter() - start
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                raise SystemExit(f"{path}: a cell wrote to stderr:\n{output['text']}")
    normalize(nb)
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path}: executed in {execute(path):.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
