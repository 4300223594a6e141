"""The hardware waits on each host's critical path and what the controller adds to them: the analysis
half of ``scaleup.py`` (see its docstring for what each wait is and where its record comes from)."""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from capi_gpu_sim.world import World

ACTION = re.compile(r"^(\S+ \S+) INFO capi_gpu\.controllers\.host_loop: host (\S+?)/(\S+?): (\S+) -> ok\b")
Interval = tuple[float, float, str]


@dataclass
class Trace:
    """One host as the bench saw it (monotonic seconds), polled from the API."""

    name: str
    number: int
    steps: list[tuple[float, str]] = field(default_factory=list)
    node: float | None = None
    slices: float | None = None
    provisioned: float | None = None
    machine: str | None = None
    claimed: float | None = None  # consumerRef seen
    owned: float | None = None  # its HetznerGPUMachine got its owning Machine (CAPI done)
    untainted: float | None = None
    ready: float | None = None
    bound: float | None = None
    pod: str | None = None


class Clocks:
    """Every record onto this process's monotonic clock."""

    def __init__(self, world: World) -> None:
        assert world.robot is not None
        self.wall = time.time() - time.monotonic()
        clock = world.robot.clock
        self.compression = clock.compression
        self.robot = time.monotonic() - clock.now() / clock.compression

    def from_wall(self, t: float) -> float:
        return t - self.wall

    def from_robot(self, t: float) -> float:
        return self.robot + t / self.compression


def actions(world: World, clocks: Clocks) -> list[tuple[float, str, str]]:
    """(time, host, action) of every action the operator logged as done."""
    out = []
    for line in world.operator_logs().splitlines():
        if m := ACTION.match(line):
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logging
            out.append((clocks.from_wall(at), m.group(3), m.group(4)))
    return out


def ansible_runs(world: World, host: str, clocks: Clocks) -> list[tuple[float, float]]:
    runs = []
    for events in (world.config.state_dir / "artifacts" / host).glob("*/artifacts/*/job_events"):
        stamps = sorted(json.loads(p.read_text())["created"] for p in events.glob("*.json"))
        if stamps:
            first, last = (datetime.fromisoformat(s).timestamp() for s in (stamps[0], stamps[-1]))
            runs.append((clocks.from_wall(first), clocks.from_wall(last)))
    return runs


def hardware(
    world: World, trace: Trace, clocks: Clocks, t0: float, done: list[tuple[float, str, str]]
) -> list[Interval]:
    assert world.fleet is not None and world.robot is not None
    host = world.fleet.hosts[trace.number]
    ups = sorted((b.started, b.started + b.up_after_s) for b in host.boots if b.up_after_s is not None)

    def up_after(t: float) -> float | None:
        return next((up for started, up in ups if started >= t), None)

    out: list[Interval] = []
    for e in world.robot.log:
        if e.method == "POST" and e.path == f"/reset/{trace.number}" and clocks.from_robot(e.t) >= t0:
            start = clocks.from_robot(e.t)
            if (up := up_after(start)) is not None:
                out.append((start, up, "reset+boot"))
    for at, name, action in done:
        if name != trace.name or at < t0:
            continue
        if action in ("reset-ssh", "mig-reboot") and (up := up_after(at)) is not None:
            out.append((at, up, "reboot"))
        if action == "bootstrap" and trace.node is not None:
            out.append((at, trace.node, "bootstrap"))
    runs = host.installimage_runs()
    starts = [clocks.from_wall(r["at"]) for r in runs if r["event"] == "start"]
    ends = [clocks.from_wall(r["at"]) for r in runs if r["event"] == "end"]
    out += [(s, e, "installimage") for s, e in zip(starts, ends, strict=False) if s >= t0]
    out += [(s, e, "ansible") for s, e in ansible_runs(world, trace.name, clocks) if s >= t0]
    if trace.node is not None and trace.slices is not None:
        out.append((trace.node, trace.slices, "dra-publish"))
    return out


