# Multi-GPU Lab. Two commands do everything on a fresh machine:
#   make run    execute every notebook headlessly and print a summary (QUICK=1 for the smallest run)
#   make test   unit tests + every notebook headless in quick mode + nbval
#   make gpu-check  on a GPU machine: doctor, every notebook quick, the benchmarks briefly (< 8 min)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
QUICK ?= 0
PARAMS ?=
BASELINE ?=
NOTEBOOKS ?=
PYTEST_ARGS ?=
# Real MNIST slice for offline runs, when the shared folder is beside the checkout.
ifneq ($(wildcard ../shared/data/MNIST),)
export MULTIGPU_LAB_DATA ?= $(abspath ../shared/data)
endif

.PHONY: run test gpu-check lab lint student clean setup chromium

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name multigpu-lab --display-name "Python 3 (Multi-GPU Lab)" >/dev/null
	@command -v ip >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends iproute2; } || \
		echo "no iproute2: notebook 09 runs its two agents on loopback"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m helpers.runner $(if $(filter 1 true yes,$(QUICK)),--quick) \
		$(if $(PARAMS),--params "$(PARAMS)") $(if $(BASELINE),--baseline "$(BASELINE)") \
		$(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS))

test: $(STAMP) chromium
	$(PY) -m ruff check helpers tests notebooks benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

# The GPU path in one short run: runs/<timestamp>/ with summary.json, the hardware and the
# figures for benchmarks/RESULTS.md. Without a GPU it says so and exits 0 (nothing heavy runs).
gpu-check: $(STAMP)
	$(PY) -m helpers.gpucheck

lab: $(STAMP)
	$(PY) -m jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=notebooks \
		--IdentityProvider.token=$${JUPYTER_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(16))')}

# Debian's chromium for the real-browser test (tests/test_browser.py); a no-op once installed.
chromium:
	@bash scripts/install-chromium.sh

# The workshop copy: solution cells replaced by stubs, checks intact, in student/.
student: $(STAMP)
	$(PY) -m helpers.student --out student

lint: $(STAMP)
	$(PY) -m ruff check helpers tests notebooks benchmarks

clean:
	rm -rf runs work notebooks/work student .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
