# syntax=docker/dockerfile:1.7
# One multi-stage build for the three kjob services (nothing from tools/ ships). Either pick the binary with a build arg
#   docker build --build-arg BIN=kjob-queue -t kjob/queue:dev .
# or with its target
#   docker build --target kjob-queue -t kjob/queue:dev .
# The builder stage does not depend on BIN, so building the three images compiles once.

ARG RUST_VERSION=1.95
ARG BIN=kjob-worker

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# protos are compiled by build.rs with protox: no protoc needed. TLS is rustls: no OpenSSL.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p kjob-queue -p kjob-watcher -p kjob-worker --bins \
    && mkdir -p /out \
    && cp target/release/kjob-queue target/release/kjob-watcher target/release/kjob-worker /out/

# distroless/cc: glibc + libgcc only, no shell; the :nonroot tag runs as UID/GID 65532.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
USER 65532:65532

FROM runtime AS kjob-queue
COPY --from=builder /out/kjob-queue /usr/local/bin/kjob-queue
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/kjob-queue"]

FROM runtime AS kjob-watcher
COPY --from=builder /out/kjob-watcher /usr/local/bin/kjob-watcher
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/kjob-watcher"]

FROM runtime AS kjob-worker
COPY --from=builder /out/kjob-worker /usr/local/bin/kjob-worker
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/kjob-worker"]

# The default target: the binary named by BIN.
FROM ${BIN} AS default
