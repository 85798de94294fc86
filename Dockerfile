# syntax=docker/dockerfile:1
# The gateway image: the easkit wheel with its gateway, grpc and redis extras, installed
# from the pinned versions the tests run with, served by a non-root user.
#   docker build -t easkit:0.1.0 .
#   docker run -p 8080:8080 -v $PWD/samples:/etc/easkit:ro easkit:0.1.0
# The same image runs remote workers: `eas-gateway worker --gateway URL --service NAME ...`.

FROM python:3.11.7-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt requirements/constraints.txt
COPY eas_sdk eas_sdk
COPY gateway gateway
# Wheels for the project and every dependency, at the pinned versions, built once here so
# the final stage needs no compiler and no network.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c requirements/constraints.txt ".[gateway,redis]"

FROM python:3.11.7-slim-bookworm
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EASGW_DATA_DIR=/var/lib/easkit
RUN useradd --system --uid 10001 --create-home --home-dir /home/easkit easkit \
 && install -d -o easkit -g easkit -m 0700 /var/lib/easkit
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links /tmp/wheels "easkit[gateway,redis]" \
 && rm -rf /tmp/wheels
USER 10001:10001
WORKDIR /home/easkit
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["eas-gateway"]
CMD ["serve", "--config", "/etc/easkit/services.yaml", "--host", "0.0.0.0", "--port", "8080"]
