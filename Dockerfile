# syntax=docker/dockerfile:1.7
# One image for the whole stack: `topk-operator` and the data plane `topk` (worker, reducer,
# recount; the entrypoint). The operator hands its own image to the pods it creates, so both
# always run the same build. Build with scripts/image.sh (reproducible tag), or:
#   docker build -t ghcr.io/topk-io/topk:dev .
# The test environment's node makes the same image without Docker (`scripts/testenv.sh node
# image`): it reads this file's last stage for the paths, user, entrypoint, environment and
# ports, and the e2e suite checks that the two agree.
# The toolchain CI builds and tests with.
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
# RocksDB's bindgen needs libclang; its C++ and librdkafka's C are built from source, the
# latter against the system OpenSSL (TLS and SASL), which the distroless runtime also ships.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev clang cmake libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG SOURCE_DATE_EPOCH
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p topk -p topk-operator \
 && mkdir -p /out/lib \
 && cp target/release/topk target/release/topk-operator /out/ \
 && cp -L "$(ldconfig -p | awk '$1 == "libz.so.1" {print $NF; exit}')" /out/lib/

# glibc and libstdc++ only; no shell, no package manager; runs as uid 65532. librdkafka
# links zlib, which the distroless image lacks: it comes from the build stage.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/topk /out/topk-operator /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/topk/
ENV LD_LIBRARY_PATH=/usr/local/lib/topk
# The data plane's HTTP port (query API, /metrics, probes) and the operator's metrics port.
EXPOSE 8080 9090
USER 65532:65532
ENTRYPOINT ["topk"]
