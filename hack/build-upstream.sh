#!/usr/bin/env bash
# Builds the pinned upstream binaries the tests and `capi-gpu dev up` run against, into a cache
# outside the repository keyed by version. Idempotent: a component whose stamp file exists is reused.
#
#   hack/build-upstream.sh [all|k8s|kine|capi|kustomize|clusterctl|helm|ca|cm|mp]...
#
# Layout:  $CAPI_GPU_CACHE/bin/k8s-<ver>/{kube-apiserver,kube-scheduler,kube-controller-manager,kubectl}
#          $CAPI_GPU_CACHE/bin/kine-<ver>/kine
#          $CAPI_GPU_CACHE/bin/capi-<ver>/{cluster-api-manager,crds/*.yaml}
#          $CAPI_GPU_CACHE/bin/kustomize-<ver>/kustomize
#          $CAPI_GPU_CACHE/bin/clusterctl-<capi ver>/clusterctl
#          $CAPI_GPU_CACHE/bin/helm-<ver>/helm
#          $CAPI_GPU_CACHE/bin/cluster-autoscaler-<ver>/cluster-autoscaler  (clusterapi provider only)
#          $CAPI_GPU_CACHE/bin/cert-manager-<ver>/{controller,cainjector,webhook,cert-manager.yaml}
#          $CAPI_GPU_CACHE/bin/mig-parted-<ver>/{nvidia-mig-parted,nvidia-mig-parted.sha256}
# KUBEBUILDER_ASSETS, when set, supplies kube-apiserver (and kubectl) instead of building them.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${CAPI_GPU_CACHE:-$HOME/.cache/capi-gpu}
BIN=$CACHE/bin
WORK=$CACHE/build
mkdir -p "$BIN" "$WORK"

step=""
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "build-upstream: FAILED at step: ${step} (exit $rc). Log above; rerun hack/build-upstream.sh after fixing." >&2; fi' EXIT

log() { printf '[build-upstream %(%H:%M:%S)T] %s\n' -1 "$*"; }

need_go() {
  step="check Go toolchain"
  command -v go >/dev/null 2>&1 || { echo "build-upstream: Go is not installed; install Go >= 1.26 (https://go.dev/dl) and rerun." >&2; exit 2; }
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
}

wrapper() { # wrapper <dir>: fresh module dir
  rm -rf "$1"; mkdir -p "$1"; cd "$1"; go mod init "local/$(basename "$1")" >/dev/null 2>&1
}

build_k8s() {
  local out=$BIN/k8s-$KUBERNETES_VERSION
  if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]; then
    log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS supplies kube-apiserver; still need scheduler/controller-manager"
  fi
  if [ -f "$out/.done" ]; then log "k8s $KUBERNETES_VERSION: cached in $out"; return; fi
  need_go
  step="k8s: prepare wrapper module"; log "$step"
  wrapper "$WORK/k8s-$KUBERNETES_VERSION"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  step="k8s: replace staging modules with $KUBERNETES_STAGING_VERSION"; log "$step"
  for m in $(go mod edit -json "$gomod" | python3 -c 'import json,sys;[print(r["Path"]) for r in json.load(sys.stdin)["Require"] if r["Version"]=="v0.0.0"]'); do
    go mod edit -replace="$m=$m@$KUBERNETES_STAGING_VERSION"
  done
  step="k8s: go get k8s.io/kubernetes@$KUBERNETES_VERSION"; log "$step"
  go get "k8s.io/kubernetes@$KUBERNETES_VERSION"
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local ldf="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  mkdir -p "$out.tmp"
  for c in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
    step="k8s: go build $c"; log "$step"
    go build -trimpath -ldflags "$ldf" -o "$out.tmp/$c" "k8s.io/kubernetes/cmd/$c"
  done
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "k8s $KUBERNETES_VERSION: built into $out"
}

build_kine() {
  local out=$BIN/kine-$KINE_VERSION
  if [ -f "$out/.done" ]; then log "kine $KINE_VERSION: cached in $out"; return; fi
  need_go
  step="kine: wrapper module + go get"; log "$step"
  wrapper "$WORK/kine-$KINE_VERSION"
  go get "github.com/k3s-io/kine@$KINE_VERSION"
  step="kine: go build"; log "$step"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/kine" github.com/k3s-io/kine
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "kine $KINE_VERSION: built into $out"
}

