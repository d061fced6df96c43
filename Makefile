# The two commands of the README: `make run` (the main job: examples/movielens.py) and
# `make test` (the suite). `make demo` runs the torch-free demo (python -m evdb.demo).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned so pip takes the local CPU build instead of downloading a CUDA one.
TORCH_PIN := torch==2.13.0

.PHONY: run demo test bench lint venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e .

run: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e .
	$(BIN)/python examples/movielens.py

demo: venv
	$(BIN)/python -m evdb.demo

test: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -m pytest -q

bench: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN) psutil
	$(BIN)/pip install -q -e .
	$(BIN)/python bench/bench_lookup.py
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_tiers.py
	$(BIN)/python bench/bench_io.py
	$(BIN)/python bench/bench_torch.py

lint: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check evdb tests bench tools examples api
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
