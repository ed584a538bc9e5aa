# The two commands of README.md, plus a few for authors.
#   make book             build the HTML book into _build/html (creates .venv on first use)
#   make test             run every test: unit, property, proofs, notebooks (nbval), book build
#   make test-other-cpu   the notebooks again, with other float kernels (CI runs it too)
#   make gpu-wheels       (with network) the wheels that make test-gpu installs
#   make test-gpu         (on a CUDA machine with PyTorch, no network needed) notebooks on the GPU
#   make test-oldest      pecode's unit tests on the oldest versions pyproject.toml accepts
#   make test-hf-latest   the Hugging Face parity tests on the newest transformers (CI runs it)
#   make browser          (as root, with apt-get) Debian's chromium, for the browser tests
#                         tests/test_browser_*.py; otherwise says why not (they skip)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test test-other-cpu browser gpu-wheels test-gpu test-oldest test-hf-latest execute lint clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.10 or newer is needed" if sys.version_info < (3, 10) else 0)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Book built: open $(CURDIR)/_build/html/index.html"

# pytest-xdist: one worker per core, a file at a time (a notebook's cells share a kernel;
# conftest.py hands out the longest files first). WORKERS=1 runs it all in one process.
WORKERS ?= auto
XDIST = -n $(WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST)

# Every notebook once more, with other float kernels than make test's on an AVX-512 CPU:
# ATen's AVX2 kernels, MKL's conditional-reproducibility compatible code path (another
# BLAS rounding), one thread (other reductions).
# The committed outputs must still pass: they are properties of the math, not of the
# machine that wrote them (tests/nbval_tolerance.py says how numbers are compared).
# Inductor's cache does not tell kernels compiled under another ATEN_CPU_CAPABILITY apart
# (FlexAttention's gave wrong outputs when reused): these kernels get a cache of their own.
test-other-cpu: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1 \
	TORCHINDUCTOR_CACHE_DIR=$${TMPDIR:-/tmp}/torchinductor-pecode-avx2-$$(id -u) \
	$(BIN)/python -m pytest $(XDIST) notebooks

# Headless Chromium for the browser tests (tests/test_browser_*.py), which open built pages
# offline: MathJax (vendored by book/_ext/mathjax_offline.py) typesets them, search lists
# chapters first, tables fit the column. .ci/run calls this first. It never fails: without root (or passwordless sudo), apt-get or a
# reachable Debian mirror it says why, and those tests skip with their reason.
BROWSER_APT := env DEBIAN_FRONTEND=noninteractive apt-get

browser:
	@if command -v chromium >/dev/null 2>&1; then \
		echo "make browser: $$(command -v chromium) is installed"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "make browser: skipped, no apt-get here (the browser tests will skip)"; \
	else \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
		else echo "make browser: skipped, not root (the browser tests will skip)"; exit 0; fi; \
		if $$sudo $(BROWSER_APT) update -qq && $$sudo $(BROWSER_APT) install -y -qq chromium; \
		then echo "make browser: chromium installed"; \
		else echo "make browser: apt-get could not install chromium (the browser tests will skip)"; fi; \
	fi

# The GPU run, for a CUDA machine that has PyTorch (and pytest, sympy, matplotlib,
# hypothesis, numpy, tqdm) but no network. First, on a machine with network, fetch the
# Jupyter packages it lacks, as wheels for its Python (GPU_PYTHON, default 3.12), pinned
# as in requirements.txt; copy the folder along with the checkout.
GPU_PYTHON ?= 3.12
GPU_WHEELS := .gpu-wheels
GPU_PACKAGES := nbval ipykernel nbclient nbformat

gpu-wheels:
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
		--python-version $(GPU_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
		-c requirements.txt -d $(GPU_WHEELS) $(GPU_PACKAGES)
	@echo "Wheels for Python $(GPU_PYTHON) in $(GPU_WHEELS)/"

# On the GPU machine: the wheels unpacked into a folder on PYTHONPATH beside the
# machine's own PyTorch (a venv made from a venv's Python would not see it), pecode from
# this checkout; then every notebook under nbval on the GPU, against the same committed
# outputs as on the CPU, and the tests marked `cuda`.
GPU_SITE := .gpu-site
GPU_ENV := PYTHONPATH=$(CURDIR)/$(GPU_SITE):$(CURDIR) PECODE_DEVICE=cuda
# the machine's own pytest plugins stay out; nbval is loaded by name
GPU_PYTEST := $(GPU_ENV) PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(PYTHON) -m pytest -p nbval.plugin \
	-p no:cacheprovider

test-gpu:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
		--no-compile --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl
	$(GPU_ENV) $(PYTHON) -c 'import sys, torch; \
		sys.exit(0 if torch.cuda.is_available() else "make test-gpu needs a CUDA device")'
	$(GPU_PYTEST) notebooks
	$(GPU_PYTEST) -m cuda $(shell grep -l 'mark.cuda' tests/test_*.py)

# pecode's unit tests (not the notebooks or the book) on the lower bounds of
# pyproject.toml, in a venv of their own, so that the declared range is a tested one.
# On Linux, PyPI's torch is a CUDA build (several GB); pass
# OLDEST_TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu" for the CPU build.
OLDEST_VENV := .venv-oldest
OLDEST_TORCH_INDEX ?=
OLDEST_PINS := numpy==1.24.4 sympy==1.13.3 matplotlib==3.7.0 tqdm==4.60.0 \
	pytest==9.2.0 hypothesis==6.170.15 PyYAML==6.0.3
BOOK_TESTS := book browser_layout browser_math config evidence_links quoted_numbers style nbval_tolerance testref
PACKAGE_TESTS := $(filter-out $(BOOK_TESTS:%=tests/test_%.py),$(wildcard tests/test_*.py))

test-oldest:
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		$(OLDEST_TORCH_INDEX) torch==2.7.0
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check $(OLDEST_PINS)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(OLDEST_VENV)/bin/python -m pytest -o addopts="" -p no:cacheprovider $(PACKAGE_TESTS)

# The tests that compare pecode with transformers, on its newest release as well as the
# pinned one, so that the next renamed argument is caught the day it ships (transformers
# 5.24 renamed the cache argument). A venv of its own that sees .venv's packages through a
# .pth file placed after its own site-packages: only transformers (and whatever newer
# versions of its dependencies it needs) is installed there.
HF_LATEST_VENV := .venv-hf-latest
HF_TESTS := $(shell grep -l 'transformers' $(wildcard tests/test_*.py) | xargs grep -lE \
	'importorskip\("transformers"\)|^from transformers|^import transformers')

test-hf-latest: $(STAMP)
	test -x $(HF_LATEST_VENV)/bin/python || $(PYTHON) -m venv $(HF_LATEST_VENV)
	$(BIN)/python -c 'import site; print(site.getsitepackages()[0])' > \
		"$$($(HF_LATEST_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/_pecode_base.pth"
	$(HF_LATEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade transformers
	$(HF_LATEST_VENV)/bin/python -c 'import transformers; print("make test-hf-latest: transformers", transformers.__version__)'
	$(HF_LATEST_VENV)/bin/python -m pytest -o addopts="-ra" -p no:cacheprovider $(HF_TESTS)

# Authors: re-execute notebooks after changing them or pecode (NB=notebooks/01_x.ipynb for one).
execute: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NB)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf _build
