# syntax=docker/dockerfile:1
# The self-hosted stream runner (`ddb-projector run`), or any other
# command of the CLI, in a small image that runs as a non-root user.
#
#   docker build -t ddb-projector .
#   docker run --rm -p 9464:9464 -e AWS_REGION=... ddb-projector run --table Orders
#
# The image serves the runner's metrics and health on port 9464
# (http://HOST:9464/metrics, /healthz) and logs JSON lines; see the
# README's "Run the runner in a container".

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The registry and the target directory are cached between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ddb-projector \
    && cp target/release/ddb-projector /usr/local/bin/ddb-projector

# glibc, CA certificates and a `nonroot` user (65532), nothing else: no
# shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/ddb-projector /usr/local/bin/ddb-projector
COPY --from=build /src/projections /usr/share/ddb-projector/projections
USER nonroot
ENV PROJECTOR_METRICS_ADDR=0.0.0.0:9464 \
    PROJECTOR_LOG_FORMAT=json
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/ddb-projector"]
CMD ["--help"]
