"""The OS host-key Secret is trusted only when this controller created it for this host (owned by the
HetznerGPUHost with its uid): a planted ``<host>-os-hostkey`` Secret, or one owned by another host, is
refused with Ready False/OSHostKeyUntrusted and an Event, its key is never pinned, and nothing reaches the
server; one the controller created is used."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.controllers import host_loop
from capi_gpu.kube import Obj
from capi_gpu.provisioning import hostkeys, ssh
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

HOST, UID = "gex-7", "host-uid-7"
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
PLANTED = hostkeys.generate(comment="attacker")


class NoSSH:
    opened = 0

    def __init__(self, endpoint: ssh.Endpoint, creds: ssh.Credentials) -> None:
        type(self).opened += 1

    def close(self) -> None:
        pass


def _secret(name: str, owners: list[dict[str, Any]] | None = None, **data: str) -> tuple[str, Obj]:
    meta: Obj = {"name": name, **({"ownerReferences": owners} if owners is not None else {})}
    return "secrets", {"metadata": meta, "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def _world(owners: list[dict[str, Any]] | None) -> tuple[FakeKube, Deps]:
    host: Obj = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUHost",
        "metadata": {"name": HOST, "uid": UID},
        "spec": {"serverNumber": 7},
    }
    kube = FakeKube(
        ("hetznergpuhosts", host),
        _secret("robot-credentials", **{"robot-user": "u", "robot-password": "p"}),
        _secret("robot-ssh", **{"ssh-privatekey": "not-used", "ssh-publickey": "not-used"}),
        _secret(
            f"{HOST}{domain.OS_HOSTKEY_SECRET_SUFFIX}",
            owners,
            **{"ssh-host-privatekey": PLANTED.private, "ssh-host-publickey": PLANTED.public},
        ),
    )
    NoSSH.opened = 0
    settings = Settings(robot_url="https://127.0.0.1:9")
    deps = Deps(kube, settings, None, RobotClients(settings), clock=lambda: T0, shell_factory=NoSSH)  # type: ignore[arg-type]
    return kube, deps


def _owner(uid: str) -> dict[str, Any]:
    return {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUHost", "name": HOST, "uid": uid}


@pytest.mark.parametrize(
    "owners",
    [None, [_owner("another-host-uid")], [{"apiVersion": "v1", "kind": "ConfigMap", "name": HOST, "uid": UID}]],
    ids=["planted", "another-hosts", "owned-by-something-else"],
)
async def test_a_planted_os_host_key_secret_is_refused(owners: list[dict[str, Any]] | None) -> None:
    kube, deps = _world(owners)
    await host_loop.reconcile(deps, NS, HOST)
    stored = kube.objs[("hetznergpuhosts", NS, HOST)]
    ready = next(x for x in stored["status"]["conditions"] if x["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", c.Reason.OS_HOST_KEY_UNTRUSTED)
    assert "not owned by this HetznerGPUHost" in ready["message"]
    assert PLANTED.public not in str(stored["status"])  # never pinned
    assert NoSSH.opened == 0
    assert [w for w in kube.writes if w[1] != "hetznergpuhosts"] == []  # no Secret written or replaced


async def test_the_secret_the_controller_created_is_used() -> None:
    kube, deps = _world([_owner(UID)])
    await host_loop.reconcile(deps, NS, HOST)
    stored = kube.objs[("hetznergpuhosts", NS, HOST)]
    ready = next(x for x in stored["status"]["conditions"] if x["type"] == "Ready")
    assert ready["reason"] != c.Reason.OS_HOST_KEY_UNTRUSTED
    assert stored["status"]["hostKeys"]["os"] == PLANTED.public
