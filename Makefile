# Quick start:
#   make dry-run   -- install the runtime lock into .venv-dry-run and dry-run the policy over
#                     examples/cluster-snapshot.yaml (no dev tools, no cluster)
#   make test      -- install everything the tests need (Python deps, Go-built control plane) and run the suite
VENV ?= .venv
PY := $(VENV)/bin/python
# make dry-run: only what the offline path imports (click, PyYAML), at the versions pinned in
# the runtime lock (requirements.lock), run from the source tree.
DRY_VENV ?= .venv-dry-run
DRY_PY := $(DRY_VENV)/bin/python
SNAPSHOT ?= examples/cluster-snapshot.yaml

.PHONY: dry-run test venv tools cluster lint unit bench promtool helm chart image-tools image-test

venv: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.lock pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.lock
	$(PY) -m pip install -q --disable-pip-version-check "setuptools>=70.1"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(DRY_VENV)/.installed: requirements.lock
	python3 -m venv $(DRY_VENV)
	awk '/^[A-Za-z0-9]/{keep = (tolower($$0) ~ /^(click|pyyaml)==/)} keep' requirements.lock > $(DRY_VENV)/requirements.txt
	$(DRY_PY) -m pip install -q --disable-pip-version-check --only-binary=:all: -r $(DRY_VENV)/requirements.txt
	touch $@

dry-run: $(DRY_VENV)/.installed
	$(DRY_PY) -m controller --dry-run --from-file $(SNAPSHOT)

# promtool (Debian package prometheus) for tests/unit/test_monitoring.py; installed when missing.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "promtool missing: installing Debian's prometheus package"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
	  || { echo "ERROR: cannot install promtool (apt-get install prometheus failed; needs root and the Debian mirror)" >&2; exit 1; }; }

tools:
	bash tools/build.sh

# The Dockerfile's image, built with buildah on a Debian-made base and run (tests/plane/test_image.py).
image-tools:
	@command -v buildah >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 || { \
	  echo "buildah/debootstrap missing: installing Debian's packages"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah debootstrap >/dev/null; } \
	  || { echo "ERROR: cannot install buildah and debootstrap (apt-get failed; needs root and the Debian mirror)" >&2; exit 1; }; }

image-test: venv tools image-tools
	$(PY) -m pytest -m image tests/plane/test_image.py

# The Helm chart is generated from manifests/: run after changing anything there
# (tests/unit/test_chart.py fails while the chart is stale).
chart: venv
	$(PY) tools/gen_chart.py

# helm alone (chart tests), from tools/helm; `make tools` builds it too.
helm:
	bash tools/build.sh helm

lint: venv
	$(VENV)/bin/ruff check controller evaluation tests bench tools
	$(VENV)/bin/mypy

# The unit tier: the Python dependencies alone, no Go-built tool (tests/unit not marked tools).
unit: venv
	$(PY) -m pytest -m unit

# The trace evaluation of docs/evaluation.md (tuning + 5 held-out windows x 10 label seeds).
.PHONY: eval-trace
eval-trace: venv
	$(PY) bench/trace_eval.py --jobs $(or $(EVAL_JOBS),2)

# The whole suite, the image test included (pyproject's addopts leave it out of a bare pytest).
test: venv tools promtool image-tools lint
	$(PY) -m pytest -m "(image or not image) and not gpu"
	$(MAKE) test-compiled

# The node agent on a real NVIDIA GPU, witnessed by nvidia-smi (needs a driver; CI has none).
.PHONY: test-gpu
test-gpu: venv
	$(PY) -m pytest -m gpu tests/gpu

cluster: venv tools
	$(PY) -m tests.support.cluster $(CLUSTER_ARGS)

# HAMi's scheduler on the plane: the longer mixed arrival of fractional, whole and multi-GPU Jobs,
# HAMi's defaults vs the controller's rules (`make test` runs the short one, 1 node x 3 cards).
.PHONY: hami-long
hami-long: venv tools
	WDRF_HAMI_NODES=$${WDRF_HAMI_NODES:-3x4} \
	WDRF_HAMI_ARRIVALS=$${WDRF_HAMI_ARRIVALS:-f,h,f,w,f,g2,h,f,w,f,g2,f,f,g4} \
	$(PY) -m pytest -s -p no:cacheprovider tests/plane/test_hami_plane.py -k binpack

# The plane tests beside a CPU hog: CI's 2-core machine shares its CPU with the plane, so a
# test that passes only on a quiet machine fails a submission. HOGS busy loops (default 1, each
# ended after HOG_SECONDS at the latest) run next to pytest; PLANE_TESTS picks the tests
# (default: every plane test; e.g. PLANE_TESTS="tests/plane/test_live_reliability.py").
# The machine's load is printed before and after; PYTEST_ARGS go to pytest (e.g. -s). The
# paused-leader repetition of test_live_reliability.py runs WDRF_PAUSES times (default 1).
.PHONY: test-under-load
test-under-load: venv tools
	@pids=""; for i in $$(seq $(or $(HOGS),1)); do \
	  timeout $(or $(HOG_SECONDS),3600) sh -c 'while :; do :; done' & pids="$$pids $$!"; done; \
	  trap 'kill $$pids 2>/dev/null' EXIT INT TERM; uptime; \
	  $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) -m plane \
	    $(or $(PLANE_TESTS),tests/plane); rc=$$?; \
	  uptime; exit $$rc

# The paused-leader proof beside a CPU hog: the leader paused WDRF_PAUSES times (default 50)
# at random points of its writes; prints per pause and in total the hand-over, the writes, the
# compare-and-swap conflicts and the old leader's writes after the new leader's first, by the
# audit log and by the Workloads' history (resourceVersions, managedFields).
.PHONY: test-paused-leader
test-paused-leader:
	WDRF_PAUSES=$${WDRF_PAUSES:-50} $(MAKE) test-under-load PYTEST_ARGS=-s \
	  PLANE_TESTS=tests/plane/test_live_reliability.py::test_paused_leader_never_writes_after_the_new_leader

# Issue 12 soak on the real plane (default 20 min; CI runs the 60 s variant in `make test`).
.PHONY: soak
soak: venv tools
	WDRF_SOAK_SECONDS=$${WDRF_SOAK_SECONDS:-1200} $(PY) -m pytest -s -p no:cacheprovider tests/plane/test_live_soak.py

# The planner compiled with mypyc (optional; tools/compile.py, docs/policy.md "Performance"):
# C extensions beside the sources in controller/, which Python imports instead of the .py
# files until `make pure` removes them. Needs gcc and the Python headers. Pure Python stays
# the source tree's default: `make venv` and the test suite use it; `make test` then builds it
# once to compare it with pure Python (`test-compiled`). The image builds its own (Dockerfile,
# COMPILED=true by default; tests/plane/test_image.py checks it). `make bench-compiled` times
# both builds in alternating fresh processes and checks their plans are the same; with a build
# in place the unit tests compare the two as well (tests/unit/test_compiled.py).
.PHONY: compiled pure bench-compiled
compiled: venv
	$(PY) tools/compile.py

pure:
	$(PY) tools/compile.py --clean

bench-compiled: compiled
	$(PY) bench/compiled_bench.py $(BENCH_ARGS)

# `make test`'s last step: build the compiled planner (about 1 min), check it plans exactly as
# pure Python (tests/unit/test_compiled.py), and remove it again, whatever the outcome.
.PHONY: test-compiled
test-compiled: venv
	@trap '$(PY) tools/compile.py --clean' EXIT; \
	  $(PY) tools/compile.py && $(PY) -m pytest -p no:cacheprovider tests/unit/test_compiled.py
