"""Issue 28: the validating webhook has its own Kubernetes client. On the operator's shared pool (16
threads), a burst of the writes it admits could hold every thread past the apiserver's 10 s webhook
timeout, and failurePolicy Fail then refused our kinds' writes. Here the shared pool is full of calls that
never return, and a host validation (which lists hosts) still answers at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
import yaml

from capi_gpu.cli import run
from capi_gpu.controllers import webhook
from capi_gpu.kube import ours
from capi_gpu.runtime.settings import Settings

API = "infrastructure.cluster.x-k8s.io/v1alpha1"


def host(name: str, server: int) -> dict[str, Any]:
    meta = {"name": name, "namespace": "gpu"}
    return {"apiVersion": API, "kind": "HetznerGPUHost", "metadata": meta, "spec": {"serverNumber": server}}


class Stuck:
    """A client whose every call waits until released: the shared pool's threads, all busy."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0

    def list(self, *_: Any) -> list[Any]:
        self.entered += 1
        self.release.wait(30)
        return []


class Hosts:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = list(objs)

    def list(self, *_: Any) -> list[Any]:
        return self.objs


def kubeconfig(tmp: Path) -> str:
    path = tmp / "kubeconfig"
    cluster = {"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_only_a_webhook_gets_its_own_client(tmp_path: Path) -> None:
    assert run.make_deps(kubeconfig(tmp_path), Settings(webhook_port=0)).webhook_kube is None
    deps = run.make_deps(kubeconfig(tmp_path), Settings(webhook_port=9443))
    assert deps.webhook_kube is not None
    assert deps.webhook_kube is not deps.kube and deps.webhook_kube.sync is not deps.kube.sync


async def test_webhook_answers_while_the_shared_pool_is_full(tmp_path: Path) -> None:
    deps = run.make_deps(kubeconfig(tmp_path), Settings(webhook_port=9443))
    stuck = Stuck()
    deps.kube.sync = stuck  # type: ignore[assignment]
    assert deps.webhook_kube is not None
    deps.webhook_kube.sync = Hosts(host("a", 1))  # type: ignore[assignment]
    burst = [asyncio.ensure_future(deps.kube.list(ours("hetznergpuhosts"))) for _ in range(40)]
    try:
        for _ in range(100):
            if stuck.entered >= 16:
                break
            await asyncio.sleep(0.05)
        assert stuck.entered == 16, "the shared pool should be full"
        validate = webhook._handler("HetznerGPUHost")
        memo = SimpleNamespace(deps=deps)
        # A second host for Robot server 1 is refused: the list of hosts came back, within the bound.
        with pytest.raises(kopf.AdmissionError, match="server 1 already has HetznerGPUHost gpu/a"):
            await asyncio.wait_for(validate(body=host("b", 1), old=None, operation="CREATE", memo=memo), 5)
        await asyncio.wait_for(validate(body=host("c", 2), old=None, operation="CREATE", memo=memo), 5)
    finally:
        stuck.release.set()
        await asyncio.gather(*burst)
