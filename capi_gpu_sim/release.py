"""The provider installed as a user installs it: `make release-manifests`' components (through the test-only
overlay config/sim), laid out as a clusterctl local repository, and the pinned `clusterctl init
--infrastructure hetzner-gpu`, which installs cert-manager from its ``cert-manager`` URL setting first.

CAPI core is the one provider installed by other means: the world's control plane runs it (as a process of
its own, with its CRDs applied at start), and ``record_core`` writes the inventory entry `clusterctl init`
would have written for it, so init installs only what is ours and cert-manager. Its repository entry
carries the pinned release's metadata only (init reads the core provider's contract from it).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from capi_gpu import domain
from capi_gpu.kube import CRDS, NAMESPACES, Kube, Res
from capi_gpu_sim import binaries
from capi_gpu_sim.controlplane import ControlPlane

OVERLAY = binaries.REPO / "config" / "sim"
METADATA = binaries.REPO / "config" / "clusterctl" / "metadata.yaml"
VERSION = "v0.1.0"
PROVIDER = "infrastructure-hetzner-gpu"
CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"
PROVIDERS = Res("clusterctl.cluster.x-k8s.io", "v1alpha3", "providers")
CAPI_VERSION = binaries.versions()["CAPI_VERSION"]
CM_VERSION = binaries.versions()["CERT_MANAGER_VERSION"]
SYSTEM_NAMESPACE = "capi-gpu-system"
DEPLOYMENT = "capi-gpu-controller-manager"
INIT_TIMEOUT_S = 300.0


def provider_crd() -> dict[str, Any]:
    """clusterctl's inventory CRD (cmd/clusterctl/config/manifest/clusterctl-api.yaml), schema left open."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "providers.clusterctl.cluster.x-k8s.io",
            "labels": {CLUSTERCTL_LABEL: "", "clusterctl.cluster.x-k8s.io/core": "inventory"},
        },
        "spec": {
            "group": "clusterctl.cluster.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": "Provider", "listKind": "ProviderList", "plural": "providers", "singular": "provider"},
            "versions": [
                {
                    "name": "v1alpha3",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def record_provider(kube: Kube, namespace: str, name: str, provider: str, type_: str, version: str) -> None:
    kube.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube.apply(
        PROVIDERS,
        {
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
            "kind": "Provider",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {CLUSTERCTL_LABEL: "", domain.PROVIDER_LABEL: name},
            },
            "providerName": provider,
            "type": type_,
            "version": version,
        },
        namespace,
    )


def record_core(cp: ControlPlane, kube: Kube) -> None:
    """The world's CAPI core, its CRDs labelled and its inventory entry written as `clusterctl init` would."""
    cp.apply_crds(kube, [provider_crd()])
    for crd in kube.list(CRDS):
        labelled = CLUSTERCTL_LABEL in (crd["metadata"].get("labels") or {})
        if crd["spec"]["group"].endswith("cluster.x-k8s.io") and not labelled:
            kube.patch(CRDS, crd["metadata"]["name"], {"metadata": {"labels": {CLUSTERCTL_LABEL: ""}}})
    record_provider(kube, "capi-system", "cluster-api", "cluster-api", "CoreProvider", CAPI_VERSION)


def components(overlay: Path) -> str:
    bins = binaries.ensure_built()
    done = subprocess.run(
        [str(bins.kustomize), "build", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kustomize build {overlay}: {done.stderr}")
    return done.stdout


def world_overlay(directory: Path, playbook_vars: Path, extra_args: list[str], replicas: int) -> Path:
    """The world's own layer over config/sim: its playbook vars as the ConfigMap, its extra flags, replicas."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "playbook-vars.yaml").write_text(playbook_vars.read_text())
    ops: list[dict[str, Any]] = [{"op": "replace", "path": "/spec/replicas", "value": replicas}]
    ops += [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a} for a in extra_args]
    (directory / "world_patch.yaml").write_text(yaml.safe_dump(ops))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAY, directory)],  # kustomize refuses an absolute root
        "configMapGenerator": [
            {
                "name": "capi-gpu-sim-config",
                "namespace": SYSTEM_NAMESPACE,
                "files": ["playbook-vars.yaml"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
        "patches": [{"path": "world_patch.yaml", "target": {"kind": "Deployment", "name": DEPLOYMENT}}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


def repository(root: Path, components_yaml: str) -> Path:
    """A clusterctl local repository: {provider label}/{version}/{assets}; returns the config file."""
    ours = root / PROVIDER / VERSION
    ours.mkdir(parents=True, exist_ok=True)
    (ours / "infrastructure-components.yaml").write_text(components_yaml)
    (ours / "metadata.yaml").write_text(METADATA.read_text())
    core = root / "cluster-api" / CAPI_VERSION
    core.mkdir(parents=True, exist_ok=True)
    minor = int(CAPI_VERSION.split(".")[1])
    (core / "metadata.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
                "kind": "Metadata",
                "releaseSeries": [{"major": 1, "minor": minor, "contract": "v1beta2"}],
            }
        )
    )
    (core / "core-components.yaml").write_text("")
    cm = root / "cert-manager" / CM_VERSION
    cm.mkdir(parents=True, exist_ok=True)
    (cm / "cert-manager.yaml").write_text((binaries.ensure_cert_manager() / "cert-manager.yaml").read_text())
    config = {
        "providers": [
            {"name": "cluster-api", "type": "CoreProvider", "url": f"file://{core}/core-components.yaml"},
            {
                "name": "hetzner-gpu",
                "type": "InfrastructureProvider",
                "url": f"file://{ours}/infrastructure-components.yaml",
            },
        ],
        "cert-manager": {"url": f"file://{cm}/cert-manager.yaml", "version": CM_VERSION},
    }
    path = root / "clusterctl.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def init(kubeconfig: Path, config: Path, home: Path, variables: Mapping[str, str]) -> tuple[str, float]:
    """`clusterctl init --infrastructure hetzner-gpu:VERSION`; its output and how long it took."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
        **variables,
    }
    argv = [
        str(binaries.ensure_clusterctl()),
        "init",
        "--infrastructure",
        f"hetzner-gpu:{VERSION}",
        "--config",
        str(config),
        "--kubeconfig",
        str(kubeconfig),
        "--wait-providers",
        "--wait-provider-timeout",
        "300",
        "-v",
        "2",
    ]
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=INIT_TIMEOUT_S, check=False)
    took = time.monotonic() - t0
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"clusterctl init exited {done.returncode} after {took:.0f}s:\n{out}")
    return out, took
