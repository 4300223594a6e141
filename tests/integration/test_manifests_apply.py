"""The shipped manifests on the real kube-apiserver (CAPI CRDs and CAPI's own webhooks installed): the
infrastructure-components as clusterctl renders them, and both cluster-template flavors rendered by
`clusterctl generate cluster`, pass a server-side apply dry run, i.e. the schemas (ours, CAPI's, RBAC's,
apps/v1's) and CAPI's admission accept every object; and a broken object is refused, so the dry run checks."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.kube import CRDS, NAMESPACES, Conflict, Invalid, Kube, NotFound, Res
from capi_gpu_sim import binaries, controlplane_object
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration

REPO = binaries.REPO
APPLY = "application/apply-patch+yaml"
CERT_MANAGER = "cert-manager.io/"  # the webhook's Issuer and Certificate (clusterctl init installs cert-manager)
DEPLOYMENTS = Res("apps", "v1", "deployments")


def clusterctl(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "CLUSTERCTL_"))}
    run_env |= {"CLUSTERCTL_DISABLE_VERSIONCHECK": "true", "XDG_CONFIG_HOME": str(tmp / "xdg"), "HOME": str(tmp)}
    run_env |= env or {}
    proc = subprocess.run(
        [str(binaries.ensure_clusterctl()), *args], capture_output=True, text=True, env=run_env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def components(tmp: Path) -> list[dict[str, Any]]:
    kustomize = binaries.locate().kustomize
    if not kustomize.exists():
        kustomize = binaries.ensure_built().kustomize
    built = subprocess.run(
        [str(kustomize), "build", "--load-restrictor", "LoadRestrictionsNone", str(REPO / "config" / "default")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / "infrastructure-components.yaml"
    path.write_text(built)
    # As `clusterctl init` substitutes them: no variables set, every default applies.
    return clusterctl(["generate", "yaml", "--from", str(path)], tmp)


def template(tmp: Path, name: str, namespace: str) -> list[dict[str, Any]]:
    return clusterctl(
        [
            "generate", "cluster", "gpus", "-n", namespace, "--kubernetes-version", "v1.36.3",
            "--worker-machine-count", "1", "--from", str(REPO / "config" / "clusterctl" / name),
        ],
        tmp,
        {"CONTROL_PLANE_ENDPOINT_HOST": "127.0.0.1", "CONTROL_PLANE_ENDPOINT_PORT": "6443"},
    )  # fmt: skip


class Resources:
    """kind -> URL path, from the apiserver's discovery (so CRDs installed a moment ago are found)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._cache: dict[str, dict[str, tuple[str, bool]]] = {}

    def path(self, doc: dict[str, Any]) -> str:
        api_version = doc["apiVersion"]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if doc["kind"] not in self._cache.get(api_version, {}):
            self._cache[api_version] = self._discover(base, doc["kind"])
        plural, namespaced = self._cache[api_version][doc["kind"]]
        meta = doc["metadata"]
        ns = f"/namespaces/{meta['namespace']}" if namespaced else ""
        return f"{base}{ns}/{plural}/{meta['name']}"

    def _discover(self, base: str, kind: str) -> dict[str, tuple[str, bool]]:
        # A CRD that just became Established can lag a moment in discovery: its whole group, or only its kind
        # when another CRD of the group was already served.
        for _ in range(50):
            with contextlib.suppress(NotFound):
                found = self.kube._call("GET", base)
                kinds = {r["kind"]: (r["name"], r["namespaced"]) for r in found["resources"] if "/" not in r["name"]}
                if kind in kinds:
                    return kinds
            time.sleep(0.1)
        raise AssertionError(f"{kind} not in {base} discovery after 5s")


def dry_run_apply(kube: Kube, resources: Resources, doc: dict[str, Any]) -> dict[str, Any]:
    query = {"dryRun": "All", "fieldManager": "capi-gpu-manifest-test", "force": "true"}
    result: dict[str, Any] = kube._call("PATCH", resources.path(doc), body=doc, query=query, content_type=APPLY)
    return result


