"""One pause rule for every loop: the Cluster's spec.paused, the paused annotation on the Cluster, or the
paused annotation on the object reconciled. The same table runs through the pure rule and every place a
loop asks (a claimed host through the Cluster recorded at its claim, a standby host through its pool's
Cluster, a host through its claiming machine, the machine loop, the per-object check of the other loops)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.controllers import host_context, host_move, machine_loop
from capi_gpu.kube import CAPI_CLUSTERS, Obj
from capi_gpu.runtime import pause
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

# (Cluster.spec.paused, annotation on the Cluster, annotation on the object) -> paused
TABLE = [
    (False, False, False, False),
    (True, False, False, True),
    (False, True, False, True),
    (False, False, True, True),
    (True, True, True, True),
]
NO_CLUSTER = None  # the Cluster named is not there (yet): only the object's own annotation counts


def _ann(on: bool) -> dict[str, str]:
    return {domain.PAUSED_ANNOTATION: ""} if on else {}


def _cluster(spec_paused: bool, annotated: bool) -> Obj:
    return {
        "metadata": {"name": "dev", "namespace": NS, "annotations": _ann(annotated)},
        "spec": {"paused": spec_paused},
    }


def _deps(kube: FakeKube) -> Deps:
    settings = Settings(robot_url="http://127.0.0.1:9")
    return Deps(kube, settings, None, RobotClients(settings))  # type: ignore[arg-type]


def _host(annotated: bool, **spec: Any) -> Obj:
    labels = {domain.CONSUMER_CLUSTER_LABEL: "dev"}
    return {
        "metadata": {"name": "gex-1", "namespace": NS, "labels": labels, "annotations": _ann(annotated)},
        "spec": spec,
    }


def _machine(annotated: bool) -> Obj:
    labels = {domain.CLUSTER_NAME_LABEL: "dev"}
    return {"metadata": {"name": "w-1", "namespace": NS, "labels": labels, "annotations": _ann(annotated)}, "spec": {}}


Ask = Callable[[FakeKube, bool], Awaitable[bool]]


async def _claimed_host(kube: FakeKube, annotated: bool) -> bool:
    host = _host(annotated, consumerRef={"name": "w-1"})
    return host_move.paused(host) or await host_context.recorded_cluster_paused(_deps(kube), host)


async def _standby_host(kube: FakeKube, annotated: bool) -> bool:
    host = _host(annotated, standby={"template": "workers"})
    return host_move.paused(host) or await host_context.standby_cluster_paused(_deps(kube), host)


async def _consumer(kube: FakeKube, annotated: bool) -> bool:
    return await host_context._consumer_paused(_deps(kube), _machine(annotated), NS)


async def _machine_loop(kube: FakeKube, annotated: bool) -> bool:
    obj = _machine(annotated)
    cluster = await kube.get_or_none(CAPI_CLUSTERS, "dev", NS)
    scope = machine_loop.Scope(obj, HetznerGPUMachine.model_validate(obj), NS, "w-1", cluster=cluster)
    return machine_loop.paused(scope)


async def _other_loops(kube: FakeKube, annotated: bool) -> bool:
    return await pause.paused(_deps(kube), NS, _machine(annotated))


ASKS: dict[str, Ask] = {
    "claimed host": _claimed_host,
    "standby host": _standby_host,
    "consumer machine": _consumer,
    "machine loop": _machine_loop,
    "other loops": _other_loops,
}


@pytest.mark.parametrize(("spec_paused", "cluster_ann", "obj_ann", "expected"), TABLE)
def test_the_pure_rule(spec_paused: bool, cluster_ann: bool, obj_ann: bool, expected: bool) -> None:
    assert pause.is_paused(_cluster(spec_paused, cluster_ann), {"metadata": {"annotations": _ann(obj_ann)}}) is expected


@pytest.mark.parametrize("obj_ann", [False, True])
def test_without_a_cluster_only_the_objects_annotation_counts(obj_ann: bool) -> None:
    assert pause.is_paused(NO_CLUSTER, {"metadata": {"annotations": _ann(obj_ann)}}) is obj_ann


@pytest.mark.parametrize("where", list(ASKS))
@pytest.mark.parametrize(("spec_paused", "cluster_ann", "obj_ann", "expected"), TABLE)
async def test_every_loop_asks_the_same_rule(
    where: str, spec_paused: bool, cluster_ann: bool, obj_ann: bool, expected: bool
) -> None:
    kube = FakeKube(("clusters", _cluster(spec_paused, cluster_ann)))
    assert await ASKS[where](kube, obj_ann) is expected
