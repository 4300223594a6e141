"""A standby host has no consumer; it pauses with the Cluster of the template whose pool it is in. The
template loop records that Cluster in the host's cluster label (on joining the pool, and for hosts put there
before the label existed); the host loop reads it. During clusterctl move a host being prepared for the
pool then stops with the rest of its Cluster's objects instead of carrying on beside its copy."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import NS, FakeKube
from test_host_move_safety import HOST, OS_SECRET, SECRETS, NoSSH, _deps, _host, _host_writes, _ready, _status, _stored

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHost, HostState, Step
from capi_gpu.controllers import host_loop, template_loop
from capi_gpu.kube import Obj


def _standby_host(state: HostState, step: Step | None, label: str | None, ops: tuple[str, ...] = ()) -> Obj:
    status = _status(state, step, ops)
    obj = _host(status, status)
    del obj["spec"]["consumerRef"]
    obj["spec"]["standby"] = {"template": "workers"}
    obj["metadata"]["resourceVersion"] = "7"
    if label:
        obj["metadata"]["labels"] = {domain.CONSUMER_CLUSTER_LABEL: label}
    return obj


def _cluster(paused: bool) -> tuple[str, Obj]:
    return ("clusters", {"metadata": {"name": "dev"}, "spec": {"paused": paused}})


async def test_a_standby_host_being_prepared_writes_only_paused_while_its_templates_cluster_is() -> None:
    host = _standby_host(HostState.STANDBY_PREPARING, Step.CONFIGURE, "dev")
    kube = FakeKube(("hetznergpuhosts", host), *SECRETS, OS_SECRET, _cluster(True))
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    assert _ready(kube)["Paused"] == "True/Paused" and NoSSH.opened == 0
    assert (_stored(kube)["status"]["state"], _stored(kube)["status"]["step"]) == ("StandbyPreparing", "Configure")
    kube.writes.clear()
    await host_loop.reconcile(deps, NS, HOST)
    assert _host_writes(kube) == [] and NoSSH.opened == 0
    kube.objs[("clusters", NS, "dev")]["spec"]["paused"] = False  # resumed: preparation goes on
    await host_loop.reconcile(deps, NS, HOST)
    assert _ready(kube)["Paused"] == "False/NotPaused"


async def test_a_standby_host_with_a_reboot_in_flight_finishes_it_under_block_move() -> None:
    host = _standby_host(HostState.STANDBY_PREPARING, Step.REBOOT_OS, "dev", ("reset-ssh",))
    kube = FakeKube(("hetznergpuhosts", host), *SECRETS, OS_SECRET, _cluster(True))
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert NoSSH.opened == 1 and _ready(kube)["Paused"] == "False/NotPaused"
    assert domain.BLOCK_MOVE_ANNOTATION in _stored(kube)["metadata"]["annotations"]


@pytest.mark.parametrize("label", [None, "other"])
async def test_without_its_clusters_label_or_with_an_unpaused_one_a_standby_host_carries_on(label: str | None) -> None:
    host = _standby_host(HostState.STANDBY_PREPARING, Step.CONFIGURE, label)
    kube = FakeKube(("hetznergpuhosts", host), *SECRETS, OS_SECRET, _cluster(True))
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert _ready(kube)["Paused"] == "False/NotPaused"


def _template() -> Obj:
    meta: dict[str, Any] = {"name": "workers", "generation": 1, "ownerReferences": [{"kind": "Cluster", "name": "dev"}]}
    return {"metadata": meta, "spec": {"template": {"spec": {}}, "standby": {"size": 1}}}


def _available(name: str, number: int, **spec: Any) -> tuple[str, Obj]:
    meta = {"name": name, "resourceVersion": "1"}
    return (
        "hetznergpuhosts",
        {"metadata": meta, "spec": {"serverNumber": number, **spec}, "status": {"state": "Available"}},
    )


def _labels(kube: FakeKube, name: str) -> dict[str, str]:
    return dict(kube.objs[("hetznergpuhosts", NS, name)]["metadata"].get("labels") or {})


async def test_the_template_labels_a_host_it_takes_for_its_pool_and_unlabels_one_it_lets_go() -> None:
    kube = FakeKube(("hetznergpumachinetemplates", _template()), _available("gex-1", 1), _cluster(False))
    deps = _deps(kube)
    await template_loop.reconcile(deps, NS, "workers")
    host = HetznerGPUHost.model_validate(kube.objs[("hetznergpuhosts", NS, "gex-1")])
    assert host.spec.standby is not None and host.spec.standby.template == "workers"
    assert _labels(kube, "gex-1") == {domain.CONSUMER_CLUSTER_LABEL: "dev"}
    kube.objs[("hetznergpumachinetemplates", NS, "workers")]["spec"]["standby"]["size"] = 0
    await template_loop.reconcile(deps, NS, "workers")
    assert kube.objs[("hetznergpuhosts", NS, "gex-1")]["spec"].get("standby") is None
    assert _labels(kube, "gex-1") == {}


async def test_a_pool_host_from_before_the_label_or_back_from_a_release_gets_it() -> None:
    standby = {"standby": {"template": "workers"}}
    kube = FakeKube(("hetznergpumachinetemplates", _template()), _available("gex-1", 1, **standby), _cluster(False))
    kube.objs[("hetznergpuhosts", NS, "gex-1")]["status"]["state"] = "Standby"
    await template_loop.reconcile(_deps(kube), NS, "workers")
    assert _labels(kube, "gex-1") == {domain.CONSUMER_CLUSTER_LABEL: "dev"}
    kube.writes.clear()
    await template_loop.reconcile(_deps(kube), NS, "workers")
    assert [w for w in kube.writes if w[1] == "hetznergpuhosts"] == []  # labelled once


async def test_block_move_is_held_while_any_action_runs_and_dropped_with_its_outcome() -> None:
    """Not only destructive steps: a pass records its action, runs it, then writes the outcome; a pause in
    between would land that write on a paused object and let the other side start the same step."""
    host = _standby_host(HostState.INSPECTING, Step.INSPECT, None)
    kube = FakeKube(("hetznergpuhosts", host), *SECRETS, OS_SECRET)
    await host_loop.reconcile(_deps(kube), NS, HOST)
    marks = [
        (w[4].get("metadata") or {}).get("annotations", {}).get(domain.BLOCK_MOVE_ANNOTATION, "absent")
        for w in _host_writes(kube)
        if isinstance(w[4], dict) and domain.BLOCK_MOVE_ANNOTATION in str(w[4])
    ]
    assert marks == ["", None], _host_writes(kube)
    assert domain.BLOCK_MOVE_ANNOTATION not in _stored(kube)["metadata"]["annotations"]


async def test_a_pool_host_written_since_the_templates_read_is_labelled_next_pass_and_the_status_still_lands() -> None:
    standby = {"standby": {"template": "workers"}}
    kube = FakeKube(("hetznergpumachinetemplates", _template()), _available("gex-1", 1, **standby), _cluster(False))
    kube.objs[("hetznergpuhosts", NS, "gex-1")]["status"]["state"] = "Standby"
    real_list = kube.list

    async def stale_list(res: Any, namespace: str | None = None, **kw: Any) -> list[Obj]:
        items = await real_list(res, namespace, **kw)
        if res.plural == "hetznergpuhosts":  # the host loop writes between the template's read and its patch
            kube.objs[("hetznergpuhosts", NS, "gex-1")]["metadata"]["resourceVersion"] = "99"
        return items

    kube.list = stale_list  # type: ignore[method-assign]
    await template_loop.reconcile(_deps(kube), NS, "workers")
    assert _labels(kube, "gex-1") == {}
    status = kube.objs[("hetznergpumachinetemplates", NS, "workers")].get("status") or {}
    assert status.get("standbyHosts") == 1
    kube.list = real_list  # type: ignore[method-assign]
    await template_loop.reconcile(_deps(kube), NS, "workers")
    assert _labels(kube, "gex-1") == {domain.CONSUMER_CLUSTER_LABEL: "dev"}
