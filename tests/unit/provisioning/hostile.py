"""Helpers of the hostile-field property test (``test_hostile_fields.py``): the leaves of every spec kind's
pydantic model, one full sample per kind that holds every leaf, the payloads, and the sinks each accepted
value is driven through. docs/security-fields.md is written by ``python tests/unit/provisioning/hostile_sinks.py``."""

from __future__ import annotations

import copy
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from capi_gpu.api import kinds

MARK = "PWNED29"
"""In every payload: a sink output that carries it got the value; a file of that name is the breach."""
MARKER_DIR = "/tmp/capi-gpu-hostile"
"""Fixed, so every payload has the same length in every run and the table does not depend on pytest's tmp."""
API = "infrastructure.cluster.x-k8s.io/v1alpha1"


def payloads(port: int) -> dict[str, str]:
    """Each class the issue names; ``MARKER_DIR`` gets a file if anything runs one. ``port`` is an ephemeral
    port (five digits on Linux, 32768-60999), so lengths don't vary either."""
    touch = f"touch {MARKER_DIR}/{MARK}"
    return {
        "jinja-expr": f"{{{{ lookup('pipe', '{touch}') }}}}",
        "jinja-stmt": f"{{% set x = lookup('pipe', '{touch}') %}}{MARK}",
        "shell": f"x; {touch}; `{touch}` $({touch}) | {touch} &",
        "newline-yaml": f"x\n{MARK}: true\nruncmd: [[sh, -c, '{touch}']]",
        "path": f"../../../../tmp/{MARK}/../etc/passwd",
        "url-loopback": f"http://127.0.0.1:{port}/{MARK}",
        "url-metadata": f"http://169.254.169.254/latest/meta-data/{MARK}",
    }


# --- the leaves of the models -------------------------------------------------------------------------


def leaves(model: type[BaseModel], prefix: str = "spec") -> Iterator[str]:
    """Every string a user writes under ``prefix``: ``[]`` an item of a list, ``{}`` a map's values,
    ``{key}`` its keys. Enums and Literals are closed sets, not strings."""
    for name, f in model.model_fields.items():
        yield from _leaf(f.annotation, f"{prefix}.{f.alias or name}")


def _leaf(t: Any, path: str) -> Iterator[str]:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        yield from _leaf(args[0], path)
    elif origin in (typing.Union, types.UnionType):
        for a in args:
            yield from _leaf(a, path)
    elif origin in (list, tuple):
        yield from _leaf(args[0], path + "[]")
    elif origin is dict:
        yield path + "{key}"
        yield from _leaf(args[1], path + "{}")
    elif isinstance(t, type) and issubclass(t, BaseModel):
        yield from leaves(t, path)
    elif t is str:
        yield path


def spec_leaves(kind: kinds.Kind) -> list[str]:
    spec = kind.model.model_fields["spec"].annotation
    assert isinstance(spec, type) and issubclass(spec, BaseModel)
    return list(dict.fromkeys(leaves(spec)))


# --- samples that hold every leaf ---------------------------------------------------------------------

_KEY = "ssh-privatekey"
_CLUSTER_SPEC: dict[str, Any] = {
    # The model alone: clusterRef beside an endpoint, which CEL refuses on the apiserver, is fine for this.
    "clusterRef": {"name": "caph"},
    "controlPlaneEndpoint": {"host": "203.0.113.10", "port": 6443},
    "robotCredentials": {"name": "robot", "userKey": "robot-user", "passwordKey": "robot-password"},
    "sshKeys": {
        "rescue": {"name": "ssh", "robotKeyName": "capi", "privateKeyKey": _KEY, "publicKeyKey": "ssh-publickey"},
        "os": {"name": "ssh", "robotKeyName": "capi", "privateKeyKey": _KEY, "publicKeyKey": "ssh-publickey"},
    },
    "controlPlaneLoadBalancer": {
        "name": "lb",
        "type": "lb11",
        "location": "fsn1",
        "tokenRef": {"name": "hcloud", "userKey": "u", "passwordKey": "token"},
    },
    "failureDomains": ["fsn1"],
    "addons": {
        "draDriver": {
            "chartVersion": "0.4.1",
            "chartRef": "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu",
            "kubeletPluginNamespace": "nvidia-dra-driver-gpu",
            "kubeletPluginSelector": "app=plugin",
            "pluginMaxUnavailable": "25%",
        },
        "claimNamespaces": ["default"],
    },
    "privateNetwork": {
        "vswitch": {"vlan": 4000, "name": "gpu-net"},
        "subnet": "10.0.1.0/24",
        "addresses": {"start": "10.0.1.10", "end": "10.0.1.200"},
        "routes": ["10.0.0.0/16"],
    },
}
_IMAGE = {
    "imagePath": "/root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.zst",
    "partitions": [
        {"mount": "/boot", "fileSystem": "ext4", "size": "1024M"},
        {"mount": "/", "fileSystem": "ext4", "size": "all"},
    ],
    "postInstallScript": "echo hello",
}
_GPU_PRESET = {"model": "rtx-pro-6000", "driverBranch": "580", "layout": {"preset": "all-1g.24gb"}}
_GPU_PROFILES = {"model": "rtx-pro-6000", "driverBranch": "580", "layout": {"profiles": {"1g.24gb": 2}}}
_META = {"labels": {"team": "a"}, "annotations": {"note": "x"}}


