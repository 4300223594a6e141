"""The simulated nodes' pods on the real apiserver: one NVIDIA plugin pod per publishing node (owned by an
existing DaemonSet, recreated when gone, with the label `capi-gpu nodes relayout` selects by default),
deleting it re-enumerates the GPU, and a deleted pod bound to a simulated node is confirmed gone instead of
staying Terminating."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from capi_gpu.kube import NODES, PODS, Kube
from capi_gpu.relayout import Relayout
from capi_gpu.sim import node_pods

pytestmark = pytest.mark.integration


@dataclass
class FakePublisher:
    restarts: int = 0

    def restart(self) -> None:
        self.restarts += 1


@dataclass
class FakeKubelet:
    """What NodePods reads of a SimKubelet: its node, and its publisher once the plugin publishes."""

    node_name: str | None
    publisher: FakePublisher | None = field(default_factory=FakePublisher)


def _until(what: str, fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def node(kube: Kube) -> Iterator[str]:
    name = f"sim-{uuid.uuid4().hex[:6]}"
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    kube.delete(NODES, name)


def _plugin_pods(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in kube.list(PODS, node_pods.PLUGIN_NAMESPACE, label_selector=node_pods.PLUGIN_SELECTOR)
        if p["spec"].get("nodeName") == node
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
    ]


def test_plugin_pod_is_kept_and_its_deletion_re_enumerates(kube: Kube, node: str) -> None:
    kubelet = FakeKubelet(node)
    pods = node_pods.NodePods(kube, lambda: [kubelet], poll_s=0.1).start()
    try:
        first = _until("the plugin pod, Running", lambda: _plugin_pods(kube, node))[0]
        # Owned by a DaemonSet that exists (so drains skip it, and the garbage collector keeps it).
        owner = first["metadata"]["ownerReferences"][0]
        daemonset = kube.get(node_pods.DAEMONSETS, owner["name"], node_pods.PLUGIN_NAMESPACE)
        assert (owner["kind"], owner["uid"]) == ("DaemonSet", daemonset["metadata"]["uid"])
        # The label the relayout command restarts by, so the default selector finds it.
        assert Relayout.plugin_selector.split("=") in [list(kv) for kv in node_pods.PLUGIN_LABELS.items()]
        kube.delete(PODS, first["metadata"]["name"], node_pods.PLUGIN_NAMESPACE)  # as relayout does
        second = _until(
            "a new plugin pod, Running",
            lambda: [p for p in _plugin_pods(kube, node) if p["metadata"]["name"] != first["metadata"]["name"]],
        )[0]
        assert second["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
        assert kubelet.publisher is not None and kubelet.publisher.restarts == 1
        assert pods.restarts[node] == 1
    finally:
        pods.stop()


def test_a_deleted_pod_on_a_simulated_node_goes_away(kube: Kube, namespace: str, node: str) -> None:
    idle = FakeKubelet(node, publisher=None)  # joined, plugin not publishing: no plugin pod
    pods = node_pods.NodePods(kube, lambda: [idle], poll_s=0.1).start()
    try:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "job"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }
        kube.create(PODS, body, namespace)
        kube.delete(PODS, "job", namespace)  # a bound pod: graceful, would stay Terminating without a kubelet
        # confirmed is appended after the delete returned, so it implies the pod is gone, not the reverse.
        _until("the deletion confirmed", lambda: f"{namespace}/job" in pods.confirmed)
        assert kube.get_or_none(PODS, "job", namespace) is None
        assert not _plugin_pods(kube, node)
    finally:
        pods.stop()
