# Set-up is part of every target: a fresh machine needs only `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch: `torch>=2.1` where nvidia-smi finds a GPU, else the pin torch==2.13.0.
# The pin is a CPU build only where the package index serves one (on this
# project's machines pip takes it from local disk); on a plain Linux machine with
# the public index it pulls the CUDA build. There, name PyTorch's CPU index:
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# TORCH_SPEC is passed to pip as words (the defaults are quoted for the shell).
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_SPEC ?= $(if $(HAS_GPU),'torch>=2.1','torch==2.13.0')

.PHONY: setup demo test lint bench clean test-press

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m svattn.exact.compile_kernels  # compile once here, never inside a timing
	$(BIN)/python -m svattn.mixers.compile_kernels  # the batched training solver's
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/svattn demo

test: setup
	$(BIN)/ruff check --no-cache src tests benchmarks scripts
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# The press extra's tests (tests/press: kvpress, transformers) in a venv of their own
# under build/, so that `make test` needs none of it. Kept between runs (rebuilt when
# pyproject.toml changes); a cold set-up downloads kvpress's dependencies and compiles the
# exact core's kernels (unless `make setup` has cached them): measured at 5.2 CPU-minutes
# (29 min wall on two cores shared with seven other jobs), the tests 7 min of that wall.
PRESS_VENV := build/press-venv
PRESS_BIN := $(PRESS_VENV)/bin

$(PRESS_BIN)/.installed: pyproject.toml
	test -x $(PRESS_BIN)/python || $(PY) -m venv $(PRESS_VENV)
	$(PRESS_BIN)/python -m pip install -q --upgrade pip
	$(PRESS_BIN)/python -m pip install -q $(TORCH_SPEC)
	$(PRESS_BIN)/python -m pip install -q -e ".[dev,press]"
	$(PRESS_BIN)/python -m svattn.exact.compile_kernels
	$(PRESS_BIN)/python -m svattn.mixers.compile_kernels
	touch $@

test-press: $(PRESS_BIN)/.installed
	$(PRESS_BIN)/python -m pytest -q tests/press

lint: setup
	$(BIN)/ruff check --no-cache src tests benchmarks scripts
	$(BIN)/lint-imports --no-cache

bench: setup
	$(BIN)/python benchmarks/bench_exact.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
