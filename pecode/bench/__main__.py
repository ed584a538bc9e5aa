"""``python -m pecode.bench``: the command line, :func:`pecode.bench.cli.main`."""

from pecode.bench.cli import main

if __name__ == "__main__":
    main()
