"""`make release-manifests`: the four clusterctl assets land in OUT laid out as a clusterctl local repository
(infrastructure-hetzner-gpu/v0.1.0/), the components are the kustomize build with the release image, the tree
stays clean, and the pinned clusterctl uses that very directory as the provider `hetzner-gpu` (one target
namespace, metadata for the release series, both template flavors), exactly as docs/clusterctl.md says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import config_helpers as h
import pytest
import yaml

from capi_gpu import domain

IMG = "registry.example:5000/capi-gpu/capi-gpu:v0.1.0"
ASSETS = {
    "infrastructure-components.yaml",
    "metadata.yaml",
    "cluster-template.yaml",
    "cluster-template-dev.yaml",
    "cluster-template-gpu-workers.yaml",
}


def _status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--", "config", "crds"], cwd=h.REPO, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release")
    before = _status()
    proc = subprocess.run(
        ["make", "--no-print-directory", "release-manifests", f"OUT={out}", f"IMG={IMG}", f"KUSTOMIZE={h.kustomize()}"],
        cwd=h.REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _status() == before, "make release-manifests changed files under config/ or crds/"
    assert [p.relative_to(out).as_posix() for p in out.iterdir()] == ["infrastructure-hetzner-gpu"]
    return out / "infrastructure-hetzner-gpu" / "v0.1.0"


def test_assets_are_written(release: Path) -> None:
    assert {p.name for p in release.iterdir()} == ASSETS
    for name in ASSETS - {"infrastructure-components.yaml"}:
        assert (release / name).read_text() == (h.CLUSTERCTL_DIR / name).read_text()


def test_components_are_the_default_build_with_the_release_image(
    release: Path, components: list[dict[str, Any]]
) -> None:
    built = [d for d in yaml.safe_load_all((release / "infrastructure-components.yaml").read_text()) if d]
    images = [
        c["image"] for d in built if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert images == [IMG]
    for d in built:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                c["image"] = "ghcr.io/capi-gpu/capi-gpu:dev"
                for e in c.get("env", []):  # the gate plugin's image follows the manager's
                    if e["name"] == "CAPI_GPU_IMAGE":
                        e["value"] = "ghcr.io/capi-gpu/capi-gpu:dev"
    assert built == components
    assert [d["metadata"]["name"] for d in built if d["kind"] == "Namespace"] == ["capi-gpu-system"]
    assert all(d["metadata"]["labels"][domain.PROVIDER_LABEL] == domain.PROVIDER_NAME for d in built)


def test_metadata_maps_the_release_series_to_v1beta2(release: Path) -> None:
    meta = yaml.safe_load((release / "metadata.yaml").read_text())
    assert meta["apiVersion"] == "clusterctl.cluster.x-k8s.io/v1alpha3"
    assert meta["kind"] == "Metadata"
    assert meta["releaseSeries"] == [{"major": 0, "minor": 1, "contract": "v1beta2"}]
    # The contract label on our CRDs names the API version this series serves.
    for path in (h.REPO / "crds").glob(f"{domain.GROUP}_*.yaml"):
        assert yaml.safe_load(path.read_text())["metadata"]["labels"][domain.CONTRACT_LABEL] == domain.VERSION


def _local_repository(release: Path, tmp: Path) -> None:
    """The clusterctl config docs/clusterctl.md shows, pointing at what `make release-manifests` wrote."""
    config = tmp / "xdg" / "cluster-api" / "clusterctl.yaml"
    config.parent.mkdir(parents=True)
    provider = {
        "name": "hetzner-gpu",
        "url": (release / "infrastructure-components.yaml").as_uri(),
        "type": "InfrastructureProvider",
    }
    config.write_text(yaml.safe_dump({"providers": [provider]}))


def test_clusterctl_installs_the_release_with_no_variables_set(release: Path, tmp_path: Path) -> None:
    _local_repository(release, tmp_path)
    described = h.clusterctl(["generate", "provider", "--infrastructure", "hetzner-gpu:v0.1.0", "--describe"], tmp_path)
    assert "TargetNamespace:    capi-gpu-system" in described
    assert IMG in described
    # What `clusterctl init` would apply: every variable has a default, the flags default to "all".
    out = h.clusterctl(["generate", "provider", "--infrastructure", "hetzner-gpu:v0.1.0"], tmp_path)
    docs = [d for d in yaml.safe_load_all(out) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=*", "--watch-filter=*"} <= set(args)
    # clusterctl's envsubst leaves the kubelet's $(VAR) alone.
    assert "--gate-plugin-image=$(CAPI_GPU_IMAGE)" in args
    # clusterctl moves everything namespaced into the target namespace it is given.
    moved = h.clusterctl(
        ["generate", "provider", "--infrastructure", "hetzner-gpu:v0.1.0", "--target-namespace", "gpu-infra"],
        tmp_path,
        {"CAPI_GPU_WATCH_FILTER": "shard-1"},
    )
    moved_docs = [d for d in yaml.safe_load_all(moved) if d]
    assert [d["metadata"]["name"] for d in moved_docs if d["kind"] == "Namespace"] == ["gpu-infra"]
    (deployment,) = [d for d in moved_docs if d["kind"] == "Deployment"]
    assert "--watch-filter=shard-1" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("flavor", ["", "dev"])
def test_clusterctl_generates_both_flavors_from_the_release(release: Path, tmp_path: Path, flavor: str) -> None:
    _local_repository(release, tmp_path)
    args = [
        "generate",
        "cluster",
        "gpus",
        "-n",
        "team-a",
        "--kubernetes-version",
        "v1.36.3",
        "--infrastructure",
        "hetzner-gpu:v0.1.0",
    ]
    if flavor:
        args += ["--flavor", flavor]
    env = {"CONTROL_PLANE_ENDPOINT_HOST": "127.0.0.1", "CONTROL_PLANE_ENDPOINT_PORT": "6443"}
    docs = [d for d in yaml.safe_load_all(h.clusterctl(args, tmp_path, env)) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Cluster", "HetznerGPUCluster", "MachineDeployment", "MachineHealthCheck"} <= kinds
    assert ("KubeadmControlPlane" in kinds) == (flavor == "")


def test_every_image_in_the_release_is_img(release: Path) -> None:
    """Issue 28: the gate plugin's image reached workload clusters as `:dev` after a release install. The
    operator hands --gate-plugin-image to the add-ons playbook; the release must set it to IMG too."""
    text = (release / "infrastructure-components.yaml").read_text()
    assert ":dev" not in text
    built = [d for d in yaml.safe_load_all(text) if d]
    (deployment,) = [d for d in built if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    containers = pod["containers"] + pod.get("initContainers", [])
    assert [c["image"] for c in containers] == [IMG] * len(containers)
    (manager,) = [c for c in containers if c["name"] == "manager"]
    env = {e["name"]: e.get("value") for e in manager.get("env", [])}
    flags = [a.split("=", 1)[1] for a in manager["args"] if a.startswith("--gate-plugin-image=")]
    # The kubelet expands $(VAR) in args from the container's env.
    resolved = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)] or "", f) for f in flags]
    assert resolved == [IMG]
