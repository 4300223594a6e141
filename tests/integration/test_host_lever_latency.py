"""The host levers on the real apiserver, through kopf itself: adding ``reinspect`` or removing
``permanent-error`` (annotations in our domain) wakes the host's loop within 2 s, with the operator's own
registrations and kopf settings (``handlers.register``). kopf drops every annotation under its progress
prefix from the diff it hands to ``on.update``; with that prefix on our domain, no lever ever fired."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from capi_gpu import domain
from capi_gpu.cli.run import make_deps
from capi_gpu.controllers import handlers
from capi_gpu.kube import Kube, ours
from capi_gpu.runtime.deps import Deps, Wakeups
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration

HOSTS = ours("hetznergpuhosts")
LIMIT_S = 2.0
HOST = "gex-lever"


class Recorded(Wakeups):
    """The loops' wake-ups, each with the monotonic time it came."""

    def __init__(self) -> None:
        super().__init__()
        self.woken: list[tuple[str, str, str, float]] = []

    def wake(self, kind: str, namespace: str, name: str) -> None:
        self.woken.append((kind, namespace, name, time.monotonic()))
        super().wake(kind, namespace, name)


@contextlib.asynccontextmanager
async def operator(kubeconfig: Path, namespace: str, tmp: Path) -> AsyncIterator[Deps]:
    """The operator's kopf registrations, run in this loop on one namespace, as ``capi-gpu run`` runs them."""
    settings = Settings(namespace=namespace, gate=False, addons=False, artifacts_dir=tmp)
    deps = make_deps(str(kubeconfig), settings)
    deps.wakeups = Recorded()
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings, lambda: deps)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(registry=registry, namespaces=[namespace], standalone=True, stop_flag=stop, ready_flag=ready)
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield deps
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def _latency(deps: Deps, namespace: str, since: float) -> float | None:
    """Seconds from ``since`` to the host's first wake-up after it; None if none came in 5x the limit."""
    woken = deps.wakeups
    assert isinstance(woken, Recorded)
    deadline = since + 5 * LIMIT_S
    while time.monotonic() < deadline:
        hits = [t for kind, ns, name, t in woken.woken if (kind, ns, name) == ("host", namespace, HOST) and t >= since]
        if hits:
            return hits[0] - since
        await asyncio.sleep(0.05)
    return None


async def _seen_by_kopf(kube: Kube, namespace: str) -> None:
    """The host loop has made its first pass (its Ready condition), so kopf holds the host's diff base."""
    for _ in range(300):
        obj = await asyncio.to_thread(kube.get, HOSTS, HOST, namespace)
        if (obj.get("status") or {}).get("conditions"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the host loop never reported on {namespace}/{HOST}")


async def _annotate(kube: Kube, namespace: str, key: str, value: str | None) -> float:
    """Patch one annotation (None removes it); returns when the patch was sent."""
    sent = time.monotonic()
    await asyncio.to_thread(kube.patch, HOSTS, HOST, {"metadata": {"annotations": {key: value}}}, namespace)
    return sent


async def test_each_lever_wakes_the_host_loop_within_two_seconds(
    kube: Kube, control_plane: ControlPlane, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    host = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUHost",
        "metadata": {"name": HOST, "annotations": {domain.ANNOTATION_PERMANENT_ERROR: "true"}},
        "spec": {"serverNumber": 4242},  # no Robot Secret: the loop waits for one and polls slowly
    }
    kube.create(HOSTS, host, namespace)
    async with operator(control_plane.kubeconfig, namespace, tmp_path) as deps:
        await _seen_by_kopf(kube, namespace)
        latencies = {}
        for lever, (key, value) in {
            "reinspect added": (domain.ANNOTATION_REINSPECT, "true"),
            "permanent-error removed": (domain.ANNOTATION_PERMANENT_ERROR, None),
        }.items():
            await asyncio.sleep(0.5)  # the wake-ups of earlier writes are behind us
            latencies[lever] = await _latency(deps, namespace, await _annotate(kube, namespace, key, value))
        print(f"lever latency (s): {latencies}")
    assert all(v is not None and v < LIMIT_S for v in latencies.values()), latencies
