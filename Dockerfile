# syntax=docker/dockerfile:1
# accyd and the accy client in one image: the CUDA runtime libraries (NVRTC included),
# accy installed with its CUDA extra in a venv, run as a non-root user.
# The GPU driver comes from the host through the NVIDIA container toolkit.
# CUDA_IMAGE may name any Debian or Ubuntu image with apt: CI builds this file on a
# plain Debian base and runs the host backend (scripts/container_test.sh).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
        python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/accy
WORKDIR /src
# The dependencies first, from pyproject.toml alone: a change to accy's own code
# reuses this layer and installs nothing from the package index.
COPY pyproject.toml ./
RUN /opt/accy/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
    b = p["build-system"]["requires"]; d = p["project"]["dependencies"]; \
    c = p["project"]["optional-dependencies"]["cuda"]; print("\n".join(b + d + c))' \
        > /tmp/requirements.txt \
    && /opt/accy/bin/pip install --no-cache-dir --requirement /tmp/requirements.txt
COPY README.md setup.py ./
COPY protos ./protos
COPY server ./server
COPY client ./client
# The native ring engine is built here (gcc, Python's headers) and must import: the image
# never falls back to the Python loop silently.
RUN /opt/accy/bin/pip install --no-cache-dir --no-deps --no-build-isolation ".[cuda]" \
    && /opt/accy/bin/python -c "import accyd.ring.engine._native" \
    && /opt/accy/bin/pip uninstall --yes setuptools wheel

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 accy \
    && useradd --system --uid 10001 --gid accy --home-dir /var/lib/accy --create-home \
        --shell /usr/sbin/nologin accy \
    && install -d -o accy -g accy -m 0750 /run/accy /var/lib/accy/cache
COPY --from=build /opt/accy /opt/accy
# The socket lives in /run/accy and compiled kernels in /var/lib/accy/cache: a
# named volume mounted on either starts with the directory's owner and mode. The
# socket is created 0660 and its folder is 0750, both of group accy (10001): a
# client container of another user reaches the socket with that group added
# (docker run --group-add 10001, compose group_add, Kubernetes supplementalGroups).
ENV PATH=/opt/accy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    ACCY_TARGET=unix:/run/accy/accyd.sock \
    XDG_CACHE_HOME=/var/lib/accy/cache
USER 10001:10001
WORKDIR /var/lib/accy
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["accy", "health", "--timeout", "3"]
CMD ["accyd", "serve", "--listen", "unix:/run/accy/accyd.sock", "--backend", "auto"]
