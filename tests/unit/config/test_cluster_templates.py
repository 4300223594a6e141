"""The clusterctl templates: their variables equal the documented lists (header comment, docs table, and what
`clusterctl generate cluster --list-variables` prints), defaults agree, every variable position is YAML-safe,
the rendered objects say what the contract needs (refs, readiness gate, startup taint, provider ID,
autoscaler annotations, MHC on GPUReady with our remediation), and our kinds validate against the models."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import config_helpers as h
import pytest
import yaml
from pydantic import BaseModel

from capi_gpu import domain
from capi_gpu.api.cluster import HetznerGPUClusterSpec
from capi_gpu.api.machine import HetznerGPUMachineTemplateSpec
from capi_gpu.api.remediation import HetznerGPURemediationTemplateSpec
from capi_gpu.gpu import catalog, migparted
from capi_gpu_sim import binaries, caph

FLAVORS = list(h.TEMPLATES)
DOC_HEADINGS = {
    "default": "### cluster-template.yaml variables",
    "dev": "### cluster-template-dev.yaml variables",
    "gpu-workers": "### cluster-template-gpu-workers.yaml variables",
}
REQUIRED = "-"
PROVIDER_ID = f"{domain.PROVIDER_ID_PREFIX}{{{{ ds.meta_data.server_number }}}}"


def text(flavor: str) -> str:
    return h.TEMPLATES[flavor].read_text()


def rendered(flavor: str, tmp_path: Path) -> list[dict[str, Any]]:
    """What `clusterctl generate cluster` writes, with the required variables given."""
    env = {"CONTROL_PLANE_ENDPOINT_HOST": "127.0.0.1", "CONTROL_PLANE_ENDPOINT_PORT": "6443"}
    out = h.clusterctl(
        [
            "generate",
            "cluster",
            "gpus",
            "-n",
            "team-a",
            "--kubernetes-version",
            "v1.36.3",
            "--from",
            str(h.TEMPLATES[flavor]),
        ],
        tmp_path,
        env,
    )
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = by_kind(docs, kind)
    return doc


@pytest.mark.parametrize("flavor", FLAVORS)
def test_variables_equal_the_documented_lists(flavor: str) -> None:
    used = h.template_variables(text(flavor))
    header = h.header_variables(text(flavor))
    docs = h.docs_variables(DOC_HEADINGS[flavor])
    assert set(used) == set(header), "template vs its header comment"
    assert set(used) == set(docs), "template vs docs/clusterctl.md"
    for name, defaults in used.items():
        assert len(defaults) == 1, f"{name} has different defaults in different places: {defaults}"
        (default,) = defaults
        assert header[name] == (default if default is not None else REQUIRED), name
        assert docs[name] == (default if default is not None else "—"), name


@pytest.mark.parametrize("flavor", FLAVORS)
def test_clusterctl_lists_exactly_the_documented_variables(flavor: str, tmp_path: Path) -> None:
    out = h.clusterctl(
        ["generate", "cluster", "x", "-n", "ns", "--from", str(h.TEMPLATES[flavor]), "--list-variables"], tmp_path
    )
    listed = set(re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)", out, re.M))
    assert listed == set(h.header_variables(text(flavor)))
    required = set(re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)", out.split("Optional Variables:")[0], re.M))
    # clusterctl fills CLUSTER_NAME and NAMESPACE itself; the rest without a default are required.
    documented_required = {n for n, d in h.header_variables(text(flavor)).items() if d == REQUIRED}
    assert required == documented_required - {"CLUSTER_NAME", "NAMESPACE"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_bare_dollar_variables_and_no_variables_in_comments(flavor: str) -> None:
    body = text(flavor)
    assert not h.BARE_VAR_RE.search(h.VAR_RE.sub("", body)), "drone/envsubst would substitute a bare $NAME"
    for line in body.splitlines():
        if line.lstrip().startswith("#"):
            assert "$" not in line, f"envsubst substitutes inside comments too: {line!r}"


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("dummy", ["x", "0", "a:b", "true", "1.0"])
def test_parses_as_yaml_with_any_value_substituted(flavor: str, dummy: str) -> None:
    values = dict.fromkeys(h.template_variables(text(flavor)), dummy)
    docs = [d for d in yaml.safe_load_all(h.substitute(text(flavor), values)) if d]
    assert docs and all({"apiVersion", "kind", "metadata", "spec"} <= set(d) for d in docs)
    for doc in docs:
        assert doc["metadata"]["namespace"] == dummy or dummy in ("0", "true", "1.0")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_our_kinds_validate_against_the_models(flavor: str, tmp_path: Path) -> None:
    docs = rendered(flavor, tmp_path)
    models: dict[str, type[BaseModel]] = {
        "HetznerGPUCluster": HetznerGPUClusterSpec,
        "HetznerGPUMachineTemplate": HetznerGPUMachineTemplateSpec,
        "HetznerGPURemediationTemplate": HetznerGPURemediationTemplateSpec,
    }
    seen = set()
    for doc in docs:
        if doc["apiVersion"] == domain.API_VERSION:
            models[doc["kind"]].model_validate(doc["spec"])
            seen.add(doc["kind"])
    assert seen == set(models)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_every_object_is_in_the_target_namespace_and_refs_resolve(flavor: str, tmp_path: Path) -> None:
    docs = rendered(flavor, tmp_path)
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    refs = []
    for cluster in by_kind(docs, "Cluster"):  # none in gpu-workers: the Cluster exists already
        refs.append(cluster["spec"]["infrastructureRef"])
        if "controlPlaneRef" in cluster["spec"]:
            refs.append(cluster["spec"]["controlPlaneRef"])
    for kcp in by_kind(docs, "KubeadmControlPlane"):
        refs.append(kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"])
    for md in by_kind(docs, "MachineDeployment"):
        spec = md["spec"]["template"]["spec"]
        refs.append(spec["infrastructureRef"])
        if "configRef" in spec["bootstrap"]:
            refs.append(spec["bootstrap"]["configRef"])
    refs += [m["spec"]["remediation"]["templateRef"] for m in by_kind(docs, "MachineHealthCheck")]
    for ref in refs:
        assert (ref["kind"], ref["name"]) in names, ref


def test_default_flavor_control_plane(tmp_path: Path) -> None:
    docs = rendered("default", tmp_path)
    cluster = one(docs, "Cluster")
    assert cluster["apiVersion"] == domain.CAPI_API_VERSION
    assert cluster["spec"]["controlPlaneRef"] == {
        "apiGroup": "controlplane.cluster.x-k8s.io",
        "kind": "KubeadmControlPlane",
        "name": "gpus-control-plane",
    }
    assert cluster["spec"]["infrastructureRef"]["kind"] == "HetznerGPUCluster"
    kcp = one(docs, "KubeadmControlPlane")
    assert kcp["apiVersion"] == "controlplane.cluster.x-k8s.io/v1beta2"
    for phase in ("initConfiguration", "joinConfiguration"):
        args = kcp["spec"]["kubeadmConfigSpec"][phase]["nodeRegistration"]["kubeletExtraArgs"]
        assert {"name": "provider-id", "value": PROVIDER_ID} in args
    cp_template = next(
        t for t in by_kind(docs, "HetznerGPUMachineTemplate") if t["metadata"]["name"] == "gpus-control-plane"
    )
    assert "gpu" not in cp_template["spec"]["template"]["spec"]
    assert cp_template["spec"]["template"]["spec"]["hostSelector"]["matchLabels"] == {domain.LABEL_GPU_PRESENT: "false"}
    hgc = one(docs, "HetznerGPUCluster")["spec"]
    assert hgc["controlPlaneLoadBalancer"]["enabled"] is True
    assert hgc["controlPlaneLoadBalancer"]["tokenRef"]["name"] == "hcloud-token"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_gpu_machine_deployment(flavor: str, tmp_path: Path) -> None:
    docs = rendered(flavor, tmp_path)
    md = one(docs, "MachineDeployment")
    ann = md["metadata"]["annotations"]
    assert ann[domain.CA_MIN_SIZE_ANNOTATION] == "0"
    assert ann[domain.CA_MAX_SIZE_ANNOTATION] == "3"
    assert ann[domain.CA_MAX_NODE_PROVISION_TIME_ANNOTATION] == "60m"
    assert md["spec"]["rollout"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    spec = md["spec"]["template"]["spec"]
    assert spec["readinessGates"] == [{"conditionType": domain.GPU_READY_CONDITION}]
    assert spec["version"] == "v1.36.3"
    assert md["spec"]["selector"]["matchLabels"].items() <= md["spec"]["template"]["metadata"]["labels"].items()
    template = next(t for t in by_kind(docs, "HetznerGPUMachineTemplate") if t["metadata"]["name"] == "gpus-gpu")
    gpu = template["spec"]["template"]["spec"]["gpu"]
    assert gpu == {"model": "rtx-pro-6000", "driverBranch": "575", "layout": {"preset": "all-balanced"}}
    # The defaults name a catalogued GPU and one of its presets.
    model = catalog.builtin_catalog().model(gpu["model"])
    assert gpu["layout"]["preset"] in migparted.presets(model)
    assert template["spec"]["template"]["spec"]["hostSelector"]["matchLabels"] == {
        domain.LABEL_GPU_PRESENT: "true",
        domain.LABEL_MIG_CAPABLE: "true",
    }


def test_gpu_join_registers_tainted_with_provider_id_and_labels(tmp_path: Path) -> None:
    docs = rendered("default", tmp_path)
    kct = one(docs, "KubeadmConfigTemplate")
    assert kct["apiVersion"] == "bootstrap.cluster.x-k8s.io/v1beta2"
    reg = kct["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
    assert reg["taints"] == [{"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}]
    args = {a["name"]: a["value"] for a in reg["kubeletExtraArgs"]}
    assert args["provider-id"] == PROVIDER_ID
    labels = dict(kv.split("=", 1) for kv in args["node-labels"].split(","))
    # Not CA's cluster-api/accelerator: CA 1.36 would count every GPU-ready DRA node as unready.
    assert labels == {domain.LABEL_GPU_PRESENT: "true"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_health_check_remediates_gpu_machines_through_robot(flavor: str, tmp_path: Path) -> None:
    docs = rendered(flavor, tmp_path)
    mhc = one(docs, "MachineHealthCheck")
    md = one(docs, "MachineDeployment")
    assert mhc["spec"]["selector"] == md["spec"]["selector"]
    checks = mhc["spec"]["checks"]
    assert checks["nodeStartupTimeoutSeconds"] == 3600
    assert {"type": domain.GPU_READY_CONDITION, "status": "False", "timeoutSeconds": 1800} in checks[
        "unhealthyMachineConditions"
    ]
    ref = mhc["spec"]["remediation"]["templateRef"]
    assert ref["apiVersion"] == domain.API_VERSION
    assert ref["kind"] == "HetznerGPURemediationTemplate"


def test_dev_flavor_uses_the_harness_control_plane(tmp_path: Path) -> None:
    docs = rendered("dev", tmp_path)
    assert not by_kind(docs, "KubeadmControlPlane")
    assert not by_kind(docs, "KubeadmConfigTemplate")
    assert not by_kind(docs, "HetznerGPUHost"), "hosts come from the dev tool"
    cluster = one(docs, "Cluster")
    # The harness apiserver is the control plane: an externally managed SimControlPlane stands for it, so
    # CAPI counts the control plane initialized and connects to the workload cluster.
    assert cluster["spec"]["controlPlaneRef"] == {
        "apiGroup": "controlplane.sim.gpu.infrastructure.cluster.x-k8s.io",
        "kind": "SimControlPlane",
        "name": "gpus",
    }
    assert one(docs, "SimControlPlane")["spec"]["controlPlaneEndpoint"] == {"host": "127.0.0.1", "port": 6443}
    assert cluster["spec"]["controlPlaneEndpoint"] == {"host": "127.0.0.1", "port": 6443}
    md = one(docs, "MachineDeployment")
    assert md["spec"]["template"]["spec"]["bootstrap"] == {"dataSecretName": "gpus-gpu-bootstrap"}
    hgc = one(docs, "HetznerGPUCluster")["spec"]
    assert "controlPlaneLoadBalancer" not in hgc
    assert "controlPlaneEndpoint" not in hgc


CAPH = caph.archive_present


def caph_hcloud_control_planes(tmp_path: Path) -> list[dict[str, Any]]:
    """CAPH v1.1.8's own hetzner-hcloud-control-planes flavor, built with the pinned kustomize and rendered
    with clusterctl, as `clusterctl generate cluster --flavor hetzner-hcloud-control-planes` would."""
    with tarfile.open(CAPH()) as tar:
        tar.extractall(tmp_path, filter="data")
    flavor = (
        tmp_path
        / "cluster-api-provider-hetzner-v1.1.8/templates/cluster-templates/v1beta1/hetzner-hcloud-control-planes"
    )
    built = subprocess.run(
        [str(binaries.ensure_built().kustomize), "build", "--load-restrictor", "LoadRestrictionsNone", str(flavor)],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    template = tmp_path / "caph-template.yaml"
    template.write_text(built)
    env = {
        "HCLOUD_REGION": "fsn1", "SSH_KEY_NAME": "cluster", "HCLOUD_CONTROL_PLANE_MACHINE_TYPE": "cpx31",
        "HCLOUD_WORKER_MACHINE_TYPE": "cpx31", "HCLOUD_IMAGE_NAME": "ubuntu-24.04", "WORKER_MACHINE_COUNT": "0",
        "CONTROL_PLANE_MACHINE_COUNT": "3", "HETZNER_SSH_PUB_PATH": "x", "HETZNER_SSH_PRIV_PATH": "x",
        "HETZNER_ROBOT_USER": "x", "HETZNER_ROBOT_PASSWORD": "x", "HCLOUD_TOKEN": "x",
    }  # fmt: skip
    listed = h.clusterctl(
        ["generate", "cluster", "gpus", "-n", "x", "--from", str(template), "--list-variables"], tmp_path
    )
    env.update({v: "x" for v in re.findall(r"^\s+- ([A-Z][A-Z0-9_]+)", listed, re.M) if v not in env})
    out = h.clusterctl(
        ["generate", "cluster", "gpus", "-n", "team-a", "--kubernetes-version", "v1.36.3", "--from", str(template)],
        tmp_path,
        env,
    )
    return [d for d in yaml.safe_load_all(out) if d]


def test_gpu_workers_join_caphs_own_hcloud_control_planes_cluster(tmp_path: Path) -> None:
    """Issue 32: our flavor beside CAPH's real cluster objects: it names their Cluster, adds nothing CAPH's set
    already has (no second Cluster or endpoint, no clashing name), and uses CAPH's Secrets as CAPH names them."""
    caph = caph_hcloud_control_planes(tmp_path / "caph")
    ours_ = rendered("gpu-workers", tmp_path)
    cluster = one(caph, "Cluster")
    assert cluster["spec"]["infrastructureRef"]["kind"] == "HetznerCluster"
    assert not by_kind(ours_, "Cluster") and not by_kind(ours_, "KubeadmControlPlane")
    hgc = one(ours_, "HetznerGPUCluster")
    assert hgc["spec"]["clusterRef"] == {"name": cluster["metadata"]["name"]}
    assert not {"controlPlaneEndpoint", "controlPlaneLoadBalancer", "failureDomains"} & set(hgc["spec"])
    for md in by_kind(ours_, "MachineDeployment"):
        assert md["spec"]["clusterName"] == md["spec"]["template"]["spec"]["clusterName"] == cluster["metadata"]["name"]
    assert not {(d["kind"], d["metadata"]["name"]) for d in caph} & {(d["kind"], d["metadata"]["name"]) for d in ours_}
    hetzner = one(caph, "HetznerCluster")["spec"]
    assert hgc["spec"]["robotCredentials"]["name"] == hetzner["hetznerSecretRef"]["name"]
    keys = hetzner["hetznerSecretRef"]["key"]
    assert (keys["hetznerRobotUser"], keys["hetznerRobotPassword"]) == ("robot-user", "robot-password")
    rescue = hetzner["sshKeys"]["robotRescueSecretRef"]
    assert hgc["spec"]["sshKeys"]["rescue"]["name"] == rescue["name"]
    assert (rescue["key"]["privateKey"], rescue["key"]["publicKey"]) == ("ssh-privatekey", "ssh-publickey")
    # Its own GPU-less bare-metal group and ours select different hosts: ours are HetznerGPUHosts only.
    assert {d["kind"] for d in caph if "BareMetal" in d["kind"]} <= {
        "HetznerBareMetalMachineTemplate",
        "HetznerBareMetalRemediationTemplate",
    }
