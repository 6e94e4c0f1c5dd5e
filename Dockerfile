# syntax=docker/dockerfile:1
#
# The workspace-gc image: one binary on a distroless-like Debian 12 base, running as non-root.
#
#   docker build -t REGISTRY/workspace-gc:TAG .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/workspace-gc:TAG --push .
#   scripts/image                        # the same runtime stage, from what this host has
#
# The base is assembled from Debian 12's packages by hack/image/rootfs (libc6, libgcc-s1,
# base-files, netbase, tzdata, the CA bundle, `nonroot` 65532), as distroless's cc image is: the
# binary links glibc dynamically, built on the same Debian release. Why not a static binary on
# scratch (docs/deploy.md, The image): it would be 8 MB smaller, and starts no faster; but the
# binary the tests run on a real kubelet is then the one cargo builds anyway, and glibc's
# resolver keeps its NSS modules. TLS is rustls (with ring), so there is no OpenSSL.
#
# Two ways in, one runtime stage. A release build (the default, INPUTS=release) compiles in
# `build` and assembles the base in `base`, for each platform buildx builds. scripts/image
# (INPUTS=prebuilt) puts a binary and a base it built on the host in the context, because the
# registries the first way pulls from are out of reach there; tests/node/installed.rs runs that image and
# checks that this file's runtime stage is what it ran.

ARG RUST_VERSION=1.95
ARG INPUTS=release

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# BuildKit cache mounts keep the crate registry and the target directory between builds; the
# binary is copied out of the cached target directory into the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin workspace-gc \
    && mkdir -p /inputs && cp target/release/workspace-gc /inputs/workspace-gc

FROM docker.io/library/debian:bookworm-slim AS base
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates
COPY hack/image/rootfs /usr/local/bin/assemble-rootfs
RUN assemble-rootfs /inputs/rootfs

FROM build AS release
COPY --from=base /inputs/rootfs /inputs/rootfs

# The context scripts/image writes: workspace-gc and rootfs/.
FROM scratch AS prebuilt
COPY rootfs /inputs/rootfs
COPY workspace-gc /inputs/workspace-gc

FROM ${INPUTS} AS inputs

FROM scratch AS runtime
COPY --from=inputs /inputs/rootfs/ /
COPY --from=inputs /inputs/workspace-gc /usr/local/bin/workspace-gc
LABEL org.opencontainers.image.title="workspace-gc" \
      org.opencontainers.image.description="Garbage-collects the build-workspace PersistentVolumeClaims of the jupyter-notebook-validator-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base's "nonroot" user, numeric so the kubelet can check the Deployment's runAsNonRoot.
# The Deployment pins no ID: OpenShift runs the image as an arbitrary UID from the namespace's
# range instead, which works since the binary reads its files and writes none.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/workspace-gc"]
CMD ["run"]