def _machine_spec(gpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "providerID": "hrobot://1234567",
        "hostSelector": {
            "matchLabels": {"pool": "gpu"},
            "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["rtx"]}],
        },
        "installImage": copy.deepcopy(_IMAGE),
        "gpu": copy.deepcopy(gpu),
        "kubernetesVersion": "v1.36.3",
        "image": {"url": "https://images.example.com/gpu/node-580.tar.zst", "sha256": "0" * 64},
    }


def _host_spec(gpu: dict[str, Any], hints: dict[str, Any]) -> dict[str, Any]:
    ref = {"apiVersion": API, "kind": "HetznerGPUMachine", "name": "m", "namespace": "a", "uid": "u-1"}
    image = copy.deepcopy(_IMAGE) | ({"swraid": 0} if "wwn" in hints else {})
    standby = {"installImage": image, "gpu": copy.deepcopy(gpu), "kubernetesVersion": "v1.36.3", "template": "t"}
    return {
        "serverNumber": 1234567,
        "robot": {"credentialsSecret": "robot", "sshKeySecret": "ssh"},
        "description": "rack 3",
        "rootDeviceHints": hints,
        "standby": standby,
        "consumerRef": ref,
    }


WWN_A, WWN_B = "0x5000c500a1b2c3d4", "0x5000c500a1b2c3d5"


def samples(kind: str) -> list[dict[str, Any]]:
    """Valid objects of ``kind``; together they hold every leaf (a test checks that)."""

    def obj(spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": API,
            "kind": kind,
            "metadata": {"name": "x", "namespace": "a", "uid": "u-9"},
            "spec": spec,
        }

    def tmpl(spec: dict[str, Any]) -> dict[str, Any]:
        return obj({"template": {"metadata": copy.deepcopy(_META), "spec": spec}})

    match kind:
        case "HetznerGPUCluster":
            return [obj(copy.deepcopy(_CLUSTER_SPEC))]
        case "HetznerGPUClusterTemplate":
            return [tmpl(copy.deepcopy(_CLUSTER_SPEC))]
        case "HetznerGPUMachine":
            return [obj(_machine_spec(_GPU_PRESET)), obj(_machine_spec(_GPU_PROFILES))]
        case "HetznerGPUMachineTemplate":
            return [tmpl(_machine_spec(_GPU_PRESET)), tmpl(_machine_spec(_GPU_PROFILES))]
        case "HetznerGPUHost":
            return [
                obj(_host_spec(_GPU_PRESET, {"wwn": WWN_A})),
                obj(_host_spec(_GPU_PROFILES, {"raidWWNs": [WWN_A, WWN_B]})),
            ]
        case "HetznerGPURemediation":
            return [obj({"strategy": {"type": "Reboot"}})]
        case "HetznerGPURemediationTemplate":
            return [tmpl({"strategy": {"type": "Reboot"}})]
    raise AssertionError(f"no sample for {kind}")


# --- paths into an object -----------------------------------------------------------------------------

_STEP = re.compile(r"\.([A-Za-z0-9]+)|(\[\])|(\{key\})|(\{\})")


@dataclass(frozen=True)
class Slot:
    """One place a string sits in one object: set it, or find it."""

    leaf: str
    route: tuple[str | int, ...]
    is_key: bool = False


def slots(doc: dict[str, Any], leaf: str) -> list[Slot]:
    """Where ``leaf`` occurs in ``doc`` (every list item and map entry)."""
    found: list[Slot] = []

    def go(node: Any, steps: list[str], route: tuple[str | int, ...]) -> None:
        if not steps:
            if isinstance(node, str):
                found.append(Slot(leaf, route))
            return
        step, rest = steps[0], steps[1:]
        if step == "[]" and isinstance(node, list):
            for i, item in enumerate(node):
                go(item, rest, (*route, i))
        elif step == "{key}" and isinstance(node, dict):
            found.extend(Slot(leaf, (*route, k), is_key=True) for k in node)
        elif step == "{}" and isinstance(node, dict):
            for k, v in node.items():
                go(v, rest, (*route, k))
        elif isinstance(node, dict) and step in node:
            go(node[step], rest, (*route, step))

    parts = [m.group(1) or m.group(2) or m.group(3) or m.group(4) for m in _STEP.finditer(leaf.removeprefix("spec"))]
    go(doc["spec"], parts, ("spec",))
    return found


def put(doc: dict[str, Any], slot: Slot, value: str) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at ``slot`` (a map key renamed, keeping its value)."""
    out = copy.deepcopy(doc)
    node: Any = out
    for step in slot.route[:-1]:
        node = node[step]
    last = slot.route[-1]
    if slot.is_key:
        node[value] = node.pop(last)
    else:
        node[last] = value
    return out