capi_assets() { # CRDs and webhook configurations, taken from the same module as the manager
  local out=$1 dir
  dir=$(go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$out/crds" "$out/webhook"
  cp "$dir"/core/config/crd/bases/*.yaml "$dir"/bootstrap/kubeadm/config/crd/bases/*.yaml \
     "$dir"/controlplane/kubeadm/config/crd/bases/*.yaml "$out/crds/"
  cp "$dir"/core/config/webhook/manifests.yaml "$out/webhook/core.yaml"
  chmod -R u+w "$out"
}

build_capi() {
  local out=$BIN/capi-$CAPI_VERSION
  if [ -f "$out/.done" ]; then
    if [ ! -f "$out/webhook/core.yaml" ]; then need_go; step="capi: copy assets"; capi_assets "$out"; fi
    log "capi $CAPI_VERSION: cached in $out"; return
  fi
  need_go
  step="capi: wrapper module (api submodule pinned to $CAPI_VERSION)"; log "$step"
  wrapper "$WORK/capi-$CAPI_VERSION"
  # The root module replaces sigs.k8s.io/cluster-api/api with ./api; a wrapper must pin it instead.
  go mod edit -replace="sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$CAPI_VERSION"
  step="capi: go get sigs.k8s.io/cluster-api@$CAPI_VERSION"; log "$step"
  go get "sigs.k8s.io/cluster-api@$CAPI_VERSION"
  mkdir -p "$out.tmp"
  step="capi: go build core manager"; log "$step"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION" -o "$out.tmp/cluster-api-manager" sigs.k8s.io/cluster-api/core
  step="capi: copy CRDs and webhook configurations from the module"; log "$step"
  capi_assets "$out.tmp"
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "capi $CAPI_VERSION: built into $out"
}

build_kustomize() {
  local out=$BIN/kustomize-$KUSTOMIZE_VERSION
  if [ -f "$out/.done" ]; then log "kustomize $KUSTOMIZE_VERSION: cached in $out"; return; fi
  need_go
  step="kustomize: go install"; log "$step"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "kustomize $KUSTOMIZE_VERSION: built into $out"
}

build_clusterctl() { # the same CAPI module as the manager; tests run `generate cluster` with it, offline
  local out=$BIN/clusterctl-$CAPI_VERSION
  if [ -f "$out/.done" ]; then log "clusterctl $CAPI_VERSION: cached in $out"; return; fi
  need_go
  step="clusterctl: wrapper module (api submodule pinned to $CAPI_VERSION)"; log "$step"
  wrapper "$WORK/clusterctl-$CAPI_VERSION"
  go mod edit -replace="sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$CAPI_VERSION"
  step="clusterctl: go get sigs.k8s.io/cluster-api@$CAPI_VERSION"; log "$step"
  go get "sigs.k8s.io/cluster-api@$CAPI_VERSION"
  step="clusterctl: go build"; log "$step"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION" -o "$out.tmp/clusterctl" sigs.k8s.io/cluster-api/cmd/clusterctl
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "clusterctl $CAPI_VERSION: built into $out"
}

build_helm() { # helm v3 from its Go module; the add-ons playbook (kubernetes.core.helm) drives it
  local out=$BIN/helm-$HELM_VERSION
  if [ -f "$out/.done" ]; then log "helm $HELM_VERSION: cached in $out"; return; fi
  need_go
  step="helm: wrapper module + go get helm.sh/helm/v3@$HELM_VERSION"; log "$step"
  wrapper "$WORK/helm-$HELM_VERSION"
  go get "helm.sh/helm/v3@$HELM_VERSION"
  step="helm: go build"; log "$step"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$out.tmp/helm" helm.sh/helm/v3/cmd/helm
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "helm $HELM_VERSION: built into $out"
}

build_ca() { # cluster-autoscaler: the Go proxy refuses its module, so build from the tag's source tree
  local out=$BIN/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION
  if [ -f "$out/.done" ]; then log "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION: cached in $out"; return; fi
  need_go
  local tag=cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION src=$WORK/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION
  local tarball=${CA_SRC_TARBALL:-$here/../../shared/upstream/$tag-src.tar.gz}
  rm -rf "$src"; mkdir -p "$src"
  if [ -f "$tarball" ]; then
    step="cluster-autoscaler: verify $tarball"; log "$step"
    echo "$CLUSTER_AUTOSCALER_SRC_SHA256  $tarball" | sha256sum -c --quiet -
    tar -xzf "$tarball" -C "$src"
  else
    step="cluster-autoscaler: download tag $tag ($CLUSTER_AUTOSCALER_COMMIT)"; log "$step"
    curl -fsSL "https://github.com/kubernetes/autoscaler/archive/$CLUSTER_AUTOSCALER_COMMIT.tar.gz" \
      | tar -xz -C "$src" --wildcards '*/cluster-autoscaler/*'
  fi
  local mod
  mod=$(find "$src" -maxdepth 3 -type f -path '*/cluster-autoscaler/go.mod' | head -1)
  [ -n "$mod" ] || { echo "build-upstream: no cluster-autoscaler/go.mod under $src" >&2; exit 2; }
  step="cluster-autoscaler: go build -tags clusterapi"; log "$step"
  mkdir -p "$out.tmp"
  (cd "$(dirname "$mod")" && go build -tags clusterapi -trimpath -ldflags "-s -w" -o "$out.tmp/cluster-autoscaler" .)
  rm -rf "$out" "$src"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION: built into $out"
}

build_cm() { # cert-manager: controller, cainjector, webhook from the tag's source, vcert by `replace`
  # (the Go proxy refuses github.com/Venafi/vcert/v5), plus its manifests rendered by the pinned helm
  # from the chart in the same source, which clusterctl installs through its cert-manager URL setting.
  local out=$BIN/cert-manager-$CERT_MANAGER_VERSION
  if [ -f "$out/.done" ]; then log "cert-manager $CERT_MANAGER_VERSION: cached in $out"; return; fi
  need_go
  build_helm
  local src=$WORK/cert-manager-$CERT_MANAGER_VERSION up=$here/../../shared/upstream
  local tarball=${CM_SRC_TARBALL:-$up/cert-manager-${CERT_MANAGER_VERSION#v}-src.tar.gz}
  local vtar=${VCERT_SRC_TARBALL:-$up/vcert-$VCERT_VERSION-src.tar.gz}
  rm -rf "$src"; mkdir -p "$src"
  if [ -f "$tarball" ] && [ -f "$vtar" ]; then
    step="cert-manager: verify $tarball and $vtar"; log "$step"
    echo "$CERT_MANAGER_SRC_SHA256  $tarball" | sha256sum -c --quiet -
    echo "$VCERT_SRC_SHA256  $vtar" | sha256sum -c --quiet -
    tar -xzf "$tarball" -C "$src"; tar -xzf "$vtar" -C "$src"
  else
    step="cert-manager: download $CERT_MANAGER_VERSION ($CERT_MANAGER_COMMIT) and vcert $VCERT_VERSION"; log "$step"
    mkdir -p "$src/cert-manager-${CERT_MANAGER_VERSION#v}" "$src/vcert-$VCERT_VERSION"
    curl -fsSL "https://github.com/cert-manager/cert-manager/archive/$CERT_MANAGER_COMMIT.tar.gz" \
      | tar -xz -C "$src/cert-manager-${CERT_MANAGER_VERSION#v}" --strip-components=1
    curl -fsSL "https://github.com/Venafi/vcert/archive/$VCERT_COMMIT.tar.gz" \
      | tar -xz -C "$src/vcert-$VCERT_VERSION" --strip-components=1
  fi
  local root=$src/cert-manager-${CERT_MANAGER_VERSION#v} vc=$src/vcert-$VCERT_VERSION
  mkdir -p "$out.tmp"
  for c in controller cainjector webhook; do
    step="cert-manager: go build $c (vcert replaced by $vc)"; log "$step"
    (cd "$root" && go mod edit -replace "github.com/Venafi/vcert/v5=$vc")
    (cd "$root/cmd/$c" && go mod edit -replace "github.com/Venafi/vcert/v5=$vc" \
      && go build -trimpath -ldflags "-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION -X github.com/cert-manager/cert-manager/pkg/util.AppGitCommit=$CERT_MANAGER_COMMIT" -o "$out.tmp/$c" .)
  done
  step="cert-manager: helm template the chart"; log "$step"
  # The release asset (cert-manager.yaml) starts with its Namespace; `helm template -n` leaves it out, and
  # clusterctl installs the objects as they are.
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cert-manager\n---\n' > "$out.tmp/cert-manager.yaml"
  "$BIN/helm-$HELM_VERSION/helm" template cert-manager "$root/deploy/charts/cert-manager" -n cert-manager \
    --kube-version "${KUBERNETES_VERSION}" --set crds.enabled=true \
    --set image.tag="$CERT_MANAGER_VERSION" --set webhook.image.tag="$CERT_MANAGER_VERSION" \
    --set cainjector.image.tag="$CERT_MANAGER_VERSION" --set acmesolver.image.tag="$CERT_MANAGER_VERSION" \
    --set startupapicheck.enabled=false >> "$out.tmp/cert-manager.yaml"
  rm -rf "$out" "$src"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "cert-manager $CERT_MANAGER_VERSION: built into $out"
}

build_mp() { # nvidia-mig-parted for the node install: cgo (go-nvml dlopens NVML), dependencies vendored, offline
  local out=$BIN/mig-parted-$MIG_PARTED_VERSION
  if [ -f "$out/.done" ]; then log "mig-parted $MIG_PARTED_VERSION: cached in $out"; return; fi
  need_go
  command -v gcc >/dev/null 2>&1 || { echo "build-upstream: mig-parted needs cgo: install gcc and rerun." >&2; exit 2; }
  local src=$WORK/mig-parted-$MIG_PARTED_VERSION
  local tarball=${MP_SRC_TARBALL:-$here/../../shared/upstream/mig-parted-$MIG_PARTED_VERSION-src.tar.gz}
  rm -rf "$src"; mkdir -p "$src"
  if [ -f "$tarball" ]; then
    step="mig-parted: verify $tarball"; log "$step"
    echo "$MIG_PARTED_SRC_SHA256  $tarball" | sha256sum -c --quiet -
    tar -xzf "$tarball" -C "$src" --strip-components=1
  else
    step="mig-parted: download tag v$MIG_PARTED_VERSION ($MIG_PARTED_COMMIT)"; log "$step"
    curl -fsSL "https://github.com/NVIDIA/mig-parted/archive/$MIG_PARTED_COMMIT.tar.gz" | tar -xz -C "$src" --strip-components=1
  fi
  step="mig-parted: go build (cgo, vendored)"; log "$step"
  mkdir -p "$out.tmp"
  # The version flags of upstream's Makefile (versions.mk), so `nvidia-mig-parted --version` names the tag.
  local info=github.com/NVIDIA/mig-parted/internal/info
  (cd "$src" && CGO_ENABLED=1 GOFLAGS=-mod=vendor go build -trimpath \
    -ldflags "-s -w -X $info.version=v$MIG_PARTED_VERSION -X $info.gitCommit=$MIG_PARTED_COMMIT" \
    -o "$out.tmp/nvidia-mig-parted" ./cmd/nvidia-mig-parted)
  local sum; sum=$(sha256sum "$out.tmp/nvidia-mig-parted" | cut -d' ' -f1)
  echo "$sum" > "$out.tmp/nvidia-mig-parted.sha256"
  if [ -n "${MIG_PARTED_SHA256:-}" ] && [ "$sum" != "$MIG_PARTED_SHA256" ]; then
    log "WARNING: nvidia-mig-parted sha256 $sum is not the recorded $MIG_PARTED_SHA256 ($(go version)); hack/versions.env says which toolchain gave that"
  fi
  rm -rf "$out" "$src"; mv "$out.tmp" "$out"; touch "$out/.done"
  log "mig-parted $MIG_PARTED_VERSION: built into $out (sha256 $sum)"
}

targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(all)
for t in "${targets[@]}"; do
  case $t in
    all) build_kine; build_kustomize; build_capi; build_clusterctl; build_k8s; build_helm; build_ca; build_cm; build_mp ;;
    k8s) build_k8s ;; kine) build_kine ;; capi) build_capi ;; kustomize) build_kustomize ;;
    clusterctl) build_clusterctl ;; helm) build_helm ;; ca) build_ca ;; cm) build_cm ;; mp) build_mp ;;
    *) echo "build-upstream: unknown target '$t' (all|k8s|kine|capi|kustomize|clusterctl|helm|ca|cm|mp)" >&2; exit 2 ;;
  esac
done
step=""
log "done; binaries under $BIN"
