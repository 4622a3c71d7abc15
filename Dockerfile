# fairq's container image: the server and its runtime dependencies only (no simulator, no
# benchmarks, no build tools), run as an unprivileged user, health-checked over
# grpc.health.v1 with `fairq health`.
#
#   docker build -t fairq .                     # the server (default target)
#   docker build -t fairq-sim --target sim .    # the simulated backend, for compose.yaml
#
# The configuration is /etc/fairq/fairq.toml (deploy/fairq.toml; mount your own over it).

ARG PYTHON_IMAGE=python:3.13-slim-bookworm

# --- build: a virtualenv at /opt/fairq from the committed uv.lock ---------------------------
FROM ${PYTHON_IMAGE} AS build
ARG UV_VERSION=0.13.9
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/fairq
WORKDIR /src
# Dependencies first: this layer is rebuilt only when the lockfile changes.
COPY pyproject.toml uv.lock README.md ./
COPY clients/python/pyproject.toml clients/python/README.md clients/python/
# The workspace's other members (simulator, benchmarks): their metadata only, so uv can read
# the workspace; neither is installed into the service's image.
COPY sim/pyproject.toml sim/README.md sim/
COPY bench/pyproject.toml bench/README.md bench/
RUN uv sync --frozen --no-default-groups --no-install-workspace --no-editable
COPY clients/python/fairq clients/python/fairq
COPY server server
RUN uv sync --frozen --no-default-groups --no-editable

# The simulator is a distribution of its own (fairq-sim): its image holds it and nothing else.
FROM build AS build-sim
ENV UV_PROJECT_ENVIRONMENT=/opt/fairq-sim
COPY sim sim
RUN uv sync --frozen --no-default-groups --no-editable --package fairq-sim

# --- base: what both images share -----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
RUN groupadd --system --gid 10001 fairq \
    && useradd --system --uid 10001 --gid fairq --no-create-home --shell /usr/sbin/nologin fairq
ENV PATH=/opt/fairq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
STOPSIGNAL SIGTERM
ENTRYPOINT ["fairq"]

# --- sim: the simulated vLLM (compose.yaml's backend) ------------------------------------------
FROM base AS sim
COPY --from=build-sim /opt/fairq-sim /opt/fairq
ENTRYPOINT ["fairq-sim"]
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
CMD ["--mode", "vllm", "--host", "0.0.0.0", "--port", "8000"]

# --- runtime: fairq itself (the default target) ---------------------------------------------
FROM base AS runtime
COPY --from=build /opt/fairq /opt/fairq
COPY deploy/fairq.toml /etc/fairq/fairq.toml
USER 10001:10001
# gRPC, the OpenAI-compatible HTTP door, metrics (deploy/fairq.toml).
EXPOSE 50051 8080 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["fairq", "health", "--target", "127.0.0.1:50051", "--timeout", "3"]
CMD ["serve", "--config", "/etc/fairq/fairq.toml", "--grace", "30"]
