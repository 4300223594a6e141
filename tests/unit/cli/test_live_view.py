"""The live host view (capi_gpu.cli.live): rows from HetznerGPUHost status and the consuming Machine (nodeRef,
GPUReady), the --cluster filter, the ladder bar only moving forward, the last Events oldest first, the plain
mode printing one line per change (not per look), and the rendered table's columns."""

from __future__ import annotations

import datetime
import io
from typing import Any

from rich.console import Console

from capi_gpu.cli import live

NOW = datetime.datetime(2026, 12, 3, 18, 0, 0, tzinfo=datetime.UTC)


def host(name: str, state: str, step: str | None = None, consumer: str | None = None, started: int = 0) -> Any:
    status: dict[str, Any] = {"state": state}
    if step:
        status["step"] = step
        status["stepStartedAt"] = (NOW - datetime.timedelta(seconds=started)).isoformat().replace("+00:00", "Z")
    spec: dict[str, Any] = {"serverNumber": 1}
    if consumer:
        spec["consumerRef"] = {"kind": "HetznerGPUMachine", "name": consumer}
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def machine(infra: str, cluster: str, node: str | None = None, ready: str | None = None) -> Any:
    status: dict[str, Any] = {}
    if node:
        status["nodeRef"] = {"name": node}
    if ready:
        status["conditions"] = [{"type": "GPUReady", "status": ready}]
    return {
        "metadata": {"name": f"m-{infra}", "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"infrastructureRef": {"name": infra}},
        "status": status,
    }


def event(name: str, reason: str, seconds_ago: int, kind: str = "HetznerGPUHost", uid: str = "") -> Any:
    stamp = (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")
    return {
        "metadata": {"uid": uid or f"{name}-{reason}"},
        "involvedObject": {"kind": kind, "name": name},
        "reason": reason,
        "message": f"{reason} on {name}",
        "lastTimestamp": stamp,
        "type": "Normal",
    }


HOSTS = [
    host("gex-2", "Provisioning", "Install", "dev-gpu-b", started=75),
    host("gex-1", "Provisioned", None, "dev-gpu-a"),
    host("gex-3", "Available"),
    host("other", "Provisioning", "Rescue", "prod-gpu-x", started=3),
]
MACHINES = [
    machine("dev-gpu-a", "dev", node="gex-1", ready="True"),
    machine("dev-gpu-b", "dev"),
    machine("prod-gpu-x", "prod"),
]


def test_rows_come_from_host_status_and_the_consuming_machine() -> None:
    snap = live.snapshot(HOSTS, MACHINES, [])
    by = {r.name: r for r in snap.hosts}
    assert [r.name for r in snap.hosts] == ["gex-1", "gex-2", "gex-3", "other"]
    assert (by["gex-1"].node, by["gex-1"].gpu_ready, by["gex-1"].steps_done()) == ("gex-1", "True", len(live.LADDER))
    assert (by["gex-2"].step, by["gex-2"].in_step(NOW), by["gex-2"].node) == ("Install", "1m15s", "-")
    assert by["gex-2"].steps_done() == live.LADDER.index(live.Step.INSTALL) == 3
    assert (by["gex-3"].consumer, by["gex-3"].steps_done(), by["gex-3"].in_step(NOW)) == ("-", 0, "-")
    failed = live.snapshot([host("gex-4", "Error", "Configure", "dev-gpu-c", started=5)], [], []).hosts[0]
    assert failed.steps_done() == 5  # the bar stops where the host did


def test_cluster_filter_keeps_only_hosts_its_machines_consume_and_their_events() -> None:
    events = [
        event("gex-2", "InstallStarted", 30),
        event("other", "RescueStarted", 2),
        event("dev-gpu-b", "Claimed", 60),
    ]
    snap = live.snapshot(HOSTS, MACHINES, events, cluster="dev")
    assert [r.name for r in snap.hosts] == ["gex-1", "gex-2"]
    assert [e.reason for e in snap.events] == ["Claimed", "InstallStarted"]  # oldest first, prod's left out


def test_only_the_last_events_of_our_kinds_are_kept() -> None:
    events = [event("gex-1", f"R{i}", 100 - i) for i in range(10)] + [event("pod-x", "Scheduled", 0, kind="Pod")]
    snap = live.snapshot(HOSTS, MACHINES, events, shown=3)
    assert [e.reason for e in snap.events] == ["R7", "R8", "R9"]


def test_plain_mode_prints_one_line_per_change_not_per_look() -> None:
    out = io.StringIO()
    view = live.View(out=out, live=False)
    with view:
        first = live.snapshot(HOSTS, MACHINES, [event("gex-2", "InstallStarted", 30)])
        view.show(first, NOW)
        view.show(first, NOW + datetime.timedelta(seconds=5))  # time passes, nothing changes
        moved = [host("gex-2", "Provisioning", "RebootOS", "dev-gpu-b"), *HOSTS[1:]]
        view.show(live.snapshot(moved, MACHINES, [event("gex-2", "InstallStarted", 30)]), NOW)
    lines = out.getvalue().splitlines()
    assert len([ln for ln in lines if "gex-2" in ln and "event" not in ln]) == 2
    assert len([ln for ln in lines if "InstallStarted" in ln]) == 1
    assert "RebootOS    4/8" in lines[-1] and "\x1b[" not in out.getvalue()
    assert len(lines) == 4 + 1 + 1  # four hosts, one event, one change


def test_rendered_table_has_the_columns_and_bar() -> None:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(live.render(live.snapshot(HOSTS, MACHINES, [event("gex-2", "InstallStarted", 30)]), NOW))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for column in ("HOST", "STATE", "STEP", "IN STEP", "PROGRESS", "MACHINE", "NODE", "GPUReady"):
        assert column in text
    assert "8/8" in text and "3/8" in text and "1m15s" in text
    assert "last events:" in text and "InstallStarted on gex-2" in text
