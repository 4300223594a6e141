"""Where the pinned upstream binaries are, and building them when they are missing.

Tests never skip for a missing binary: they call ``ensure_built()``, which runs
``hack/build-upstream.sh`` (idempotent, cached by version under ~/.cache/capi-gpu).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-upstream.sh"
VERSIONS_FILE = REPO / "hack" / "versions.env"


class BinariesMissing(RuntimeError):
    """A binary could not be found or built; the message says what to do."""


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("CAPI_GPU_CACHE", Path.home() / ".cache" / "capi-gpu"))


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kubectl: Path
    kine: Path
    capi_manager: Path
    capi_crds: Path
    capi_webhooks: Path
    kustomize: Path

    def all(self) -> list[Path]:
        return [
            self.kube_apiserver,
            self.kube_scheduler,
            self.kube_controller_manager,
            self.kubectl,
            self.kine,
            self.capi_manager,
            self.kustomize,
        ]


def locate() -> Binaries:
    v = versions()
    b = cache_dir() / "bin"
    k8s = b / f"k8s-{v['KUBERNETES_VERSION']}"
    capi = b / f"capi-{v['CAPI_VERSION']}"
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    apiserver = k8s / "kube-apiserver"
    if assets and (Path(assets) / "kube-apiserver").exists():
        apiserver = Path(assets) / "kube-apiserver"
    return Binaries(
        kube_apiserver=apiserver,
        kube_scheduler=k8s / "kube-scheduler",
        kube_controller_manager=k8s / "kube-controller-manager",
        kubectl=k8s / "kubectl",
        kine=b / f"kine-{v['KINE_VERSION']}" / "kine",
        capi_manager=capi / "cluster-api-manager",
        capi_crds=capi / "crds",
        capi_webhooks=capi / "webhook" / "core.yaml",
        kustomize=b / f"kustomize-{v['KUSTOMIZE_VERSION']}" / "kustomize",
    )


def ensure_built() -> Binaries:
    bins = locate()
    if all(p.exists() for p in bins.all()):
        return bins
    try:
        subprocess.run(["bash", str(BUILD_SCRIPT), "all"], check=True)
    except FileNotFoundError as exc:
        raise BinariesMissing(f"cannot run {BUILD_SCRIPT}: {exc}; install bash and Go >= 1.26") from exc
    except subprocess.CalledProcessError as exc:
        raise BinariesMissing(
            f"{BUILD_SCRIPT} failed (exit {exc.returncode}); its last lines name the failed step"
        ) from exc
    bins = locate()
    missing = [str(p) for p in bins.all() if not p.exists()]
    if missing:
        raise BinariesMissing(f"built, yet still missing: {', '.join(missing)}")
    return bins


def _ensure_target(path: Path, target: str, needs: str) -> Path:
    """``path``, running ``build-upstream.sh TARGET`` first when it is missing (tests build, never skip)."""
    if path.exists():
        return path
    try:
        subprocess.run(["bash", str(BUILD_SCRIPT), target], check=True)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        raise BinariesMissing(f"{BUILD_SCRIPT} {target} failed: {exc}; install {needs}") from exc
    if not path.exists():
        raise BinariesMissing(f"built, yet still missing: {path}")
    return path


def clusterctl_path() -> Path:
    return cache_dir() / "bin" / f"clusterctl-{versions()['CAPI_VERSION']}" / "clusterctl"


def ensure_clusterctl() -> Path:
    """clusterctl from the pinned CAPI module (`generate cluster` renders the templates, offline).

    Separate from ``ensure_built``: only the manifest tests and the dev tool need it.
    """
    return _ensure_target(clusterctl_path(), "clusterctl", "bash and Go >= 1.26")


def cluster_autoscaler_path() -> Path:
    v = versions()["CLUSTER_AUTOSCALER_VERSION"]
    return cache_dir() / "bin" / f"cluster-autoscaler-{v}" / "cluster-autoscaler"


def ensure_cluster_autoscaler() -> Path:
    """cluster-autoscaler (clusterapi provider only), built from its tag's source once (~4.5 min, 76 MB)."""
    return _ensure_target(cluster_autoscaler_path(), "ca", "bash, curl and Go >= 1.26")


def helm_path() -> Path:
    return cache_dir() / "bin" / f"helm-{versions()['HELM_VERSION']}" / "helm"


def ensure_helm() -> Path:
    """helm (v3, from its Go module): the add-ons playbook's kubernetes.core.helm drives it."""
    return _ensure_target(helm_path(), "helm", "bash and Go >= 1.26")


def cert_manager_dir() -> Path:
    return cache_dir() / "bin" / f"cert-manager-{versions()['CERT_MANAGER_VERSION']}"


def ensure_cert_manager() -> Path:
    """cert-manager's controller, cainjector and webhook, and ``cert-manager.yaml`` (its chart rendered by
    the pinned helm), built from the pinned source with vcert as a ``replace`` (~6 min once)."""
    return _ensure_target(cert_manager_dir() / "cert-manager.yaml", "cm", "bash and Go >= 1.26").parent


def mig_parted_path() -> Path:
    return cache_dir() / "bin" / f"mig-parted-{versions()['MIG_PARTED_VERSION']}" / "nvidia-mig-parted"


def ensure_mig_parted() -> Path:
    """nvidia-mig-parted from the pinned, vendored source (cgo; ~25 s once): the binary the operator ships and
    the node install copies to the host, so the test worlds hand the host the same file a user's operator does."""
    return _ensure_target(mig_parted_path(), "mp", "bash, gcc and Go >= 1.26")
