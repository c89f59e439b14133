# Entry points for a new user and for CI. Needs only python3 (3.11+), pip and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format clean

setup: $(STAMP)

# pip's output goes to $(SETUP_LOG), shown (its end) only when pip fails.
SETUP_LOG := $(VENV)/setup.log
PIP = $(BIN)/python -m pip --disable-pip-version-check --no-input install -q
QUIET = >>$(SETUP_LOG) 2>&1 || { tail -n 40 $(SETUP_LOG); \
	echo "make setup: pip failed (its whole output: $(SETUP_LOG))"; exit 1; }

$(STAMP): pyproject.toml
	@echo "make setup: installing into $(VENV) (about a minute on an idle machine; pip's output: $(SETUP_LOG))"
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && : > $(SETUP_LOG) && \
	{ $(PIP) --upgrade pip $(QUIET); } && \
	{ $(PIP) torch==$(TORCH) $(QUIET); } && \
	{ $(PIP) -e '.[$(EXTRAS)]' $(QUIET); } && \
	touch $(STAMP) && \
	echo "make setup: done in $$(( $$(date +%s) - start )) s"

# torch is pinned here only (pyproject says torch>=2.4); 2.13.0 has a CPU build.
TORCH := 2.13.0
EXTRAS := test,dev,plot,opt,hf,data,video,heif,tensorboard,lora,trl

demo: setup
	$(BIN)/datacentric demo --out runs/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The torch-free layers' tests run where `import torch` fails, then everything else, each on
# TEST_WORKERS processes (pytest-xdist; a test file's tests stay on one worker), torch on one
# thread in each (OMP_NUM_THREADS=1: two workers of two threads each fought over the cores,
# the commands the tests start inherit it). The slowest tests and the wall time are printed
# at the end (aim: under 15 minutes on an idle 2-core machine). `make test TEST_WORKERS=0`
# runs them in this one process.
TEST_WORKERS ?= 2
test: setup lint
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=5 -p tests.no_torch tests/pure && \
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15 \
		--ignore=tests/pure; status=$$?; \
	echo "make test: $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s of wall time"; \
	exit $$status

clean:
	rm -rf $(VENV) runs .pytest_cache
