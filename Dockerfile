# syntax=docker/dockerfile:1
#
# One image for the four services, with a target per service:
#
#   docker build --target rng    -t niuniu-rng .      # likewise table, wallet, ledger, gateway
#   docker build                 -t niuniu-backend .  # last stage: every service, no CMD of its own
#   docker build --target tools  -t niuniu-tools .    # and the load, bench and chaos tools
#
# deploy/k8s runs the generic image (the last stage) and names the console script in each
# Deployment's `command`, so one build serves all four services. The service stages carry
# no niuniu-load, niuniu-bench or niuniu-chaos, nor the code only they use
# (deploy/image/service_only.py); the `tools` stage has everything.
#
# The base is pinned by digest: PYTHON_DIGEST has no default, so a build without it fails
# (scripts/build-image passes the one in deploy/image/base.env; scripts/check-image refuses
# a Dockerfile or a base.env that is not pinned).
#
# Dependencies come from constraints.txt, the same pins as scripts/bootstrap. The protobuf
# code is generated here by scripts/gen-protos (gen/ is never committed) and runs from gen/,
# exactly as in a checkout.

ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
ARG PYTHON_DIGEST

# --- build: generate the protobuf code, install the whole project into /opt/venv ---------
FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
COPY pyproject.toml constraints.txt ./
COPY protos/ protos/
COPY scripts/gen-protos scripts/gen-protos
# scripts/gen-protos runs protoc from /app/.venv (grpcio-tools and the mypy plugins): a
# build-only venv that the runtime stage leaves behind.
RUN python -m venv /app/.venv \
 && /app/.venv/bin/pip install -c constraints.txt grpcio-tools mypy-protobuf \
 && PYTHON=/app/.venv/bin/python scripts/gen-protos
COPY backbone/ backbone/
COPY bull/ bull/
COPY services/ services/
COPY tools/ tools/
COPY deploy/image/service_only.py deploy/image/service_only.py
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install -c constraints.txt . \
 && echo /app/gen > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/niuniu-generated.pth"

# --- service-build: /opt/venv again, from the tree without the tools ----------------------
# (the same path as in build: a venv's scripts name their interpreter by its absolute path)
FROM build AS service-build
RUN python deploy/image/service_only.py /app /app/service-src \
 && rm -rf /opt/venv \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install -c constraints.txt /app/service-src \
 && echo /app/gen > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/niuniu-generated.pth"

# --- base: the non-root user --------------------------------------------------------------
FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST} AS base
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 niuniu \
 && useradd --system --uid 10001 --gid niuniu --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin niuniu
WORKDIR /app

# --- tools: everything, the load, bench and chaos tools included ---------------------------
# niuniu-bench, niuniu-load (load generator), niuniu-chaos (fault injection), besides the rest.
FROM base AS tools
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app/gen /app/gen
USER 10001:10001
CMD ["niuniu-load", "--help"]

# --- runtime: the services' venv (no tools) and the generated code, as a non-root user ---
FROM base AS runtime
COPY --from=service-build /opt/venv /opt/venv
COPY --from=build /app/gen /app/gen
# Numeric, so Kubernetes' runAsNonRoot can verify it without resolving names.
USER 10001:10001

FROM runtime AS rng
EXPOSE 50051 9101
CMD ["niuniu-rng"]

FROM runtime AS table
EXPOSE 50052 9102
CMD ["niuniu-table"]

FROM runtime AS wallet
EXPOSE 50053 9103
CMD ["niuniu-wallet"]

FROM runtime AS ledger
EXPOSE 50054 9104
CMD ["niuniu-ledger"]

# The browser gateway (gRPC-web and Connect over HTTP/1.1, docs/api/frontend/browser.md).
FROM runtime AS gateway
EXPOSE 8080
CMD ["niuniu-gateway"]

# The generic image (default target). Besides the services it carries the operators' tools:
# niuniu-rules (rules engine CLI), niuniu-verify (fairness verifier), niuniu-audit (ledger
# audit), niuniu-demo, niuniu-admin (tables: create, configure, close), niuniu-migrate (the
# databases' versioned migrations: deploy/k8s/base/migrate.yaml runs it once per release).
FROM runtime AS niuniu
EXPOSE 50051 50052 50053 50054 9101 9102 9103 9104 8080
CMD ["niuniu-rules", "--help"]
