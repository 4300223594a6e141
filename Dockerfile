# syntax=docker/dockerfile:1
# capi-gpu operator image: `capi-gpu run` (and `capi-gpu gate-plugin serve` for the DaemonSet).
#
# Four stages: the builder turns the project and its pinned dependencies into wheels; the helm stage
# fetches the pinned helm release and checks its checksum; the mig-parted stage builds nvidia-mig-parted from
# its pinned source (the node install copies it to each host); the runtime installs only those wheels into a
# venv (no compiler, no pip cache, no source tree) and adds what the playbook runs shell out to: ssh and
# ssh-agent from openssh-client for ansible-runner, helm for the add-ons playbook's kubernetes.core.helm.
# ansible-core comes in as a project dependency, at the range pyproject.toml pins.
#
# Reproducible: the base is pinned by digest (the multi-arch index of python:3.11-slim-bookworm, Python
# 3.11.16, as docker-library/repo-info lists it in repos/python/remote/3.11-slim-bookworm.md at commit
# 33a22f41ac7b; re-check with `docker buildx imagetools inspect python:3.11-slim-bookworm`), and every
# dependency comes from requirements.lock with its hashes (generated from pyproject.toml by uv; see
# `make lock`; a test fails when the two disagree). The wheel leaves out capi_gpu_sim (tests and
# `dev up` run from a source checkout).
#
# playbooks/ is copied to where capi_gpu.provisioning.ansible.default_playbook_dir() resolves for the
# installed package: three levels above the module, i.e. the venv's site-packages (a test derives the
# path from that function, so a change there fails the test rather than the image).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY capi_gpu/ capi_gpu/
# Dependencies only as locked and hash-checked; the project itself with the base image's setuptools.
RUN pip wheel --wheel-dir /wheels --require-hashes --no-deps -r requirements.lock \
    && pip wheel --wheel-dir /wheels --no-deps --no-build-isolation . \
    && cp requirements.lock /wheels/

# helm v3 for the add-ons playbook (kubernetes.core.helm drives it; `capi-gpu run --helm` defaults to the
# one on PATH): the release archive of the version hack/versions.env pins (HELM_VERSION; the tests build the
# same version from its Go module), refused unless its sha256 is the one get.helm.sh publishes for the
# build's architecture. The checksums are written here, not fetched next to the archive: a checksum from
# the same host would prove only transit integrity.
FROM ${PYTHON_IMAGE} AS helm
ARG TARGETARCH=amd64
ARG HELM_VERSION=v3.22.0
ARG HELM_SHA256_AMD64=1e4ab49e429626cf6c6958d914248b78c9730803c2751b87627e171dc800e7bb
ARG HELM_SHA256_ARM64=f14e804dfee240f55525b667488fe9adca349e63e00c9af634c0beb1421ac310
RUN case "${TARGETARCH}" in \
        amd64) sha="${HELM_SHA256_AMD64}" ;; \
        arm64) sha="${HELM_SHA256_ARM64}" ;; \
        *) echo "no pinned helm checksum for ${TARGETARCH}" >&2; exit 1 ;; \
    esac \
    && python -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
        "https://get.helm.sh/helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz" /tmp/helm.tar.gz \
    && echo "${sha}  /tmp/helm.tar.gz" | sha256sum -c - \
    && tar -xzf /tmp/helm.tar.gz -C /tmp "linux-${TARGETARCH}/helm" \
    && install -m 0755 "/tmp/linux-${TARGETARCH}/helm" /usr/local/bin/helm \
    && helm version --short | grep -q "^${HELM_VERSION}+"

