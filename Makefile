# Tandem developer entry points. `make test` and `make demo` work on a fresh
# machine: they create .venv and install the project from its own files.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup test lint typecheck protos protos-check demo replay bench screenshots e2e-real clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,dev,demo]'
	touch $(STAMP)

setup: $(STAMP)

## Regenerate the committed protobuf/gRPC code from protos/tandem/v1/*.proto.
protos: setup
	$(PY) scripts/protos.py

## Fail when the committed generated code differs from what the .proto files give.
protos-check: setup
	$(PY) scripts/protos.py --check

## ruff (lint and format check), then the architecture contracts (.importlinter): the core stays pure,
## shells stay apart, the broker's rooms stay in their layers.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

## mypy --strict on the core and every shell.
typecheck: setup
	$(VENV)/bin/mypy jsonlogs placement fleetplan broker extender sim fleetsim scripts

test: setup protos-check lint typecheck
	$(PY) -m pytest -q

## The fleet end to end: the default fleet, a training mix, Tandem against the baselines (fleetsim).
demo: setup
	$(PY) -m fleetsim

## The placement-quality replay of the Alibaba GPU trace (FGD protocol), as a table.
replay: setup
	$(PY) -m sim.demo

## The kube API contract suite and the end-to-end suite against a real control plane (see README,
## "Against a real cluster"): TANDEM_REAL_KUBECONFIG names a cluster-admin kubeconfig of it.
e2e-real: setup
	@test -n "$$TANDEM_REAL_KUBECONFIG" || { echo "set TANDEM_REAL_KUBECONFIG (and TANDEM_REAL_EXTENDER_URL): see README"; exit 2; }
	$(PY) -m pytest -q -m realcluster tests/kubeapi_contract tests/e2e

## Every benchmark writes bench/results/<name>.md and a JSON twin.
bench: setup
	@set -e; for b in bench/bench_*.py; do \
	  echo "== $$b"; $(PY) -m bench.$$(basename $$b .py); \
	done

## The fleet view's screenshots in docs/fleet-view/ (the browser tests, writing a PNG of each page).
screenshots: setup
	TANDEM_SCREENSHOT_DIR=docs/fleet-view $(PY) -m pytest -q tests/browser

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache build *.egg-info