def _established(kube: Kube, name: str) -> bool:
    conds = (kube.get(CRDS, name).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conds)


@pytest.fixture
def installed_crds_and_namespace(kube: Kube, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """The components' CRDs and Namespace created for real (everything namespaced needs them), removed
    again if this test created them; the rest is only dry-run."""
    docs = components(tmp_path)
    created: list[tuple[str, str]] = []
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            try:
                kube.create(CRDS, doc)
                created.append(("crd", doc["metadata"]["name"]))
            except Conflict:
                pass  # ours, installed by the harness from the same files
        elif doc["kind"] == "Namespace":
            try:
                kube.create(NAMESPACES, doc)
                created.append(("ns", doc["metadata"]["name"]))
            except Conflict:
                pass
    for name in (n for k, n in created if k == "crd"):
        for _ in range(100):
            if _established(kube, name):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"CRD {name} not Established after 10s")
    try:
        yield docs
    finally:
        for kind, name in reversed(created):
            with contextlib.suppress(NotFound):
                kube.delete(CRDS if kind == "crd" else NAMESPACES, name)


def test_infrastructure_components_are_accepted(
    kube: Kube, control_plane: ControlPlane, installed_crds_and_namespace: list[dict[str, Any]]
) -> None:
    resources = Resources(kube)
    kinds = set()
    for doc in installed_crds_and_namespace:
        if doc["kind"] in ("CustomResourceDefinition", "Namespace"):
            continue
        if doc["apiVersion"].startswith(CERT_MANAGER):
            continue  # cert-manager's CRDs are not in this apiserver; tests/unit/config checks the wiring
        out = dry_run_apply(kube, resources, doc)
        assert out["metadata"]["name"] == doc["metadata"]["name"]
        kinds.add(doc["kind"])
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding"} <= kinds
    assert {"Service", "ValidatingWebhookConfiguration"} <= kinds
    # A dry run creates nothing.
    assert kube.get_or_none(DEPLOYMENTS, "capi-gpu-controller-manager", "capi-gpu-system") is None


@pytest.mark.parametrize("name", ["cluster-template.yaml", "cluster-template-dev.yaml"])
def test_cluster_templates_are_accepted(
    kube: Kube, control_plane: ControlPlane, namespace: str, tmp_path: Path, name: str
) -> None:
    if name == "cluster-template-dev.yaml":
        controlplane_object.install(kube, control_plane)  # the dev flavor's SimControlPlane kind
    resources = Resources(kube)
    docs = template(tmp_path, name, namespace)
    for doc in docs:
        out = dry_run_apply(kube, resources, doc)
        assert out["metadata"]["namespace"] == namespace
    kinds = {d["kind"] for d in docs}
    assert {"Cluster", "HetznerGPUCluster", "MachineDeployment", "HetznerGPUMachineTemplate"} <= kinds
    assert {"MachineHealthCheck", "HetznerGPURemediationTemplate"} <= kinds


def test_a_broken_object_is_refused(kube: Kube, control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    resources = Resources(kube)
    docs = template(tmp_path, "cluster-template.yaml", namespace)
    (mt,) = [d for d in docs if d["kind"] == "HetznerGPUMachineTemplate" and d["metadata"]["name"] == "gpus-gpu"]
    mt["spec"]["template"]["spec"]["gpu"]["driverBranch"] = "latest"
    with pytest.raises(Invalid, match="driverBranch"):
        dry_run_apply(kube, resources, mt)
    (md,) = [d for d in docs if d["kind"] == "MachineDeployment"]
    md["spec"]["rollout"]["strategy"]["rollingUpdate"] = {"maxSurge": 0, "maxUnavailable": 0}
    # CAPI's own validating webhook runs on dry runs too: a rollout that could never progress.
    with pytest.raises(Invalid, match="maxUnavailable and maxSurge cannot both be 0"):
        dry_run_apply(kube, resources, md)
