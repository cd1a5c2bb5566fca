# syntax=docker/dockerfile:1
# Statehouse image: one uvicorn process (one writer per replica), RocksDB files in /data.
#   docker build -t statehouse:0.1.0 .
#   docker run -p 8000:8000 -v statehouse-data:/data statehouse:0.1.0
# Settings are STATEHOUSE_* environment variables (docs/operations.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: resolve the pinned runtime dependencies into a venv, then install the project ----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies first (pinned in the two pyproject.toml files: the server's and the client's it
# depends on), so code changes do not re-download them.
COPY pyproject.toml ./
COPY client/packaging/pyproject.toml client/packaging/
RUN python -c "import tomllib; print('\n'.join(d for f in ('pyproject.toml', 'client/packaging/pyproject.toml') for d in tomllib.load(open(f, 'rb'))['project']['dependencies'] if not d.startswith('statehouse')))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt
# Then the project itself, both distributions (statehouse-client, statehouse-server; the package
# index's `statehouse` is another project): runtime dependencies only, not the dev extra.
COPY . .
RUN pip install --no-cache-dir --no-deps ./client/packaging . \
    && pip check

# ---- runtime: the venv and nothing else ----
FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
ARG GID=10001
LABEL org.opencontainers.image.title="statehouse" \
      org.opencontainers.image.description="Apache Flink's state-backend model as a REST service for PySpark jobs" \
      org.opencontainers.image.version="0.1.0"
RUN groupadd --system --gid "${GID}" statehouse \
    && useradd --system --uid "${UID}" --gid "${GID}" --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin statehouse \
    && mkdir -p /data /checkpoints \
    && chown "${UID}:${GID}" /data /checkpoints
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STATEHOUSE_BACKEND=rocksdb \
    STATEHOUSE_DATA_DIR=/data \
    STATEHOUSE_CHECKPOINT_DIR=/checkpoints \
    STATEHOUSE_REPLICA_INDEX=0 \
    STATEHOUSE_REPLICA_COUNT=1
WORKDIR /
VOLUME ["/data", "/checkpoints"]
EXPOSE 8000
USER 10001:10001
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
# uvicorn (with the HTTP limits of app/serve.py) runs as PID 1: SIGTERM → stop accepting, drain for
# up to 20 s, close RocksDB, exit 0. Keep --timeout-graceful-shutdown below the orchestrator's grace
# period (Helm chart: 30 s). One process on purpose: one writer per replica; scale out with replicas.
CMD ["python", "-m", "statehouse.app.serve", "--host", "0.0.0.0", "--port", "8000", \
     "--timeout-graceful-shutdown", "20", "--no-server-header"]
