# Multi-GPU Lab. Two commands do everything on a fresh machine:
#   make run    execute every notebook headlessly and print a summary (QUICK=1 for the smallest run)
#   make test   unit tests + every notebook headless in quick mode + nbval
#   make sync   after editing a lesson: rewrite every copy derived from it
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
# Test processes (pytest-xdist; each notebook's tests stay in one, tests/conftest.py). 0 on the
# 2-core CI machine: two workers there took 23.5 min against about 18.5 in one process (every
# notebook runs 2 ranks, so two notebooks at once only slow each other); more cores, more workers.
PYTEST_WORKERS ?= 0
# A translated edition (notebooks/i18n/<lang>/): `make run LANG=zh_CN`, `make lab LANG=zh_CN`.
# Only a LANG given on make's command line counts, never the shell's locale (LANG=en_US.UTF-8).
EDITION := $(if $(filter command line,$(origin LANG)),$(filter-out en,$(LANG)))
IN_EDITION := $(if $(EDITION),env -u LANG MULTIGPU_LAB_LANG=$(EDITION))
# Real MNIST slice for offline runs, when the shared folder is beside the checkout.
ifneq ($(wildcard ../shared/data/MNIST),)
export MULTIGPU_LAB_DATA ?= $(abspath ../shared/data)
endif

.PHONY: run test unit scale gpu-check lab lab-copy lab-reset lint student clean setup chromium zh sync git-filter

setup: $(STAMP)

# Optional packages that cost seconds at import and that nothing here uses. rfc3987-syntax
# (JupyterLab's jupyter-events asks for it through jsonschema[format-nongpl]) compiles an Earley
# grammar whenever jsonschema is imported: 2.1 s in every process that imports nbformat, which is
# every papermill, nbconvert and nbval run (papermill on a one-cell notebook: 4.0 s -> 1.6 s). It
# only adds jsonschema's "iri" format check, which no schema of the kit or of Jupyter uses, and
# jsonschema leaves a format unchecked when its checker is missing.
SLOW_IMPORTS := rfc3987-syntax

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip uninstall --yes --quiet $(SLOW_IMPORTS)
	$(PY) -m ipykernel install --sys-prefix --name multigpu-lab --display-name "Python 3 (Multi-GPU Lab)" >/dev/null
	@command -v ip >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends iproute2; } || \
		echo "no iproute2: notebook 14 runs its two agents on loopback"
	$(MAKE) --no-print-directory git-filter
	touch $(STAMP)

# Outputs never reach git: .gitattributes sends every *.ipynb through nbstripout's clean filter,
# defined here in this checkout's .git/config with this venv's Python: `git diff` of a notebook
# saved after a run is empty, and `make lab`'s post-save hook (labtools/savehook.py) refreshes the
# index entry git would otherwise judge by the file's size, so `git status` stays clean and `git
# pull` updates the notebook (tests/test_saved_notebooks.py). Not `nbstripout --install`: it
# writes no --keep-id, and without it the filter renumbers the committed cell ids ("0", "1", ...),
# so every notebook would show as modified. The extra keys are what a kernel's run adds to the
# committed language_info {"name": "python"} (nbstripout drops execution counts, outputs, widget
# state and cell timings by default, and keeps tags and the kernelspec: the lessons name the
# kernel `setup` installs, multigpu-lab, and JupyterLab writes that kernel's spec back as it is, so
# a save from `make lab` keeps it). Outside a git checkout (a tarball, the Docker image) there is
# nothing to configure.
NBSTRIPOUT := "$(abspath $(PY))" -m nbstripout --keep-id
NBSTRIPOUT_KEYS := $(addprefix metadata.language_info.,codemirror_mode file_extension mimetype \
	nbconvert_exporter pygments_lexer version)
git-filter:
	@if command -v git >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1 && \
		[ -z "$$(git rev-parse --show-prefix)" ]; then \
		git config filter.nbstripout.clean '$(NBSTRIPOUT)' && \
		git config filter.nbstripout.smudge cat && \
		git config filter.nbstripout.required true && \
		git config filter.nbstripout.extrakeys '$(NBSTRIPOUT_KEYS)' && \
		git config diff.ipynb.textconv '$(NBSTRIPOUT) -t'; fi

run: $(STAMP)
	$(IN_EDITION) $(PY) -m labtools.runner $(if $(filter 1 true yes,$(QUICK)),--quick) \
		$(if $(PARAMS),--params "$(PARAMS)") $(if $(BASELINE),--baseline "$(BASELINE)") \
		$(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS)) $(if $(EDITION),--lang $(EDITION))

test: $(STAMP) chromium lint
	$(PY) -m pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