def covered(intervals: list[Interval], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` within [lo, hi]."""
    total, reach = 0.0, lo
    for begin, finish, _ in sorted(intervals):
        start, end = max(begin, reach), min(finish, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def steps(t: Trace, t0: float, hw: list[Interval]) -> dict[str, list[float]]:
    """Wall, hardware and hardware-without-Ansible seconds per step the bench saw the host in."""
    assert t.ready is not None
    marks = [(t0, "CAPI: Machine, HetznerGPUMachine")]
    marks += [
        (at, label) for at, label in ((t.owned, "claim (machine loop)"), (t.claimed, "claim seen (host loop)")) if at
    ]
    marks += [(at, label) for at, label in t.steps if at >= t0 and not label.startswith(("Available", "Standby/"))]
    marks.append((t.provisioned or t.ready, "gate (node -> taint lifted)"))
    marks.sort()
    out: dict[str, list[float]] = {}
    no_ansible = [i for i in hw if i[2] != "ansible"]
    for (start, label), (end, _) in zip(marks, [*marks[1:], (t.ready, "")], strict=False):
        if end > start:
            row = out.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += end - start
            row[1] += covered(hw, start, end)
            row[2] += covered(no_ansible, start, end)
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.mean(values), 2), "max": round(max(values), 2)}


def view(rows: list[dict[str, float]], hw_key: str) -> dict[str, float | None]:
    """Mean hardware and overhead per host, overhead over hardware summed over hosts, and the same
    without CAPI's part (scale-up -> the HetznerGPUMachine has its owner): ours alone."""
    n, hw = len(rows), sum(r[hw_key] for r in rows)
    over = sum(r["ttr"] - r[hw_key] for r in rows)
    ours = over - sum(r["capi"] for r in rows)
    return {
        "hardware_s": round(hw / n, 2),
        "overhead_s": round(over / n, 2),
        "overhead_pct": round(100 * over / hw, 1) if hw else None,
        "operator_overhead_s": round(ours / n, 2),
        "operator_overhead_pct": round(100 * ours / hw, 1) if hw else None,
    }


def analyse(world: World, traces: list[Trace], t0: float, clocks: Clocks) -> dict[str, Any]:
    done = actions(world, clocks)
    rows: list[dict[str, float]] = []
    per_step: dict[str, list[float]] = {}
    slowest: tuple[float, str, list[Interval]] = (0.0, "", [])
    for t in traces:
        if t.ready is None:
            continue
        hw = hardware(world, t, clocks, t0, done)
        if t.ready - t0 > slowest[0]:
            slowest = (t.ready - t0, t.name, hw)
        no_ansible = [i for i in hw if i[2] != "ansible"]
        rows.append(
            {
                "ttr": t.ready - t0,
                "hw": covered(hw, t0, t.ready),
                "hw_no_ansible": covered(no_ansible, t0, t.ready),
                "ansible": covered([i for i in hw if i[2] == "ansible"], t0, t.ready),
                "bound": (t.bound or t.ready) - t0,
                "capi": (t.owned or t0) - t0,
            }
        )
        for label, row in steps(t, t0, hw).items():
            acc = per_step.setdefault(label, [0.0, 0.0, 0.0])
            acc[:] = [a + b for a, b in zip(acc, row, strict=True)]
    if not rows:
        return {"ready": 0}
    n = len(rows)
    return {
        "ready": n,
        "time_to_ready_s": spread([r["ttr"] for r in rows]),
        "time_to_claim_bound_s": spread([r["bound"] for r in rows]),
        "ansible_s": round(sum(r["ansible"] for r in rows) / n, 2),
        "capi_s": round(sum(r["capi"] for r in rows) / n, 2),
        "ansible_as_hardware": view(rows, "hw"),
        "ansible_as_controller": view(rows, "hw_no_ansible"),
        "steps": {k: [round(x / n, 2) for x in v] for k, v in per_step.items()},
        "slowest_host": {  # its hardware intervals, seconds from the scale-up
            "host": slowest[1],
            "ready_s": round(slowest[0], 2),
            "hardware": [[round(a - t0, 2), round(b - t0, 2), kind] for a, b, kind in sorted(slowest[2])],
        },
    }


PACKAGE_TASK = re.compile(r"install|package|apt|dpkg|driver|\.deb", re.IGNORECASE)
"""Task names that install software (as e2e/sim/test_node_image_install.py counts them)."""


def route(world: World, traces: list[Trace], since_wall: float, boots_before: dict[str, int]) -> dict[str, Any]:
    """What each node's route cost since the phase began (wall clock ``since_wall``), per node: boots into
    the installed OS (the fleet's boot records), Ansible tasks that changed, and of those the package ones
    (ansible-runner's job events of the runs that began after ``since_wall``)."""
    assert world.fleet is not None
    boots, changed, packages = [], [], []
    for t in traces:
        records = world.fleet.hosts[t.number].boots[boots_before[t.name] :]
        boots.append(sum(1 for b in records if b.running.value == "installed"))
        tasks: list[str] = []
        for events in (world.config.state_dir / "artifacts" / t.name).glob("*/artifacts/*/job_events"):
            loaded = [json.loads(p.read_text()) for p in events.glob("*.json")]
            if not loaded or min(datetime.fromisoformat(e["created"]).timestamp() for e in loaded) < since_wall:
                continue
            tasks += [
                str(e["event_data"].get("task", ""))
                for e in loaded
                if e.get("event") == "runner_on_ok" and (e["event_data"].get("res") or {}).get("changed")
            ]
        changed.append(len(tasks))
        packages.append(sum(1 for name in tasks if PACKAGE_TASK.search(name)))
    n = max(len(traces), 1)
    return {
        "reboots_per_node": round(sum(boots) / n, 2),
        "changed_tasks_per_node": round(sum(changed) / n, 1),
        "package_tasks_changed_per_node": round(sum(packages) / n, 1),
    }
