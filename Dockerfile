# syntax=docker/dockerfile:1
# accyd and the accy client in one image: the CUDA runtime libraries (NVRTC included),
# accy installed with its CUDA extra in a venv, run as a non-root user.
# The GPU driver comes from the host through the NVIDIA container toolkit.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/accy
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY server ./server
COPY client ./client
RUN /opt/accy/bin/pip install --no-cache-dir ".[cuda]"

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
# named volume mounted on either starts with the directory's owner, so the
# non-root daemon can write there and a client container of the same user can
# reach the socket.
ENV PATH=/opt/accy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    ACCY_TARGET=unix:/run/accy/accyd.sock \
    XDG_CACHE_HOME=/var/lib/accy/cache
USER 10001:10001
WORKDIR /var/lib/accy
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["accy", "health", "--timeout", "3"]
CMD ["accyd", "serve", "--listen", "unix:/run/accy/accyd.sock", "--backend", "auto"]