# nvidia-mig-parted for the node install: roles/mig_layout copies this file from the operator to every host and
# checks its sha256 there (capi_gpu/provisioning/shipped_mig_parted.py), so the default install downloads
# nothing from a release page. Built from NVIDIA/mig-parted at the commit of the pinned tag (git checks the
# commit id, a content hash; .git then goes, so Go stamps no VCS data the source tarball build lacks), with its vendored dependencies and the flags of `hack/build-upstream.sh mp`, by
# the Go release and gcc (bookworm's 12.2) the tests' build uses; the result must have the sha256 hack/versions.env
# records (MIG_PARTED_SHA256), which proves the image ships the bytes the tests ran. The golang base is pinned by
# tag only (its digest could not be looked up here); the output's checksum is what pins the stage. An empty
# MIG_PARTED_SHA256 build-arg skips that check for another toolchain; the operator then ships what was built,
# with the checksum recorded beside it.
FROM golang:1.26.8-bookworm AS mig-parted
ARG MIG_PARTED_VERSION=0.15.0
ARG MIG_PARTED_COMMIT=e2d5ad1fc72b9d298ea6d04b885cf2d7dbe56941
ARG MIG_PARTED_SHA256=4941adf8908720d819ce27a76eaef7e76e4aea57e7f14c652f3423cac879311f
WORKDIR /src
RUN git init -q . \
    && git fetch -q --depth 1 https://github.com/NVIDIA/mig-parted.git "${MIG_PARTED_COMMIT}" \
    && git checkout -q FETCH_HEAD \
    && test "$(git rev-parse HEAD)" = "${MIG_PARTED_COMMIT}" \
    && rm -rf .git \
    && CGO_ENABLED=1 GOFLAGS=-mod=vendor GOTOOLCHAIN=local go build -trimpath \
        -ldflags "-s -w -X github.com/NVIDIA/mig-parted/internal/info.version=v${MIG_PARTED_VERSION} -X github.com/NVIDIA/mig-parted/internal/info.gitCommit=${MIG_PARTED_COMMIT}" \
        -o /out/nvidia-mig-parted ./cmd/nvidia-mig-parted \
    && sha256sum /out/nvidia-mig-parted | cut -d' ' -f1 > /out/nvidia-mig-parted.sha256 \
    && { [ -z "${MIG_PARTED_SHA256}" ] || echo "${MIG_PARTED_SHA256}  /out/nvidia-mig-parted" | sha256sum -c -; } \
    && /out/nvidia-mig-parted --version | grep -q "version v${MIG_PARTED_VERSION}$"

FROM ${PYTHON_IMAGE} AS runtime
# openssh-client: ssh for every Ansible task, ssh-agent/ssh-add for ansible-runner's in-memory key.
# Versions follow the bookworm point release of the base image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/capi-gpu \
    PATH=/opt/capi-gpu/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python -m venv /opt/capi-gpu
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    /opt/capi-gpu/bin/pip install --no-index --find-links=/wheels --no-deps -r /wheels/requirements.lock \
    && /opt/capi-gpu/bin/pip install --no-index --find-links=/wheels --no-deps capi-gpu \
    && /opt/capi-gpu/bin/pip check
COPY --from=helm /usr/local/bin/helm /usr/local/bin/helm
# Where `capi-gpu run --mig-parted` looks by default (shipped_mig_parted.DEFAULT_PATH), with its build's checksum.
COPY --from=mig-parted /out/ /opt/capi-gpu/libexec/
COPY playbooks/ /opt/capi-gpu/lib/python3.11/site-packages/playbooks/
# The add-ons playbook (playbooks/addons.yml) reads the chart values and DRA manifests from ../config.
COPY config/dra/ /opt/capi-gpu/lib/python3.11/site-packages/config/dra/
COPY config/dra-driver/ /opt/capi-gpu/lib/python3.11/site-packages/config/dra-driver/
# A named non-root user (uid 65532, as distroless "nonroot"): ssh refuses to run for a uid without a
# passwd entry. The Deployment overrides HOME with a writable emptyDir (read-only root filesystem).
RUN groupadd --gid 65532 capi-gpu \
    && useradd --uid 65532 --gid 65532 --home-dir /home/capi-gpu --create-home --shell /usr/sbin/nologin capi-gpu
ENV HOME=/home/capi-gpu
WORKDIR /home/capi-gpu
USER 65532:65532
ENTRYPOINT ["capi-gpu"]
CMD ["run"]
