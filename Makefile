# Entry points for a new user and for CI. Needs only python3 (3.11+), pip and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned here only (pyproject says torch>=2.4); 2.13.0 has a CPU build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,dev,plot,opt,hf,data,video,tensorboard,lora,trl]'
	touch $(STAMP)

demo: setup
	$(BIN)/datacentric demo --out runs/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The torch-free layers' tests run where `import torch` fails, then everything else.
test: setup lint
	$(BIN)/python -m pytest -q -p tests.no_torch tests/pure
	$(BIN)/python -m pytest -q --ignore=tests/pure

clean:
	rm -rf $(VENV) runs .pytest_cache
