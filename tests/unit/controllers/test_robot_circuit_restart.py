"""A 401 survives an operator restart: a new process whose HetznerGPUCluster status says Robot rejected this
very version of the credentials Secret opens the circuit without sending anything (each restart would
otherwise spend one of the three failed logins that block the IP); another version of the Secret, another
Secret, or a condition that is not a rejection leave it closed."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

from capi_gpu.kube import Obj, Res
from capi_gpu.runtime.deps import RobotClients, secret_version
from capi_gpu.runtime.settings import Settings


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class FakeKube:
    def __init__(self, secret: Obj, clusters: list[Obj]) -> None:
        self.secret, self.clusters = secret, clusters

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        return self.secret if name == self.secret["metadata"]["name"] else None

    async def list(self, res: Res, namespace: str | None = None, **_: Any) -> list[Obj]:
        assert res.plural == "hetznergpuclusters"
        return self.clusters


def _secret(resource_version: str) -> Obj:
    user = f"u-{uuid.uuid4().hex[:8]}"  # its own Robot account: circuits are per account and process-wide
    return {
        "metadata": {"name": "robot-credentials", "uid": "uid-1", "resourceVersion": resource_version},
        "data": {"robot-user": _b64(user), "robot-password": _b64("wrong")},
    }


def _cluster(version: str, reason: str, secret: str = "robot-credentials") -> Obj:
    return {
        "metadata": {"name": "dev"},
        "spec": {"robotCredentials": {"name": secret}},
        "status": {
            "credentialsHash": version,
            "conditions": [{"type": "RobotCredentialsValid", "status": "False", "reason": reason}],
        },
    }


@pytest.mark.parametrize(
    ("recorded", "reason", "secret_name", "open_"),
    [
        ("uid-1/7", "CredentialsRejected", "robot-credentials", True),
        ("uid-1/6", "CredentialsRejected", "robot-credentials", False),  # the Secret changed since
        ("uid-1/7", "RobotUnavailable", "robot-credentials", False),  # Robot was down, not a 401
        ("uid-1/7", "CredentialsRejected", "other-secret", False),
    ],
)
async def test_a_rejection_recorded_for_this_secret_version_opens_the_circuit_of_a_new_process(
    recorded: str, reason: str, secret_name: str, open_: bool
) -> None:
    secret = _secret("7")
    assert secret_version(secret) == "uid-1/7"
    kube = FakeKube(secret, [_cluster(recorded, reason, secret_name)])
    client = await RobotClients(Settings(robot_url="http://127.0.0.1:9")).get(kube, "gpu", "robot-credentials")  # type: ignore[arg-type]
    try:
        assert client.account.circuit_open is open_
        if open_:
            assert "before the operator restarted" in (client.account.circuit_reason or "")
            assert "wrong" not in (client.account.circuit_reason or "")
    finally:
        await client.aclose()


def test_the_secret_version_says_nothing_of_its_content() -> None:
    secret = _secret("7")
    assert secret_version(secret) == "uid-1/7"
    assert all(v not in secret_version(secret) for v in secret["data"].values())
