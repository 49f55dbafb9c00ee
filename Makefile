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

.PHONY: setup run test lint mutants docs docs-outputs browser-check clean

setup: $(STAMP)

# setup.py and the C sources: the innet fast path is built at install time (a changed source rebuilds it)
$(STAMP): pyproject.toml setup.py scripts/install_torch.sh $(wildcard src/stepscope/innet/csrc/*)
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

# the suite on every core (pytest-xdist; TEST_WORKERS=0 runs it in this process, e.g. to debug one test)
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# Planted bugs (tests/mutants/mutants.toml), one at a time on a copy of the tree, each against the tests that must
# catch it: caught/survived and a summary (docs/contributing-tests.md). Not part of `make test`: it runs the
# named test folders once per mutant. MUTANTS=id,id runs those only.
MUTANTS ?=
mutants: setup
	$(PY) scripts/mutants.py $(if $(MUTANTS),--only $(MUTANTS))

# ruff with the project's rules (pyproject.toml; its default excludes skip no folder of src/ or tests/); the import
# contracts of docs/architecture.md (import-linter, pyproject.toml); no unused names (vulture, pyproject.toml); no
# merge-conflict markers anywhere tracked
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/vulture
	@! git grep -nE '^(<<<<<<<|>>>>>>>)( |$$)' -- . ':!Makefile' || { echo "conflict markers above"; exit 1; }

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or a page missing from the nav fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Rerun every command whose output README.md and docs/*.md show (<!-- output: ... --> blocks; a few minutes on CPU)
docs-outputs: setup
	$(PY) scripts/regen_docs_outputs.py

# A report in headless Chromium: no console errors, every plot laid out, sorting, filtering and the dark scheme
# work, a screenshot (stepscope-results/browser-check.png). REPORT=path checks that page instead of a generated
# one. Finds or installs Chromium wherever it can (scripts/install_browser.sh: STEPSCOPE_BROWSER, PATH, Playwright's
# cache, Debian's chromium as root, Playwright's download; BROWSER_INSTALL=0 installs nothing) and says loudly when
# none could be had: a skip, or a failure with STEPSCOPE_REQUIRE_BROWSER=1 (.ci/run) or CI set.
BROWSER_INSTALL ?= 1
REPORT ?=
browser-check: setup
	@BROWSER_INSTALL=$(BROWSER_INSTALL) scripts/install_browser.sh $(PY)
	$(PY) -m stepscope.report.browser_check $(REPORT)

clean:
	rm -rf $(VENV) stepscope-results site
