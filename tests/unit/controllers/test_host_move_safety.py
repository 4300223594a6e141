"""A host as clusterctl move leaves it on the target (created without status, its consumer created later with
a new uid, its OS host key Secret maybe later still) never touches its server: it gets its status back from
the snapshot as far as Robot's address and the owned pinned key's Secret confirm it (a forged ipv4 or
hostKeys.os, or a server Robot does not know, drops it and the host registers again, never connecting to the
forged address; a Robot that does not answer restores nothing yet), waits while its consumer is missing, refreshes a consumer uid that changed, waits for a pinned
key's Secret instead of minting a new key; and pause, through the host's own annotation or its consumer's
Cluster, stops every write but the Paused condition, unless a destructive step is open (block-move)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHostStatus, HostKeys, HostState, Operation, Step
from capi_gpu.controllers import host_loop
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.hetzner import models
from capi_gpu.kube import Obj
from capi_gpu.provisioning import hostkeys, move, ssh
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

HOST, MACHINE = "gex-1", "workers-abc12"
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
OS_KEY = hostkeys.generate(comment=HOST)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class NoSSH:
    """Every session counted; none connects (the server must not be needed to decide anything here)."""

    opened = 0
    addresses: ClassVar[list[str]] = []

    def __init__(self, endpoint: ssh.Endpoint, creds: ssh.Credentials) -> None:
        type(self).opened += 1
        type(self).addresses.append(endpoint.host)

    def hostname(self) -> str:
        raise ssh.ConnectTimeout("192.0.2.10", "no server in a unit test")

    def close(self) -> None:
        pass


@dataclass
class FixedRobots(RobotClients):
    """The real clients (on a refused URL: every other call fails as an unreachable Robot does), except that
    the server list knows server 1 at ``ip`` (None: not in the account); ``answers=False``: Robot is down."""

    ip: str | None = "192.0.2.10"
    answers: bool = True

    async def get(self, kube: Any, namespace: str, secret_name: str) -> Any:
        client = await super().get(kube, namespace, secret_name)
        if not self.answers:
            return client

        async def cached_server(number: int) -> models.Server:
            if self.ip is None:
                raise robot_errors.RobotNotFound(404, "SERVER_NOT_FOUND", f"server {number} not in account")
            return models.Server(server_number=number, server_name=HOST, server_ip=self.ip, status="ready")

        client.cached_server = cached_server
        return client


def _status(state: HostState, step: Step | None = None, ops: tuple[str, ...] = ()) -> HetznerGPUHostStatus:
    return HetznerGPUHostStatus(
        state=state,
        step=step,
        step_started_at=T0 - timedelta(seconds=30),
        ipv4="192.0.2.10",
        server_name="gex-1",
        host_keys=HostKeys(os=OS_KEY.public),
        operations=[Operation(name=n, requested_at=T0 - timedelta(seconds=20), outcome="Sent") for n in ops],
    )


def _host(status: HetznerGPUHostStatus | None, snapshot: HetznerGPUHostStatus | None, **annotations: str) -> Obj:
    ann = dict(annotations)
    if snapshot is not None:
        ann[domain.ANNOTATION_STATUS] = move.snapshot(snapshot)
    obj: Obj = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUHost",
        "metadata": {"name": HOST, "uid": "host-uid-target", "annotations": ann},
        "spec": {
            "serverNumber": 1,
            "consumerRef": {
                "apiVersion": domain.API_VERSION,
                "kind": "HetznerGPUMachine",
                "name": MACHINE,
                "namespace": NS,
                "uid": "machine-uid-source",
            },
        },
    }
    if status is not None:
        obj["status"] = status.model_dump(by_alias=True, mode="json")
    return obj


def _secret(name: str, **data: str) -> Obj:
    return {"metadata": {"name": name}, "data": {k.replace("_", "-"): _b64(v) for k, v in data.items()}}


SECRETS = [
    ("secrets", _secret("robot-credentials", robot_user="u", robot_password="p")),
    ("secrets", _secret("robot-ssh", ssh_privatekey="not-used", ssh_publickey="not-used")),
]
OS_SECRET = (
    "secrets",
    {
        **_secret(f"{HOST}-os-hostkey", ssh_host_privatekey=OS_KEY.private, ssh_host_publickey=OS_KEY.public),
        "metadata": {  # as clusterctl move recreates it: owned by the host's new uid
            "name": f"{HOST}-os-hostkey",
            "ownerReferences": [
                {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUHost", "name": HOST, "uid": "host-uid-target"}
            ],
        },
    },
)


def _machine(uid: str = "machine-uid-target", **annotations: str) -> tuple[str, Obj]:
    return (
        "hetznergpumachines",
        {
            "metadata": {
                "name": MACHINE,
                "uid": uid,
                "labels": {domain.CLUSTER_NAME_LABEL: "dev"},
                "annotations": {domain.ANNOTATION_HOST: HOST, **annotations},
                "ownerReferences": [{"kind": "Machine", "name": MACHINE}],
            },
            "spec": {},
        },
    )


def _cluster(paused: bool) -> tuple[str, Obj]:
    return ("clusters", {"metadata": {"name": "dev"}, "spec": {"paused": paused}})


def _deps(kube: FakeKube, robots: FixedRobots | None = None) -> Deps:
    NoSSH.opened, NoSSH.addresses = 0, []
    settings = Settings(robot_url="http://127.0.0.1:9")
    robots = robots or FixedRobots(settings)
    return Deps(kube, settings, None, robots, clock=lambda: T0, shell_factory=NoSSH)  # type: ignore[arg-type]


def _stored(kube: FakeKube) -> Obj:
    return kube.objs[("hetznergpuhosts", NS, HOST)]


def _ready(kube: FakeKube) -> dict[str, str]:
    conds = (_stored(kube).get("status") or {}).get("conditions") or []
    return {c["type"]: f"{c['status']}/{c['reason']}" for c in conds}


def _host_writes(kube: FakeKube) -> list[tuple[str, str, str, str | None, object]]:
    return [w for w in kube.writes if w[1] == "hetznergpuhosts"]


async def test_a_moved_provisioned_host_whose_machine_is_not_there_yet_is_restored_and_waits() -> None:
    kube = FakeKube(("hetznergpuhosts", _host(None, _status(HostState.PROVISIONED))), *SECRETS, OS_SECRET)
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    status = _stored(kube)["status"]
    assert (status["state"], status.get("operations", [])) == ("Provisioned", [])
    assert _ready(kube)["Ready"] == f"False/{move.Reason.CONSUMER_MISSING}"
    assert NoSSH.opened == 0
    assert not [w for w in kube.writes if w[0] == "create"]  # no new OS host key
    await host_loop.reconcile(deps, NS, HOST)  # and again: still nothing
    assert _stored(kube)["status"]["state"] == "Provisioned" and NoSSH.opened == 0


@pytest.mark.parametrize(
    "status",
    [
        _status(HostState.REGISTERING),  # no snapshot: what the old controller left
        _status(HostState.AVAILABLE),
        _status(HostState.PROVISIONING, Step.CONFIGURE),
    ],
)
async def test_a_host_whose_consumer_does_not_exist_never_inspects_rescues_or_resets(
    status: HetznerGPUHostStatus,
) -> None:
    kube = FakeKube(("hetznergpuhosts", _host(status, None)), *SECRETS, OS_SECRET)
    await host_loop.reconcile(_deps(kube), NS, HOST)
    after = _stored(kube)["status"]
    assert (after["state"], after.get("step"), after.get("operations", [])) == (
        status.state.value,
        status.step.value if status.step else None,
        [],
    )
    assert _ready(kube)["Ready"] == f"False/{move.Reason.CONSUMER_MISSING}"
    assert NoSSH.opened == 0


async def test_a_consumer_recreated_with_a_new_uid_is_refreshed_and_the_host_stays_provisioned() -> None:
    kube = FakeKube(
        ("hetznergpuhosts", _host(None, _status(HostState.PROVISIONED))),
        *SECRETS,
        OS_SECRET,
        _machine(),
        _cluster(False),
    )
    await host_loop.reconcile(_deps(kube), NS, HOST)
    host = _stored(kube)
    assert host["spec"]["consumerRef"]["uid"] == "machine-uid-target"
    assert (host["status"]["state"], _ready(kube)["Ready"]) == ("Provisioned", "True/Provisioned")
    assert NoSSH.opened == 0


async def test_a_pinned_key_whose_secret_has_not_arrived_is_waited_for_never_replaced() -> None:
    kube = FakeKube(
        ("hetznergpuhosts", _host(None, _status(HostState.PROVISIONED))), *SECRETS, _machine(), _cluster(False)
    )
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert not [w for w in kube.writes if w[0] == "create"]
    assert _ready(kube)["Ready"] == f"False/{move.Reason.OS_HOST_KEY_MISSING}"
    assert _stored(kube)["status"]["hostKeys"]["os"] == OS_KEY.public


async def test_an_unreadable_snapshot_writes_a_condition_and_touches_nothing() -> None:
    host = _host(None, None, **{domain.ANNOTATION_STATUS: '{"state": "Dancing"}'})
    kube = FakeKube(("hetznergpuhosts", host), *SECRETS, OS_SECRET, _machine(), _cluster(False))
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert "state" not in _stored(kube)["status"]  # still "arrived without status": never a fresh Registering
    assert _ready(kube)["Ready"] == f"False/{move.Reason.STATUS_SNAPSHOT_INVALID}"
    assert NoSSH.opened == 0


@pytest.mark.parametrize(
    ("host_annotations", "cluster_paused", "machine_annotations"),
    [
        ({domain.PAUSED_ANNOTATION: ""}, False, {}),
        ({}, True, {}),
        ({}, False, {domain.PAUSED_ANNOTATION: ""}),
    ],
    ids=["host annotation", "Cluster.spec.paused", "consumer annotation"],
)
async def test_a_paused_host_writes_only_its_paused_condition_and_drops_block_move(
    host_annotations: dict[str, str], cluster_paused: bool, machine_annotations: dict[str, str]
) -> None:
    status = _status(HostState.PROVISIONING, Step.CONFIGURE)
    host = _host(status, status, **host_annotations, **{domain.BLOCK_MOVE_ANNOTATION: ""})
    kube = FakeKube(
        ("hetznergpuhosts", host), *SECRETS, OS_SECRET, _machine("machine-uid-source", **machine_annotations),
        _cluster(cluster_paused),
    )  # fmt: skip
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    assert _ready(kube)["Paused"] == "True/Paused"
    assert domain.BLOCK_MOVE_ANNOTATION not in _stored(kube)["metadata"]["annotations"]
    assert _stored(kube)["status"]["state"] == "Provisioning" and _stored(kube)["status"]["step"] == "Configure"
    kube.writes.clear()
    await host_loop.reconcile(deps, NS, HOST)
    assert _host_writes(kube) == [] and NoSSH.opened == 0  # paused: not one more write


async def test_a_paused_host_with_a_destructive_step_open_finishes_it_under_block_move() -> None:
    status = _status(HostState.PROVISIONING, Step.REBOOT_OS, ("reset-ssh",))
    kube = FakeKube(
        ("hetznergpuhosts", _host(status, None)), *SECRETS, OS_SECRET, _machine("machine-uid-source"), _cluster(True)
    )
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert NoSSH.opened == 1  # still watching the reboot it sent
    assert _ready(kube)["Paused"] == "False/NotPaused"
    annotations = _stored(kube)["metadata"]["annotations"]
    assert domain.BLOCK_MOVE_ANNOTATION in annotations
    assert move.restore(annotations[domain.ANNOTATION_STATUS]).operations[-1].name == "reset-ssh"


async def test_an_unpaused_host_says_not_paused_and_carries_its_snapshot() -> None:
    status = _status(HostState.PROVISIONED)
    kube = FakeKube(
        ("hetznergpuhosts", _host(status, None)), *SECRETS, OS_SECRET, _machine("machine-uid-source"), _cluster(False)
    )
    await host_loop.reconcile(_deps(kube), NS, HOST)
    assert _ready(kube)["Paused"] == "False/NotPaused"
    writes = _host_writes(kube)
    snap = next(i for i, w in enumerate(writes) if domain.ANNOTATION_STATUS in str(w[4]))
    first_status = next(i for i, w in enumerate(writes) if w[3] == "status")
    assert snap < first_status  # the snapshot is written before the status it mirrors
    restored = move.restore(_stored(kube)["metadata"]["annotations"][domain.ANNOTATION_STATUS])
    assert restored.state is HostState.PROVISIONED and restored.host_keys.os == OS_KEY.public


async def test_a_moved_consumer_in_a_paused_cluster_is_not_refreshed_until_it_resumes() -> None:
    status = _status(HostState.PROVISIONED)
    kube = FakeKube(
        ("hetznergpuhosts", _host(status, status)), *SECRETS, OS_SECRET, _machine("machine-uid-target"), _cluster(True)
    )
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    assert _stored(kube)["spec"]["consumerRef"]["uid"] == "machine-uid-source"  # clusterctl unpauses at the end
    assert _ready(kube)["Paused"] == "True/Paused"
    kube.objs[("clusters", NS, "dev")]["spec"]["paused"] = False
    await host_loop.reconcile(deps, NS, HOST)
    assert _stored(kube)["spec"]["consumerRef"]["uid"] == "machine-uid-target"
    assert _ready(kube)["Paused"] == "False/NotPaused" and _stored(kube)["status"]["state"] == "Provisioned"


def _labelled(host: Obj, cluster: str = "dev") -> Obj:
    host["metadata"]["labels"] = {domain.CONSUMER_CLUSTER_LABEL: cluster}
    return host


@pytest.mark.parametrize(("cluster_paused", "ready"), [(True, None), (False, "False/ConsumerMissing")])
async def test_a_host_whose_consumer_the_move_deleted_finds_its_pause_through_the_recorded_cluster(
    cluster_paused: bool, ready: str | None
) -> None:
    """On the source, clusterctl deletes the machines before the hosts, with the Cluster paused: the host
    must stay silent (its Paused condition only), not report its consumer missing. Unpaused, it does."""
    status = _status(HostState.PROVISIONED)
    kube = FakeKube(
        ("hetznergpuhosts", _labelled(_host(status, status))), *SECRETS, OS_SECRET, _cluster(cluster_paused)
    )
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    assert _ready(kube).get("Ready") == ready
    assert _ready(kube)["Paused"] == ("True/Paused" if cluster_paused else "False/NotPaused")
    assert _stored(kube)["status"]["state"] == "Provisioned" and NoSSH.opened == 0
    if cluster_paused:
        kube.writes.clear()
        await host_loop.reconcile(deps, NS, HOST)
        assert _host_writes(kube) == []


@pytest.mark.parametrize("cluster_paused", [False, True])
async def test_a_host_claimed_before_the_label_existed_records_its_cluster_unless_paused(cluster_paused: bool) -> None:
    status = _status(HostState.PROVISIONED)
    kube = FakeKube(
        ("hetznergpuhosts", _host(status, status)), *SECRETS, OS_SECRET, _machine("machine-uid-source"),
        _cluster(cluster_paused),
    )  # fmt: skip
    await host_loop.reconcile(_deps(kube), NS, HOST)
    labels = _stored(kube)["metadata"].get("labels") or {}
    assert labels.get(domain.CONSUMER_CLUSTER_LABEL) == (None if cluster_paused else "dev")
    assert _stored(kube)["status"]["state"] == "Provisioned"


FORGED_KEY = hostkeys.generate(comment="attacker")


@pytest.mark.parametrize(
    ("forged", "robots", "why"),
    [
        ({"ipv4": "203.0.113.66"}, {}, "ipv4 203.0.113.66 is not Robot's address for the server (192.0.2.10)"),
        ({"host_keys": HostKeys(os=FORGED_KEY.public)}, {}, "hostKeys.os is not the key of the OS host key Secret"),
        ({}, {"ip": None}, "ipv4 192.0.2.10 is not Robot's address for the server (none)"),
    ],
    ids=["ipv4", "hostKeys.os", "server not in the account"],
)
async def test_a_forged_snapshot_is_dropped_and_the_host_registers_again_from_robot(
    forged: dict[str, Any], robots: dict[str, Any], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    emitted: list[tuple[str, str]] = []
    monkeypatch.setattr(host_loop.host_move.events, "emit", lambda _o, r, m, *_, **__: emitted.append((r, m)))
    snapshot = _status(HostState.PROVISIONED).model_copy(update=forged)
    kube = FakeKube(("hetznergpuhosts", _host(None, snapshot)), *SECRETS, OS_SECRET, _machine(), _cluster(False))
    deps = _deps(kube, FixedRobots(Settings(), **robots))
    for _ in range(3):
        await host_loop.reconcile(deps, NS, HOST)
    status = _stored(kube)["status"]
    # Registering again; a server Robot does not know fails there, for good (RegistrationError).
    assert status["state"] == ("Registering" if robots.get("ip", "") is not None else "Error")
    assert status.get("ipv4") in (None, robots.get("ip", "192.0.2.10"))  # Robot's, never the snapshot's
    assert status["hostKeys"]["os"] == OS_KEY.public  # the owned Secret's, never the snapshot's
    assert "hardware" not in status and not status.get("migInstances")
    assert "203.0.113.66" not in NoSSH.addresses
    untrusted = [m for r, m in emitted if r == move.Reason.STATUS_SNAPSHOT_UNTRUSTED]
    assert len(untrusted) == 1 and why in untrusted[0]
    assert not [w for w in kube.writes if w[0] == "create"]  # no new OS host key: the pinned one is kept


async def test_an_unclaimed_host_with_a_forged_snapshot_is_held_untouched_until_a_human_releases_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29: registering again would inspect an unclaimed host, a rescue boot ordered by a forged
    annotation. It waits in a permanent error, its lever set in the same pass, and nothing reaches Robot or
    the server until a human removes the lever."""
    emitted: list[tuple[str, str]] = []
    monkeypatch.setattr(host_loop.host_move.events, "emit", lambda _o, r, m, *_, **__: emitted.append((r, m)))
    snapshot = _status(HostState.AVAILABLE).model_copy(update={"ipv4": "203.0.113.66"})
    obj = _host(None, snapshot)
    del obj["spec"]["consumerRef"]
    kube = FakeKube(("hetznergpuhosts", obj), *SECRETS, OS_SECRET, _cluster(False))
    robots = FixedRobots(Settings())
    deps = _deps(kube, robots)
    for _ in range(3):
        await host_loop.reconcile(deps, NS, HOST)
    stored = _stored(kube)
    status = stored["status"]
    assert (status["state"], status["errorType"], status["errorPermanent"]) == ("Error", "RegistrationError", True)
    assert domain.ANNOTATION_PERMANENT_ERROR in stored["metadata"]["annotations"]
    assert move.restore(stored["metadata"]["annotations"][domain.ANNOTATION_STATUS]).ipv4 is None  # forgery gone
    assert "hardware" not in status and status.get("ipv4") is None
    assert NoSSH.opened == 0 and "203.0.113.66" not in NoSSH.addresses
    untrusted = [m for r, m in emitted if r == move.Reason.STATUS_SNAPSHOT_UNTRUSTED]
    assert len(untrusted) == 1 and "held in a permanent error" in untrusted[0]
    assert not [r for r, _ in emitted if r == "StatusRestored"]

    # The human's release: the lever removed, the host registers from Robot's address (and inspects next).
    stored["metadata"]["annotations"].pop(domain.ANNOTATION_PERMANENT_ERROR)
    await host_loop.reconcile(deps, NS, HOST)
    assert _stored(kube)["status"]["state"] == "Registering"
    await host_loop.reconcile(deps, NS, HOST)
    assert _stored(kube)["status"].get("ipv4") == "192.0.2.10"


