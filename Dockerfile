# The gateway image: `docker build -t easkit-gateway .` (see docs/deploy.md).
# Stage 1 builds a virtual environment from the pinned versions; stage 2 copies it into a
# clean image that runs as an unprivileged user. The base image is pinned to an exact
# release (pin its digest too, `python:3.11.7-slim-bookworm@sha256:...`, in your registry).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt requirements/constraints.txt
COPY eas_sdk eas_sdk
COPY gateway gateway
RUN python -m venv /opt/easkit \
    && /opt/easkit/bin/pip install --no-cache-dir -c requirements/constraints.txt ".[gateway,redis,cluster-serving,s3,images]"

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/easkit --create-home easkit
COPY --from=build /opt/easkit /opt/easkit
ENV PATH=/opt/easkit/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EASGW_DATA_DIR=/var/lib/easkit
USER 10001:10001
WORKDIR /var/lib/easkit
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["eas-gateway"]
CMD ["serve", "--config", "/etc/easkit/services.yaml", "--host", "0.0.0.0", "--port", "8080"]
