"""Secrets never reach host status: an installimage log tail or a command's stderr quoting a private key, a
password or a known secret value is redacted in errorMessage, the operation outcome and the Ready condition
before the status patch, exactly as for Events; a redacted status written back compares equal (no churn)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from capi_gpu.api.host import ErrorType, HetznerGPUHost, HetznerGPUHostStatus, HostState, Operation
from capi_gpu.controllers import host_loop
from capi_gpu.kube import Obj, Res
from capi_gpu.provisioning.model import Decision
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import Wakeups

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
KNOWN = "the-ssh-key-material-4711"  # a Secret's value the controller holds, whatever its shape
TAIL = f"--- installimage output\nERROR: cannot mount\ncrypt password=hunter2hunter2\n{PEM}key {KNOWN}\n"


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[Obj] = []

    async def patch(self, res: Res, name: str, body: Obj, namespace: str | None = None, **_: Any) -> Obj:
        self.patches.append(body)
        return body


def _failed_status() -> HetznerGPUHostStatus:
    op = Operation(name="installimage", requested_at=NOW, completed_at=NOW, outcome=f"Failed: {TAIL}")
    return HetznerGPUHostStatus(
        state=HostState.ERROR,
        error_type=ErrorType.INSTALL_FAILED,
        error_message=f"installimage failed: {TAIL}",
        error_count=1,
        last_error_at=NOW,
        operations=[op],
    )


async def test_install_log_secrets_are_redacted_before_the_status_patch() -> None:
    obj = {"metadata": {"name": "h1", "namespace": "gpu", "uid": "u1"}, "spec": {"serverNumber": 1}}
    host = HetznerGPUHost.model_validate(obj)
    kube = FakeKube()
    deps: Any = SimpleNamespace(kube=kube, clock=lambda: NOW, wakeups=Wakeups(), provisioning=set())
    account = SimpleNamespace(circuit_open=False, circuit_reason=None)
    env: Any = SimpleNamespace(
        robot=SimpleNamespace(account=account),
        ssh_private=KNOWN,
        os_key=SimpleNamespace(private=PEM),
        consumer=None,
    )
    await host_loop._write(deps, obj, host, Decision(_failed_status()), env)
    status_patches = [p["status"] for p in kube.patches if "status" in p]
    assert status_patches
    text = repr(status_patches)
    for secret in ("hunter2hunter2", "b3BlbnNzaC1rZXkAAAA", KNOWN):
        assert secret not in text, secret
    written = status_patches[-1]
    assert "cannot mount" in written["errorMessage"]  # the useful part stays
    assert "[redacted" in written["operations"][0]["outcome"]
    ready = next(c for c in written["conditions"] if c["type"] == "Ready")
    assert "cannot mount" in ready["message"] and "hunter2hunter2" not in ready["message"]


def test_redaction_is_idempotent() -> None:
    once = events.redact_status(_failed_status(), [KNOWN])
    assert events.redact_status(once, [KNOWN]).model_dump() == once.model_dump()
