"""Deleting a HetznerGPUCluster deletes the hcloud Load Balancer it created (the hcloud simulator holds none
afterwards) and reports Deleting while it does; a missing token keeps the finalizer with a condition and
an Event instead of leaving a billed Load Balancer behind; clusterctl move's delete never touches it; and
the operator registers the delete handler that does this."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import kopf
import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.controllers import cluster_delete, handlers
from capi_gpu.hetzner import cloud
from capi_gpu.kube import Obj
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim.hcloud import FakeHCloud


@pytest.fixture
def fake() -> Iterator[FakeHCloud]:
    with FakeHCloud() as running:
        yield running


def _hgc(**annotations: str) -> Obj:
    return {
        "metadata": {
            "name": "dev",
            "generation": 2,
            "annotations": annotations,
            "ownerReferences": [{"kind": "Cluster", "name": "dev"}],
        },
        "spec": {
            "robotCredentials": {"name": "robot-credentials"},
            "sshKeys": {"rescue": {"name": "robot-ssh"}},
            "controlPlaneLoadBalancer": {"enabled": True, "tokenRef": {"name": "hcloud-token", "passwordKey": "token"}},
        },
    }


def _world(fake: FakeHCloud, obj: Obj, token: bool = True) -> tuple[FakeKube, Deps, Obj]:
    objs = [("hetznergpuclusters", obj)]
    if token:
        objs.append(
            (
                "secrets",
                {
                    "metadata": {"name": "hcloud-token"},
                    "data": {"token": base64.b64encode(fake.token.encode()).decode()},
                },
            )
        )
    kube = FakeKube(*objs)
    settings = Settings(hcloud_endpoint=fake.url)
    return kube, Deps(kube, settings, None, RobotClients(settings)), kube.objs[("hetznergpuclusters", NS, "dev")]  # type: ignore[arg-type]


async def _create_lb(fake: FakeHCloud) -> None:
    api = cloud.HCloudLoadBalancers(fake.token, api_endpoint=fake.url, poll_interval_s=0.001)
    await api.ensure(cloud.LoadBalancerSpec(name="dev-kube-apiserver", location="fsn1"), ["192.0.2.10"])
    assert len(fake.load_balancers) == 1


def _conds(obj: Obj) -> dict[str, str]:
    return {c["type"]: f"{c['status']}/{c['reason']}" for c in (obj.get("status") or {}).get("conditions") or []}


async def test_deleting_the_cluster_deletes_its_load_balancer_and_says_deleting(fake: FakeHCloud) -> None:
    await _create_lb(fake)
    kube, deps, obj = _world(fake, _hgc())
    assert await cluster_delete.delete(deps, obj) is True
    assert fake.load_balancers == {}
    first = next(w for w in kube.writes if w[3] == "status")  # said before the Load Balancer went
    assert {c["type"]: c["reason"] for c in first[4]["status"]["conditions"]} == {
        "Deleting": "Deleting",
        "Ready": "Deleting",
    }
    assert [m for m, _ in fake.requests].count("DELETE") == 1


async def test_a_missing_token_keeps_the_finalizer_and_says_why(fake: FakeHCloud) -> None:
    await _create_lb(fake)
    kube, deps, obj = _world(fake, _hgc(), token=False)
    assert await cluster_delete.delete(deps, obj) is False
    assert len(fake.load_balancers) == 1
    conds = _conds(kube.objs[("hetznergpuclusters", NS, "dev")])
    assert conds["Deleting"] == "True/Deleting" and conds["LoadBalancerReady"] == "False/LoadBalancerFailed"


async def test_a_move_deletes_nothing(fake: FakeHCloud) -> None:
    await _create_lb(fake)
    before = len(fake.requests)
    kube, deps, obj = _world(fake, _hgc(**{domain.DELETE_FOR_MOVE_ANNOTATION: ""}))
    assert await cluster_delete.delete(deps, obj) is True
    assert len(fake.load_balancers) == 1 and len(fake.requests) == before and kube.writes == []


def test_the_operator_registers_the_cluster_delete_handler() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, Settings(), lambda: None)  # type: ignore[arg-type,return-value]
    ids = {h.id for h in registry._changing.get_all_handlers()}
    assert "cluster-delete" in ids
