# syntax=docker/dockerfile:1
#
# The workspace-gc image: one static binary on distroless/static, running as non-root.
#
#   docker build -t REGISTRY/workspace-gc:TAG .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/workspace-gc:TAG --push .
#
# Why static, and why Alpine to build it: Rust on the musl targets links statically, and
# rust:alpine *is* a musl host, so a plain `cargo build` gives a binary that needs no libc on
# every platform buildx builds for, with no cross target to name per architecture. TLS is
# rustls (with ring), so there is no OpenSSL to link. The runtime image then needs nothing but
# CA certificates and a non-root user, which distroless/static has (about 2 MB, no shell).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-alpine AS build
# ring compiles C and assembly: a C compiler and the musl headers.
RUN apk add --no-cache gcc musl-dev
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# BuildKit cache mounts keep the crate registry and the target directory between builds; the
# binary is copied out of the cached target directory into the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin workspace-gc \
    && cp target/release/workspace-gc /workspace-gc

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="workspace-gc" \
      org.opencontainers.image.description="Garbage-collects the build-workspace PersistentVolumeClaims of the jupyter-notebook-validator-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /workspace-gc /usr/local/bin/workspace-gc
# distroless's "nonroot" user, numeric so the kubelet can check the Deployment's runAsNonRoot.
# The Deployment pins no ID: OpenShift runs the image as an arbitrary UID from the namespace's
# range instead, which works since the binary reads its files and writes none.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/workspace-gc"]
CMD ["run"]
