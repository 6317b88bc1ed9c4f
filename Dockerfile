# syntax=docker/dockerfile:1
# WDRF controller image.
#   docker build -t wdrf-controller:0.1.0 .
#   docker build --build-arg COMPILED=false -t wdrf-controller:0.1.0 .   # pure-Python planner
# Two stages on the same pinned base: "build" installs the pinned runtime dependencies
# (requirements.lock, wheels only) and the controller into a virtual environment, /opt/wdrf;
# with COMPILED=true (the default) it then compiles the planner's modules with mypyc
# (tools/compile.py; docs/policy.md, "Compiled") and adds the C extensions to the installed
# package. The compiler (Debian's gcc and libc headers) and mypy (requirements-dev.lock's pins,
# wheels only, in a throwaway environment, /opt/mypyc) exist in "build" only: "runtime" copies
# only /opt/wdrf, so no compiler, libc headers or mypy reach the final image.

ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# true: the planner ships compiled (the same plans as pure Python in less CPU time);
# false: pure Python, and nothing is compiled or installed with apt.
ARG COMPILED=true
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/wdrf
COPY requirements.lock ./
# --only-binary: every pinned dependency must come as a wheel; nothing is compiled here.
RUN /opt/wdrf/bin/pip install --only-binary=:all: --no-deps -r requirements.lock
# The compiler, in this stage only: gcc and the libc headers (the base image has Python's),
# and a throwaway environment with the runtime lock (tools/compile.py imports the modules),
# mypy with what it needs, and PyYAML's stubs (mypyc type-checks what the modules import), at
# the dev lock's versions; `pip check` fails the build if mypy needs a package not listed here.
COPY requirements-dev.lock ./
RUN case "$COMPILED" in \
      true) apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
        && rm -rf /var/lib/apt/lists/* \
        && python -m venv /opt/mypyc \
        && grep -E '^(mypy|mypy_extensions|typing_extensions|pathspec|librt|ast_serialize|types-PyYAML)==' \
             requirements-dev.lock > /opt/mypyc/requirements.txt \
        && /opt/mypyc/bin/pip install --only-binary=:all: --no-deps \
             -r requirements.lock -r /opt/mypyc/requirements.txt \
        && /opt/mypyc/bin/pip check ;; \
      false) ;; \
      *) echo "COMPILED must be true or false, not '$COMPILED'" >&2; exit 1 ;; \
    esac
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY tools/compile.py ./tools/compile.py
# tools/compile.py writes controller/*.so and the stamp of their sources (.compiled-sources)
# beside the sources in /src; both are copied into the installed package, whose .py files are
# the same sources. The import check runs isolated (-I), so /src/controller cannot answer it.
RUN /opt/wdrf/bin/pip install --no-deps . \
 && if [ "$COMPILED" = true ]; then \
      /opt/mypyc/bin/python tools/compile.py \
      && pkg="$(/opt/wdrf/bin/python -I -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/controller" \
      && cp controller/*.so controller/.compiled-sources "$pkg"/ \
      && /opt/wdrf/bin/python -I -c 'import controller.policy as m; assert m.__file__.endswith(".so"), m.__file__' ; \
    fi \
 && /opt/wdrf/bin/pip uninstall --yes pip \
 && find /opt/wdrf -name '__pycache__' -prune -exec rm -rf '{}' +

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="wdrf-controller" \
      org.opencontainers.image.description="Weighted-DRF fairness, approval classes and aging for Kueue + HAMi" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/wdrf/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/wdrf /opt/wdrf
WORKDIR /
# Numeric, non-root (the same UID the Deployment's securityContext sets).
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["python", "-m", "controller"]
