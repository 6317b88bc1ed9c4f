# syntax=docker/dockerfile:1
# WDRF controller image.
#   docker build -t wdrf-controller:0.1.0 .
# Two stages on the same pinned base: "build" installs the pinned runtime dependencies
# (requirements.lock, wheels only) and the controller into a virtual environment; "runtime"
# copies only that environment. No compilers or build tools reach the final image.

ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/wdrf
COPY requirements.lock ./
# --only-binary: every pinned dependency must come as a wheel; nothing is compiled here.
RUN /opt/wdrf/bin/pip install --only-binary=:all: --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY controller ./controller
RUN /opt/wdrf/bin/pip install --no-deps . \
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
