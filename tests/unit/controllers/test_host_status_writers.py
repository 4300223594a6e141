"""Host status has more than one writer (the host loop; ``nodes relayout`` recording a new layout; a moved
host's snapshot restore), and the last writer no longer wins: the host loop's status writes carry the
resourceVersion they were derived from. Forced races: a pass that read before another writer's record fails
its write (409) instead of erasing that operation record; an outcome written after relayout recorded a layout
keeps both the outcome and the layout."""

from __future__ import annotations

import copy
import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostStatus, HostState, Operation, Step
from capi_gpu.controllers import host_loop
from capi_gpu.kube import Conflict, Obj, Res
from capi_gpu.provisioning import transitions
from capi_gpu.provisioning.model import Action, ActionKind, ActionResult, Decision, Observations, Timing
from capi_gpu.runtime.deps import Wakeups

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class ApiServer:
    """One stored HetznerGPUHost with the apiserver's optimistic concurrency: a patch naming a
    metadata.resourceVersion other than the stored one is a 409; every write bumps it."""

    def __init__(self, obj: Obj) -> None:
        self.obj = copy.deepcopy(obj)
        self.obj["metadata"]["resourceVersion"] = "1"

    async def get(self, res: Res, name: str, namespace: str | None = None) -> Obj:
        return copy.deepcopy(self.obj)

    async def patch(self, res: Res, name: str, body: Obj, namespace: str | None = None, **_: Any) -> Obj:
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != self.obj["metadata"]["resourceVersion"]:
            raise Conflict(
                409, "Conflict", "the object has been modified; please apply your changes to the latest version"
            )
        merged = _merge(self.obj, body)
        merged["metadata"]["resourceVersion"] = str(int(self.obj["metadata"]["resourceVersion"]) + 1)
        self.obj = merged
        return copy.deepcopy(self.obj)


def _world() -> tuple[ApiServer, Any]:
    status = HetznerGPUHostStatus(state=HostState.PROVISIONING, step=Step.WIPE, step_started_at=T0)
    obj = HetznerGPUHost.model_validate(
        {"metadata": {"name": "h1", "namespace": "gpu", "uid": "u1"}, "spec": {"serverNumber": 7}}
    ).wire()
    obj["status"] = status.model_dump(by_alias=True, mode="json")
    api = ApiServer(obj)
    deps = SimpleNamespace(kube=api, clock=lambda: T0, wakeups=Wakeups(), provisioning=set())
    return api, deps


def _recorded(host: HetznerGPUHost, name: str) -> Decision:
    status = host.status.model_copy(deep=True)
    status.operations = [*status.operations, Operation(name=name, requested_at=T0)]
    return Decision(status, Action(ActionKind(name)))


def _ops(api: ApiServer) -> list[tuple[str, str | None]]:
    return [(o["name"], o.get("outcome")) for o in api.obj["status"].get("operations") or []]


async def test_a_stale_pass_cannot_erase_an_operation_record() -> None:
    api, deps = _world()
    stale = HetznerGPUHost.model_validate(await api.get(Res("", "", ""), "h1"))  # read before the record
    fresh = HetznerGPUHost.model_validate(await api.get(Res("", "", ""), "h1"))
    await host_loop._write(deps, api.obj, fresh, _recorded(fresh, "wipe"), None)
    assert _ops(api) == [("wipe", None)]
    with pytest.raises(Conflict):  # what it would write has no record of the wipe
        await host_loop._write(
            deps, api.obj, stale, Decision(stale.status.model_copy(update={"step": Step.INSTALL})), None
        )
    assert _ops(api) == [("wipe", None)] and api.obj["status"]["step"] == "Wipe"


async def test_an_outcome_after_a_relayout_keeps_both() -> None:
    api, deps = _world()
    host = HetznerGPUHost.model_validate(await api.get(Res("", "", ""), "h1"))
    decision = _recorded(host, "wipe")
    host = await host_loop._write(deps, api.obj, host, decision, None)
    # While the wipe runs, `capi-gpu nodes relayout` records a layout (a partial merge patch, as relayout.py).
    await api.patch(Res("", "", ""), "h1", {"status": {"layout": "all-1g.24gb", "migDevices": ["1g.24gb"] * 4}})
    ctx = transitions.Context(host, Observations(claimed=True), T0, Timing(), "h1")
    assert decision.action is not None
    final = await host_loop.record_outcome(
        deps, api.obj, host, None, decision.action, ActionResult.ok(message="wiped"), ctx
    )
    assert final.status.step is Step.INSTALL
    stored = api.obj["status"]
    assert [(o["name"], o.get("outcome")) for o in stored["operations"]] == [("wipe", transitions.SENT)]
    assert stored["step"] == "Install"
    assert (stored["layout"], stored["migDevices"]) == ("all-1g.24gb", ["1g.24gb"] * 4)
