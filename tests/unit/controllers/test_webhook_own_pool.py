"""Issue 28: the validating webhook has its own Kubernetes client. On the operator's shared pool (16
threads), a burst of the writes it admits could hold every thread past the apiserver's 10 s webhook
timeout, and failurePolicy Fail then refused our kinds' writes. Here the shared pool is full of calls that
never return, and a host validation (which lists hosts) still answers at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import yaml

from capi_gpu.cli import run
from capi_gpu.controllers import webhook
from capi_gpu.kube import AsyncKube, Kube, ours
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
    """A client that answers at once with ``objs``."""

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


def review(obj: dict[str, Any]) -> dict[str, Any]:
    request = {"uid": "u1", "operation": "CREATE", "object": obj}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_only_a_webhook_port_makes_a_webhook(tmp_path: Path) -> None:
    assert run.make_webhook(kubeconfig(tmp_path), Settings(webhook_port=0)) is None
    assert run.make_webhook(kubeconfig(tmp_path), Settings(webhook_port=9443)) is not None


async def test_webhook_answers_while_the_shared_pool_is_full(tmp_path: Path) -> None:
    deps = run.make_deps(kubeconfig(tmp_path), Settings(webhook_port=9443))
    stuck = Stuck()
    deps.kube.sync = stuck  # type: ignore[assignment]
    # What make_webhook builds: a client of its own (two threads), never the operator's.
    own = AsyncKube(Kube.from_kubeconfig(kubeconfig(tmp_path), pool_size=2), workers=2)
    own.sync = Hosts(host("a", 1))  # type: ignore[assignment]
    burst = [asyncio.ensure_future(deps.kube.list(ours("hetznergpuhosts"))) for _ in range(40)]
    try:
        for _ in range(100):
            if stuck.entered >= 16:
                break
            await asyncio.sleep(0.05)
        assert stuck.entered == 16, "the shared pool should be full"
        # A second host for Robot server 1 is refused: the list of hosts came back, within the bound.
        refused = await asyncio.wait_for(webhook.answer(review(host("b", 1)), "validate-hetznergpuhost", own), 5)
        assert refused["response"]["allowed"] is False
        assert "server 1 already has HetznerGPUHost gpu/a" in refused["response"]["status"]["message"]
        allowed = await asyncio.wait_for(webhook.answer(review(host("c", 2)), "validate-hetznergpuhost", own), 5)
        assert allowed["response"] == {"uid": "u1", "allowed": True}
    finally:
        stuck.release.set()
        await asyncio.gather(*burst)
