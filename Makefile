# Quick start:
#   make dry-run   -- install into .venv and dry-run the policy over examples/cluster-snapshot.yaml
#   make test      -- install everything the tests need (Python deps, Go-built control plane) and run the suite
VENV ?= .venv
PY := $(VENV)/bin/python
SNAPSHOT ?= examples/cluster-snapshot.yaml

.PHONY: dry-run test venv tools cluster lint unit bench

venv: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.lock pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.lock
	$(PY) -m pip install -q --disable-pip-version-check "setuptools>=70.1"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

dry-run: venv
	$(PY) -m controller --dry-run --from-file $(SNAPSHOT)

tools:
	bash tools/build.sh

lint: venv
	$(VENV)/bin/ruff check controller tests bench tools
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest -m "not plane and not e2e"

test: venv tools lint
	$(PY) -m pytest

cluster: venv tools
	$(PY) -m tests.support.cluster $(CLUSTER_ARGS)
