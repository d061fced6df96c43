# The two commands of the README: `make run` (the main job: examples/movielens.py, which ends
# by serving its snapshot over REST once) and `make test` (the suite). `make serve` serves the
# example's snapshot until Ctrl-C; `make demo` runs the torch-free demo (python -m evdb.demo).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned so pip takes the local CPU build instead of downloading a CUDA one.
TORCH_PIN := torch==2.13.0

EXAMPLE_OUT := .evdb-example

.PHONY: run serve demo test bench lint venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e .

run: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[serve]'
	$(BIN)/python examples/movielens.py --out $(EXAMPLE_OUT)

serve: $(BIN)/python
	$(BIN)/pip install -q -e '.[serve]'
	$(BIN)/evdb serve $(EXAMPLE_OUT)/serving --port 8000

demo: venv
	$(BIN)/python -m evdb.demo

test: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -m pytest -q

bench: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_PIN) psutil redis
	$(BIN)/pip install -q -e '.[serve]'
	$(BIN)/python bench/bench_lookup.py
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_tiers.py
	$(BIN)/python bench/bench_io.py
	$(BIN)/python bench/bench_torch.py
	$(BIN)/python bench/bench_rest.py
	$(BIN)/python bench/bench_distributed.py
	$(BIN)/python bench/bench_neighbors.py
	$(BIN)/python bench/bench_freshness.py
	$(BIN)/python bench/bench_growth.py
	$(BIN)/python bench/bench_threads.py
	$(BIN)/python bench/bench_calls.py

lint: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check evdb tests bench tools examples api
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache $(EXAMPLE_OUT)
