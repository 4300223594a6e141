"""A Configure pass that finds its own host's run still going in this process (the pass before was cancelled,
e.g. leadership lost and won back, while the shielded run went on) joins that run: the server's marker, which
names this host's own uid, would otherwise read as a run that died with a controller and start a second
Ansible run beside the first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.controllers import host_actions


async def test_a_run_still_going_is_joined_not_started_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    handovers: list[str] = []
    runs: list[asyncio.Future[Any]] = []

    async def handover(*args: Any) -> str:
        handovers.append("checked")
        return "marker"

    def run_marked(*args: Any) -> asyncio.Future[Any]:
        runs.append(asyncio.get_running_loop().create_future())
        return runs[-1]

    monkeypatch.setattr(host_actions, "_handover", handover)
    monkeypatch.setattr(host_actions, "_run_marked", run_marked)
    host = HetznerGPUHost.model_validate({"metadata": {"name": "gex-1", "uid": "uid-1"}, "spec": {"serverNumber": 1}})
    other = HetznerGPUHost.model_validate({"metadata": {"name": "gex-2", "uid": "uid-2"}, "spec": {"serverNumber": 2}})

    def start(h: HetznerGPUHost) -> Any:
        return host_actions._start_or_join(None, h, None, "all-1g", None, None, None, lambda ev: None)  # type: ignore[arg-type]

    first = await start(host)
    assert await start(host) is first and len(runs) == 1 and handovers == ["checked"]
    assert await start(other) is not first and len(runs) == 2  # another host's run is its own
    runs[0].set_result("done")
    await asyncio.sleep(0)  # the done callback forgets it
    assert await start(host) is not first and len(runs) == 3 and handovers == ["checked"] * 3
    for r in runs[1:]:
        r.set_result("done")
    await asyncio.sleep(0)
    assert host_actions._RUNS == {}
