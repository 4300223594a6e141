# capi-gpu: `make check` is what CI runs. Tools come from .venv (created on first use) and from the
# pinned upstream builds under ~/.cache/capi-gpu (hack/build-upstream.sh, versions in hack/versions.env).
#
#   make check               lint + CRDs up to date + every test tier
#   make release-manifests   out/infrastructure-hetzner-gpu/v0.1.0/: a clusterctl local repository
#   make dev / dev-down      a local management cluster with simulated GEX131 hosts

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

include hack/versions.env

PYTHON_BOOTSTRAP ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST ?= .venv/bin/python -m pytest
CACHE ?= $(or $(CAPI_GPU_CACHE),$(HOME)/.cache/capi-gpu)
KUSTOMIZE ?= $(CACHE)/bin/kustomize-$(KUSTOMIZE_VERSION)/kustomize
# config/crd lists the generated CRDs in ../../crds, outside its root: kustomize's default load
# restrictor refuses that (see config/crd/kustomization.yaml).
KUSTOMIZE_BUILD = $(KUSTOMIZE) build --load-restrictor LoadRestrictionsNone
OUT ?= out
IMG ?= ghcr.io/capi-gpu/capi-gpu:dev
# The image name config/manager/kustomization.yaml sets; IMG replaces it in release builds.
IMG_BASE := ghcr.io/capi-gpu/capi-gpu

.PHONY: help
help: ## this list
	@grep -hE '^[a-z-]+:.*## ' Makefile | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

# --- environment ---------------------------------------------------------------------------------

# Created when missing; `make venv` reinstalls into an existing one.
$(PY):
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'

.PHONY: venv
venv: ## create .venv (if missing) and install .[dev] into it
	[ -x $(PY) ] || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e '.[dev]'

.PHONY: system-deps
system-deps: ## Debian packages the simulated fleet needs (debootstrap, iproute2, ...; needs root)
	bash hack/install-system-deps.sh

.PHONY: upstream
upstream: ## build the pinned kube-apiserver, scheduler, kcm, kubectl, kine, CAPI, kustomize, nvidia-mig-parted, ...
	bash hack/build-upstream.sh all

$(KUSTOMIZE):
	bash hack/build-upstream.sh kustomize

# --- checks --------------------------------------------------------------------------------------

.PHONY: check
check: lint crds-check test ## everything CI runs

.PHONY: lint
lint: $(PY) ## ruff, ruff format, mypy --strict, import-linter, ansible-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict capi_gpu capi_gpu_sim
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ansible-lint --profile production playbooks/

.PHONY: test
# Two workers, one test file each at a time (pytest-xdist --dist loadfile): e2e worlds and fleets
# take their own slot, ports and temp dirs, so files run side by side. Files go out heaviest first
# (conftest.py, hack/test-durations.json; --no-loadscope-reorder keeps that order instead of xdist's
# most-tests-first). PYTEST_WORKERS=0 runs them one after another.
PYTEST_WORKERS ?= 2
test: $(PY) system-deps upstream ## every test tier (unit, integration, e2e)
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests e2e

.PHONY: test-durations
test-durations: $(PY) ## rewrite hack/test-durations.json from a JUnit report: make test-durations JUNIT=/tmp/run.xml
	$(PY) hack/test-durations.py $(JUNIT)

# The five benchmarks, in under 10 minutes on the 2-core dev machine; each prints one JSON line and a
# table (the README's performance section quotes them). scaleup and gate_latency need root (the fleet)
# and the pinned binaries. BENCH_ARGS_<name> adds flags: make bench BENCH_ARGS_scaleup='--hosts 1,20,100'.
define run-bench
	@echo "== bench/$(1).py $(BENCH_ARGS_$(1))"; start=$$(date +%s); PYTHONPATH=$(CURDIR) $(PY) bench/$(1).py $(BENCH_ARGS_$(1)); \
	  echo "== bench/$(1).py: $$(( $$(date +%s) - start )) s"
endef

.PHONY: bench
bench: $(PY) system-deps upstream ## run the five benchmarks (bench/*.py), under 10 minutes
	$(call run-bench,packing)
	$(call run-bench,robot_budget)
	$(call run-bench,gate_latency)
	$(call run-bench,scale)
	$(call run-bench,scaleup)

.PHONY: crds
crds: $(PY) ## regenerate crds/ from the pydantic models
	$(VENV)/bin/capi-gpu crds

.PHONY: crds-check
crds-check: $(PY) ## fail when crds/ differs from the models
	$(VENV)/bin/capi-gpu crds --check

# The image's dependency lock (hashes for every platform); regenerate after changing pyproject.toml's
# dependencies. uv is a tool, not a project dependency (pip install uv).
.PHONY: lock
lock: ## regenerate requirements.lock from pyproject.toml (needs uv)
	uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes -o requirements.lock

# --- release -------------------------------------------------------------------------------------

# clusterctl's release assets, laid out as a clusterctl local repository
# (<OUT>/infrastructure-hetzner-gpu/<version>/, docs/clusterctl.md): point a provider's url at its
# infrastructure-components.yaml. The image is set through a throw-away overlay (kustomize edit on a
# copy, never on config/), so `make release-manifests IMG=ghcr.io/capi-gpu/capi-gpu:v0.1.0` leaves the
# tree clean. The overlay repeats config/manager's replacement after its own images, so the gate plugin's
# image (--gate-plugin-image, through $CAPI_GPU_IMAGE) is IMG as well (config/manager/image_replacement.yaml).
RELEASE_VERSION ?= v0.1.0
RELEASE_DIR = $(OUT)/infrastructure-hetzner-gpu/$(RELEASE_VERSION)
.PHONY: release-manifests
release-manifests: $(KUSTOMIZE) ## out/infrastructure-hetzner-gpu/v0.1.0/: components, metadata, templates
	rm -rf $(OUT)/.overlay $(RELEASE_DIR) && mkdir -p $(OUT)/.overlay $(RELEASE_DIR)
	printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n' \
	  "$$(realpath -m --relative-to=$(OUT)/.overlay config/default)" > $(OUT)/.overlay/kustomization.yaml
	cd $(OUT)/.overlay && $(abspath $(KUSTOMIZE)) edit set image $(IMG_BASE)=$(IMG)
	printf 'replacements:\n  - path: %s\n' \
	  "$$(realpath -m --relative-to=$(OUT)/.overlay config/manager/image_replacement.yaml)" >> $(OUT)/.overlay/kustomization.yaml
	$(KUSTOMIZE_BUILD) $(OUT)/.overlay > $(RELEASE_DIR)/infrastructure-components.yaml
	rm -rf $(OUT)/.overlay
	cp config/clusterctl/metadata.yaml config/clusterctl/cluster-template*.yaml $(RELEASE_DIR)/
	@ls -1 $(RELEASE_DIR)

# Needs a docker engine with BuildKit (the Dockerfile bind-mounts the builder's wheels); the dev
# machines have none, so tests/unit/config/test_dockerfile.py checks the Dockerfile's structure instead.
.PHONY: docker-build
docker-build: ## build the operator image as IMG
	docker build -t $(IMG) .

# --- local development ---------------------------------------------------------------------------

.PHONY: dev
dev: $(PY) system-deps upstream ## start the local management cluster + simulated fleet (capi-gpu dev up)
	$(VENV)/bin/capi-gpu dev up

.PHONY: dev-down
dev-down: $(PY) ## stop it (capi-gpu dev down)
	$(VENV)/bin/capi-gpu dev down
