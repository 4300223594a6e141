"""Failure domains in host selection: a Machine placed in a failure domain (Machine.spec.failureDomain) gets
only a host whose Robot datacenter is in it (a datacenter, or a location covering its datacenters), and a
Machine whose failure domain no free host matches claims nothing and says so in HostAssociated."""

from __future__ import annotations

import base64

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.api.base import LabelSelector
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec, HetznerGPUHostStatus, HostState
from capi_gpu.controllers import host_pick, machine_loop
from capi_gpu.kube import Obj
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings


def _host(number: int, datacenter: str | None, state: HostState = HostState.AVAILABLE) -> HetznerGPUHost:
    return HetznerGPUHost(
        metadata={"name": f"gex-{number}", "resourceVersion": "1"},
        spec=HetznerGPUHostSpec(server_number=number),
        status=HetznerGPUHostStatus(state=state, datacenter=datacenter),
    )


@pytest.mark.parametrize(
    ("datacenter", "failure_domain", "inside"),
    [
        ("FSN1-DC14", "fsn1-dc14", True),
        ("FSN1-DC14", "fsn1", True),  # a location covers its datacenters
        ("FSN1-DC14", "fsn1-dc1", False),  # not a prefix match inside a name
        ("NBG1-DC3", "fsn1", False),
        (None, "fsn1", False),  # not registered yet: not known to be there
    ],
)
def test_a_datacenter_is_in_a_failure_domain(datacenter: str | None, failure_domain: str, inside: bool) -> None:
    assert host_pick.in_failure_domain(datacenter, failure_domain) is inside


def test_choose_takes_only_hosts_in_the_failure_domain_and_says_why_it_found_none() -> None:
    hosts = [_host(1, "NBG1-DC3"), _host(2, "FSN1-DC14"), _host(3, "FSN1-DC15")]
    pick = host_pick.choose(hosts, LabelSelector(), None, "k", "fsn1-dc15")
    assert pick.host is not None and pick.host.spec.server_number == 3
    assert host_pick.choose(hosts, LabelSelector(), None, "k", None).host.spec.server_number == 1  # type: ignore[union-attr]
    none = host_pick.choose(hosts, LabelSelector(), None, "k", "hel1")
    assert none.host is None and none.failure_domain_only
    assert none.describe() == f"3 {host_pick.OTHER_FAILURE_DOMAIN}"
    busy = host_pick.choose([_host(1, "HEL1-DC2", HostState.PROVISIONED)], LabelSelector(), None, "k", "hel1")
    assert busy.host is None and not busy.failure_domain_only  # nothing free at all: the usual reason


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _world(failure_domain: str) -> FakeKube:
    hgm = {
        "metadata": {
            "name": "w-1",
            "uid": "m-uid",
            "labels": {domain.CLUSTER_NAME_LABEL: "dev"},
            "ownerReferences": [{"kind": "Machine", "name": "w-1"}],
        },
        "spec": {},
    }
    capi = {
        "metadata": {"name": "w-1"},
        "spec": {"failureDomain": failure_domain, "bootstrap": {"dataSecretName": "b"}},
    }
    cluster = {
        "metadata": {"name": "dev"},
        "spec": {},
        "status": {"initialization": {"infrastructureProvisioned": True}},
    }
    boot = {"metadata": {"name": "b"}, "data": {"value": _b64("#cloud-config\nruncmd: [true]\n")}}
    hosts = [
        ("hetznergpuhosts", _host(n, dc).model_dump(by_alias=True, mode="json"))
        for n, dc in ((1, "NBG1-DC3"), (2, "FSN1-DC14"))
    ]
    return FakeKube(("hetznergpumachines", hgm), ("machines", capi), ("clusters", cluster), ("secrets", boot), *hosts)


def _deps(kube: FakeKube) -> Deps:
    settings = Settings()
    return Deps(kube, settings, None, RobotClients(settings))  # type: ignore[arg-type]


def _condition(obj: Obj, type_: str) -> dict[str, str]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


async def test_a_machine_claims_a_host_in_its_failure_domain() -> None:
    kube = _world("fsn1")
    await machine_loop.reconcile(_deps(kube), NS, "w-1")
    claimed = {n: o["spec"].get("consumerRef") for (p, _, n), o in kube.objs.items() if p == "hetznergpuhosts"}
    assert claimed["gex-1"] is None and claimed["gex-2"]["name"] == "w-1"


async def test_a_machine_whose_failure_domain_has_no_free_host_waits_and_says_so() -> None:
    kube = _world("hel1-dc2")
    await machine_loop.reconcile(_deps(kube), NS, "w-1")
    assert all(o["spec"].get("consumerRef") is None for (p, _, _n), o in kube.objs.items() if p == "hetznergpuhosts")
    cond = _condition(kube.objs[("hetznergpumachines", NS, "w-1")], "HostAssociated")
    assert (cond["status"], cond["reason"]) == ("False", machine_loop.NO_HOST_IN_FAILURE_DOMAIN)
    assert "hel1-dc2" in cond["message"] and "2 in another failure domain" in cond["message"]


async def test_a_claim_records_the_consumers_cluster_on_the_host_and_the_release_removes_it() -> None:
    """The label lets a host find its paused Cluster while clusterctl move has no consumer machine for it."""
    kube = _world("fsn1")
    deps = _deps(kube)
    await machine_loop.reconcile(deps, NS, "w-1")
    host = kube.objs[("hetznergpuhosts", NS, "gex-2")]
    assert host["metadata"]["labels"][domain.CONSUMER_CLUSTER_LABEL] == "dev"
    machine = kube.objs[("hetznergpumachines", NS, "w-1")]
    machine["metadata"].setdefault("annotations", {})[domain.ANNOTATION_HOST] = "gex-2"
    assert await machine_loop.release(deps, NS, "w-1", machine) is False
    host = kube.objs[("hetznergpuhosts", NS, "gex-2")]
    assert host["spec"].get("consumerRef") is None
    assert domain.CONSUMER_CLUSTER_LABEL not in (host["metadata"].get("labels") or {})


def test_a_paused_host_is_never_claimed_a_machine_would_wait_on_it() -> None:
    paused = _host(1, "FSN1-DC14")
    paused.metadata["annotations"] = {domain.PAUSED_ANNOTATION: ""}  # e.g. during capi-gpu image bake
    pick = host_pick.choose([paused, _host(2, "FSN1-DC14")], LabelSelector(), None, "k")
    assert pick.host is not None and pick.host.spec.server_number == 2
    alone = host_pick.choose([paused], LabelSelector(), None, "k")
    assert alone.host is None and alone.describe() == "1 paused"
