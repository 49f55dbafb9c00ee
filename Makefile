# stepscope: `make run` (the main job) and `make test` both bootstrap .venv through `make setup`.
PYTHON ?= python3
VENV ?= .venv
# The PyTorch requirement; override e.g. `make setup TORCH=torch==2.9.1`.
TORCH ?= torch==2.13.0
# Where the CPU build comes from when no local +cpu wheel exists.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Extras installed into the development environment.
EXTRAS ?= test,lint,triton,mpi
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stepscope-setup

.PHONY: setup run test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install_torch.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/install_torch.sh $(PY) "$(TORCH)" "$(TORCH_CPU_INDEX)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# The main job: one measured training step of the `small` model, per-phase table.
run: setup
	$(VENV)/bin/stepscope step --model small --batch 4 --seq 128 --mode train --warmup 2 --iters 5

test: setup
	$(PY) -m pytest -q

# ruff with the project's rules (pyproject.toml); its default excludes skip no folder of src/ or tests/
lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) stepscope-results
