# stepscope: `make run` (the main job) and `make test` both bootstrap .venv through `make setup`.
PYTHON ?= python3
VENV ?= .venv
# The PyTorch requirement; override e.g. `make setup TORCH=torch==2.9.1`.
TORCH ?= torch==2.13.0
# Where the CPU build comes from when no local +cpu wheel exists.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Extras installed into the development environment.
EXTRAS ?= test,lint,triton,mpi,docs
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stepscope-setup

.PHONY: setup run test lint docs docs-outputs browser-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install_torch.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/install_torch.sh $(PY) "$(TORCH)" "$(TORCH_CPU_INDEX)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# The main job: one measured training step of the `small` model, per-phase table; then the HTML report of the
# results folder (the line `report: stepscope-results/report.html` says where).
run: setup
	$(VENV)/bin/stepscope step --model small --batch 4 --seq 128 --mode train --warmup 2 --iters 5
	$(VENV)/bin/stepscope report stepscope-results -o stepscope-results/report.html

test: setup
	$(PY) -m pytest -q

# ruff with the project's rules (pyproject.toml; its default excludes skip no folder of src/ or tests/); the import
# contracts of docs/architecture.md (import-linter, pyproject.toml); no merge-conflict markers anywhere tracked
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	@! git grep -nE '^(<<<<<<<|>>>>>>>)( |$$)' -- . ':!Makefile' || { echo "conflict markers above"; exit 1; }

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or a page missing from the nav fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Rerun every command whose output README.md and docs/*.md show (<!-- output: ... --> blocks; a few minutes on CPU)
docs-outputs: setup
	$(PY) scripts/regen_docs_outputs.py

# A report in headless Chromium: no console errors, every plot laid out, sorting, filtering and the dark scheme
# work, a screenshot (stepscope-results/browser-check.png). REPORT=path checks that page instead of a generated
# one. Installs Debian's chromium where apt-get may (root; BROWSER_INSTALL=0 never does); no browser: a skip.
BROWSER_INSTALL ?= 1
REPORT ?=
browser-check: setup
	@if [ "$(BROWSER_INSTALL)" = 1 ] && [ -z "$$STEPSCOPE_BROWSER" ] && ! command -v chromium >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the browser check"; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && \
	    apt-get install -y -qq chromium >/dev/null 2>&1; } || echo "could not install chromium"; \
	fi
	$(PY) -m stepscope.report.browser_check $(REPORT)

clean:
	rm -rf $(VENV) stepscope-results site
