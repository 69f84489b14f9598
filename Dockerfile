# One image for both processes: run `tandem-broker ...` or `tandem-extender ...`.
# Build: docker build -t tandem:latest .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY placement placement
COPY jsonlogs jsonlogs
COPY fleetplan fleetplan
COPY fleetsim fleetsim
COPY extender extender
COPY broker broker
COPY sim sim
COPY protos protos
# Wheels for the project and every dependency, so the final stage needs no compiler.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[server]'

FROM python:3.11-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin tandem
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-compile /wheels/*.whl && rm -rf /wheels
USER 10001:10001
# extender HTTP (8888), webhook TLS (8443), broker tenant API (50051), agent API (50052), metrics (9090)
EXPOSE 8888 8443 50051 50052 9090
ENTRYPOINT []
CMD ["tandem-broker", "--help"]