async def test_a_snapshot_robot_cannot_check_yet_is_not_restored_and_nothing_is_sent() -> None:
    kube = FakeKube(("hetznergpuhosts", _host(None, _status(HostState.PROVISIONED))), *SECRETS, OS_SECRET)
    await host_loop.reconcile(_deps(kube, FixedRobots(Settings(), answers=False)), NS, HOST)
    assert "state" not in _stored(kube)["status"]  # still "arrived without status": tried again next pass
    assert _ready(kube)["Ready"] == f"False/{move.Reason.STATUS_SNAPSHOT_UNCHECKED}"
    assert NoSSH.opened == 0


async def test_a_snapshot_still_unchecked_is_not_rewritten_every_try() -> None:
    kube = FakeKube(("hetznergpuhosts", _host(None, _status(HostState.PROVISIONED))), *SECRETS, OS_SECRET)
    deps = _deps(kube, FixedRobots(Settings(), answers=False))
    await host_loop.reconcile(deps, NS, HOST)
    written = len(kube.writes)
    await host_loop.reconcile(deps, NS, HOST)  # the same cause, 10 s later: nothing new to say
    assert len(kube.writes) == written, kube.writes[written:]
    assert _ready(kube)["Ready"] == f"False/{move.Reason.STATUS_SNAPSHOT_UNCHECKED}"
