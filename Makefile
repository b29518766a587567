# Two entry points: `make demo` (the main job, offline) and `make test` (the suite CI runs).
# Both create .venv on first use, with everything a developer needs (the train, dev, hf and tune
# extras; a device needs only `pip install '.[serve]'`, which has no torch). TORCH picks the torch build: the default is the CPU wheel that
# lies on this machine's disk; elsewhere add TORCH_INDEX=https://download.pytorch.org/whl/cpu for
# CPU, or a CUDA index (e.g. .../whl/cu126) for a GPU build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin

.PHONY: install demo test lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[train,dev,hf,tune]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/lsan demo

test: lint
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check lsan export serving benchmarks tests
	$(BIN)/ruff format --check lsan export serving benchmarks tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs
