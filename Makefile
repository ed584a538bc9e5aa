# The two commands of README.md, plus a few for authors.
#   make book   build the HTML book into _build/html (creates .venv on first use)
#   make test   run every test: unit, property, proofs, notebooks (nbval), book build

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test execute lint clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.10 or newer is needed" if sys.version_info < (3, 10) else 0)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Book built: open $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(BIN)/python -m pytest

# Authors: re-execute notebooks after changing them or pecode (NB=notebooks/01_x.ipynb for one).
execute: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NB)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf _build