# The unit lane, in seconds: no notebook executed and no process started (tests/conftest.py marks
# the tests that do `notebook` and `job`). `make test` runs them all.
unit: $(STAMP)
	$(PY) -m pytest -m "not notebook and not job" $(PYTEST_ARGS)

# The scale lane alone (tests/test_scale.py, part of `make test`): every multi-rank script the
# lessons write at world sizes 1, 3 and 4 (gloo processes) and 8 (simulated in one process),
# then its table: script x world -> ran and what held / refused and why.
scale: $(STAMP)
	$(PY) -m pytest tests/test_scale.py -q $(PYTEST_ARGS); status=$$?; cat runs/scale-lane.md; exit $$status

# The GPU path in one short run: runs/<timestamp>/ with summary.json, the hardware and the
# figures for benchmarks/RESULTS.md. Without a GPU it says so and exits 0 (nothing heavy runs).
gpu-check: $(STAMP)
	$(PY) -m labtools.gpucheck

# JupyterLab on lab/, the learner's copy: the lessons with every exercise open (solution cells
# stubbed, checks intact), written by labtools.student on each start; a notebook you changed
# there is kept, with a line saying how to get the new one (`make lab-reset` rewrites them all).
# SOLUTIONS=1 (instructors): notebooks/, the answer key CI runs, with the post-save hook that
# keeps `git status` clean (labtools/savehook.py; in lab/, git-ignored, it does nothing).
# With LANG=zh_CN: JupyterLab's menus in Chinese (language pack, default set by the overrides
# file below; Settings > Language switches back) and the file browser in lab/zh_CN (or, with
# SOLUTIONS=1, notebooks/zh_CN).
SOLUTIONS ?= 0
LAB_DIR := $(if $(filter 1 true yes,$(SOLUTIONS)),notebooks,lab)
lab: $(STAMP) $(if $(filter notebooks,$(LAB_DIR)),zh,lab-copy) git-filter
	$(IN_EDITION) $(PY) -m jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=$(LAB_DIR) \
		--ContentsManager.post_save_hook=labtools.savehook.refresh_git_index \
		$(if $(EDITION),--LabApp.app_settings_dir=$(abspath notebooks/i18n/$(EDITION)/jupyterlab) \
		--LabApp.default_url=/lab/tree/$(EDITION)) \
		--IdentityProvider.token=$${JUPYTER_TOKEN:-$$($(PY) -c 'import secrets; print(secrets.token_hex(16))')}

# lab/ (every edition) refreshed; lab-reset replaces it, your changes there included.
lab-copy: $(STAMP)
	$(PY) -m labtools.student --lab

lab-reset: $(STAMP)
	$(PY) -m labtools.student --lab --reset

# The Chinese edition, notebooks/zh_CN/, built from the English notebooks and the translations
# in notebooks/i18n/zh_CN/ (a notebook you changed there is kept, not overwritten).
zh: $(STAMP)
	$(PY) -m labtools.translate build zh_CN

# Debian's chromium and the Latin, CJK and emoji fonts of the real-browser test
# (tests/test_browser.py); a no-op once installed.
chromium:
	@bash scripts/install-chromium.sh

# A copy to hand out, made like lab/ (labtools.student) but replaced wholesale: student/
# (LANG=zh_CN: the Chinese copy in student/zh_CN/; run it after the English one to keep both).
student: $(STAMP)
	$(PY) -m labtools.student --out student$(if $(EDITION),/$(EDITION) --lang $(EDITION))

# One source, one refresh: every copy derived from the lessons and catalog.json (header time
# lines, translation todo markers, gettext catalogs, scripts/ddp_*.py, the start page, the nbval
# recordings; labtools/sync.py). tests/test_sync.py fails while one is stale.
sync: $(STAMP)
	$(PY) -m labtools.sync

lint: $(STAMP)
	$(PY) -m ruff check helpers labtools tests notebooks benchmarks scripts
	$(PY) -m ruff format --check helpers labtools tests notebooks benchmarks scripts
	$(PY) -m labtools.exported_scripts lint

# A two-node Slurm cluster on this machine, for notebook 14 and the slurm test lane: a controller
# and two compute nodes in network namespaces, Debian's slurm-wlm and munge (installed with apt
# when missing; needs root), config, spool and munge key in cluster/slurm/local/. Idempotent.
# Then: export SLURM_CONF=$(CURDIR)/cluster/slurm/local/etc/slurm.conf; sinfo
.PHONY: slurm-up slurm-down
slurm-up:
	$(PYTHON) cluster/slurm/localcluster.py up

slurm-down:
	$(PYTHON) cluster/slurm/localcluster.py down

clean:
	rm -rf runs work notebooks/work student .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
