# Common verbs. `make demo` and `make test` are README's two commands.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# torch is pinned to the CPU build in pyproject's `torch` extra.
EXTRAS := server,torch,dev

.PHONY: install demo demo-fast server test lint format typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)          ## Vigil embedded + a real 4-rank job with faults; keeps serving
	$(BIN)/vigil demo

demo-fast: $(STAMP)     ## a shorter job, then exit (0: every fault flagged right)
	$(BIN)/vigil demo --fast

server: $(STAMP)
	$(BIN)/vigil server

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy collector detectors backend

test: $(STAMP) lint typecheck   ## the whole suite: lint, types, tests
	$(BIN)/python -m pytest

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache
