"""The workload kubeconfig is data, not code: a ``<cluster>-kubeconfig`` Secret with an exec plugin, an auth
provider, a token file or any file path is refused before the client library sees it (nothing runs, no
daemon starts) and the HetznerGPUCluster says why in ``WorkloadKubeconfigValid``; a CAPI-shaped one (inline
certificates or a token) passes; remediation's Node read goes through the same check."""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from capi_gpu.api import conditions as c
from capi_gpu.api.base import utcnow
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.controllers import remediation_loop
from capi_gpu.kube import AsyncKube, Obj, Res
from capi_gpu.runtime import workload

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def _kubeconfig(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "w", "cluster": cluster or {"server": "https://127.0.0.1:1", "certificate-authority-data": CA}}
        ],
        "users": [{"name": "admin", "user": user}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "admin"}}],
        "current-context": "w",
    }


@pytest.mark.parametrize(
    ("user", "cluster", "flagged"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}}, None, "users[admin].exec"),
        ({"auth-provider": {"name": "gcp", "config": {"cmd-path": "true"}}}, None, "users[admin].auth-provider"),
        ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, None, "users[admin].tokenFile"),
        ({"client-certificate": "/etc/x.crt", "client-key-data": CA}, None, "users[admin].client-certificate"),
        (
            {"token": "t"},
            {"server": "https://x", "certificate-authority": "/etc/ca"},
            "clusters[w].certificate-authority",
        ),
    ],
)
def test_commands_and_file_paths_are_flagged(
    user: dict[str, Any], cluster: dict[str, Any] | None, flagged: str
) -> None:
    assert flagged in workload.unsafe_fields(_kubeconfig(user, cluster))


@pytest.mark.parametrize(
    "user",
    [{"token": "abc"}, {"client-certificate-data": CA, "client-key-data": CA}, {"username": "u", "password": "p"}],
)
def test_inline_credentials_pass(user: dict[str, Any]) -> None:
    assert workload.unsafe_fields(_kubeconfig(user)) == []


class FakeKube:
    """The management cluster as supervise sees it: one kubeconfig Secret, one HetznerGPUCluster."""

    def __init__(self, kubeconfig: dict[str, Any]) -> None:
        value = base64.b64encode(yaml.safe_dump(kubeconfig).encode()).decode()
        self.secret: Obj = {"metadata": {"name": "dev-kubeconfig", "resourceVersion": "1"}, "data": {"value": value}}
        self.hgc: Obj = {
            "metadata": {"name": "dev", "namespace": "gpu", "ownerReferences": [{"kind": "Cluster", "name": "dev"}]},
            "spec": {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "k"}, "os": {"name": "k"}}},
        }
        self.patched = asyncio.Event()

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        return self.secret if name == "dev-kubeconfig" else None

    async def list(self, res: Res, namespace: str | None = None, **_: Any) -> list[Obj]:
        return [self.hgc]

    async def patch(self, res: Res, name: str, body: Obj, namespace: str | None = None, **_: Any) -> Obj:
        self.hgc = {**self.hgc, "status": body["status"]}
        self.patched.set()
        return self.hgc


class Stopped:
    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


async def test_an_exec_plugin_kubeconfig_is_refused_with_a_condition_and_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": ["-c", f"open({str(marker)!r}, 'w').write('x')"],
        "interactiveMode": "Never",
    }
    kube = FakeKube(_kubeconfig({"exec": plugin}))
    deps: Any = SimpleNamespace(kube=kube, clock=utcnow)
    monkeypatch.setattr(workload, "RECHECK", 0.05)
    started: list[AsyncKube] = []

    async def task(client: AsyncKube) -> None:
        started.append(client)

    stopped = Stopped()
    daemon = asyncio.create_task(workload.supervise(deps, "gpu", "dev", "gate", task, stopped, 1, 1))
    try:
        await asyncio.wait_for(kube.patched.wait(), timeout=10)
        await asyncio.sleep(0.2)  # a few more rounds: still nothing may run
    finally:
        stopped.flag = True
        await asyncio.wait_for(daemon, timeout=10)
    cond = c.get(HetznerGPUCluster.model_validate(kube.hgc).status.conditions, c.Type.WORKLOAD_KUBECONFIG_VALID)
    assert cond is not None and cond.status == "False" and cond.reason == c.Reason.KUBECONFIG_REJECTED
    assert "users[admin].exec" in cond.message
    assert not marker.exists() and started == []


async def test_remediation_reads_no_node_through_a_refused_kubeconfig(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": ["-c", f"open({str(marker)!r}, 'w').write('x')"],
        "interactiveMode": "Never",
    }
    deps: Any = SimpleNamespace(kube=FakeKube(_kubeconfig({"exec": plugin})), clock=utcnow)
    assert await remediation_loop._node(deps, "gpu", "dev", "gex-1") is None
    assert not marker.exists()
