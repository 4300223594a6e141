"""The live view of a scale-up: one table per host that updates in place, the last Events under it.

A scale-up is a few hosts walking the same ten-minute ladder, so what a user wants to see is where
each one is now, not a log of every change: ``dev up`` used to reprint the whole table on each change,
some forty near-identical blocks for two hosts. On a terminal the view is a rich ``Live`` region
(redrawn in place); without one (CI, a pipe) it prints one line per change, so logs stay greppable.

Everything it shows comes from the management cluster's API, so the same view backs ``dev up`` and
``capi-gpu hosts watch`` against any cluster: HetznerGPUHost status (state, step, ``stepStartedAt``),
the CAPI Machine that consumes it (its ``nodeRef`` and ``GPUReady`` condition, which the gate copies
there, so workload Nodes need not be readable), and the namespace's Events about our kinds.
``snapshot`` is pure (dicts in, rows out); ``read`` is the I/O; ``View`` draws.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from capi_gpu import domain, kube
from capi_gpu.api.host import HostState, Step
from capi_gpu.provisioning import steps
from capi_gpu.unstructured import as_map

HOSTS = kube.ours("hetznergpuhosts")
# The steps a cold host walks to a node, in order (the ``steps`` table's live rows); a step a host skips
# (Wipe, MIGReboot) still counts as passed once a later one starts, so the bar only moves forward.
LADDER: tuple[Step, ...] = steps.LIVE
EVENT_KINDS = frozenset({"HetznerGPUHost", "HetznerGPUMachine", "HetznerGPURemediation"})
EVENTS_SHOWN = 6


@dataclass(frozen=True, slots=True)
class HostLine:
    name: str
    state: str
    step: str
    since: datetime.datetime | None  # when the current step started
    consumer: str
    node: str
    gpu_ready: str

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What a change is: the time in step moves every second and is not one."""
        return (self.state, self.step, self.consumer, self.node, self.gpu_ready)

    def steps_done(self) -> int:
        """Ladder steps behind this host: all of them once provisioned, none before it starts; a host in
        Error keeps its step, so the bar shows where it stopped."""
        if self.state == HostState.PROVISIONED:
            return len(LADDER)
        if self.state not in (HostState.PROVISIONING, HostState.STANDBY_PREPARING, HostState.STANDBY, HostState.ERROR):
            return 0
        if self.state == HostState.STANDBY:
            return LADDER.index(steps.JOIN)  # prepared up to, not including, the join
        try:
            return LADDER.index(Step(self.step))
        except ValueError:
            return 0

    def in_step(self, now: datetime.datetime) -> str:
        if self.since is None:
            return "-"
        seconds = max(0, int((now - self.since).total_seconds()))
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass(frozen=True, slots=True)
class EventLine:
    uid: str
    when: datetime.datetime | None
    kind: str
    name: str
    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    hosts: tuple[HostLine, ...]
    events: tuple[EventLine, ...]  # oldest first


def _time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(obj: Mapping[str, Any], kind: str) -> str:
    for c in as_map(obj.get("status")).get("conditions") or []:
        if as_map(c).get("type") == kind:
            return str(as_map(c).get("status", "-"))
    return "-"


def snapshot(
    hosts: Iterable[Mapping[str, Any]],
    machines: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    cluster: str | None = None,
    shown: int = EVENTS_SHOWN,
) -> Snapshot:
    """Rows for the hosts (only those a Machine of ``cluster`` consumes, when given) and their last Events."""
    by_infra: dict[str, Mapping[str, Any]] = {}
    for m in machines:
        if (
            cluster is not None
            and as_map(as_map(m.get("metadata")).get("labels")).get(domain.CLUSTER_NAME_LABEL) != cluster
        ):
            continue
        infra = as_map(as_map(m.get("spec")).get("infrastructureRef")).get("name")
        if infra:
            by_infra[str(infra)] = m
    rows = []
    for h in hosts:
        meta, spec, status = (as_map(h.get(k)) for k in ("metadata", "spec", "status"))
        consumer = str(as_map(spec.get("consumerRef")).get("name") or "-")
        machine = by_infra.get(consumer)
        if cluster is not None and machine is None:
            continue
        node = as_map(as_map(machine or {}).get("status")).get("nodeRef")
        rows.append(
            HostLine(
                name=str(meta.get("name")),
                state=str(status.get("state") or "-"),
                step=str(status.get("step") or "-"),
                since=_time(status.get("stepStartedAt")),
                consumer=consumer,
                node=str(as_map(node).get("name") or "-"),
                gpu_ready=_condition(machine, domain.GPU_READY_CONDITION) if machine is not None else "-",
            )
        )
    rows.sort(key=lambda r: r.name)
    names = {r.name for r in rows} | {r.consumer for r in rows}
    return Snapshot(tuple(rows), tuple(_events(events, None if cluster is None else names, shown)))


def _events(events: Iterable[Mapping[str, Any]], names: set[str] | None, shown: int) -> list[EventLine]:
    out = []
    for ev in events:
        obj = as_map(ev.get("involvedObject"))
        if obj.get("kind") not in EVENT_KINDS or (names is not None and obj.get("name") not in names):
            continue
        meta = as_map(ev.get("metadata"))
        when = _time(ev.get("lastTimestamp")) or _time(ev.get("eventTime")) or _time(meta.get("creationTimestamp"))
        out.append(
            EventLine(
                uid=f"{meta.get('uid')}/{ev.get('count', 1)}",
                when=when,
                kind=str(obj.get("kind")),
                name=str(obj.get("name")),
                type=str(ev.get("type") or "Normal"),
                reason=str(ev.get("reason") or ""),
                message=str(ev.get("message") or "").replace("\n", " "),
            )
        )
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    out.sort(key=lambda e: e.when or epoch)
    return out[-shown:] if shown > 0 else []


def read(k: kube.Kube, namespace: str, cluster: str | None = None) -> Snapshot:
    """One look at the management cluster: three list calls, whatever the fleet's size."""
    return snapshot(
        k.list(HOSTS, namespace),
        k.list(kube.CAPI_MACHINES, namespace),
        k.list(kube.EVENTS, namespace),
        cluster,
    )


# --- drawing -------------------------------------------------------------------------------------------

_STATE_STYLE: dict[str, str] = {
    HostState.PROVISIONED: "green",
    HostState.PROVISIONING: "yellow",
    HostState.ERROR: "bold red",
    HostState.AVAILABLE: "cyan",
    HostState.STANDBY: "blue",
}


def render(snap: Snapshot, now: datetime.datetime, title: str = "hosts") -> RenderableType:
    table = Table(title=title, title_justify="left", expand=False, header_style="bold")
    for column in ("HOST", "STATE", "STEP", "IN STEP", "PROGRESS", "MACHINE", "NODE", "GPUReady"):
        table.add_column(column, no_wrap=True)
    for r in snap.hosts:
        done = r.steps_done()
        bar = ProgressBar(total=len(LADDER), completed=done, width=18)
        ready_style = {"True": "green", "False": "red"}.get(r.gpu_ready, "dim")
        table.add_row(
            r.name,
            Text(r.state, style=_STATE_STYLE.get(r.state, "")),
            r.step,
            r.in_step(now),
            _bar_cell(bar, done),
            r.consumer,
            r.node,
            Text(r.gpu_ready, style=ready_style),
        )
    events = Table.grid(padding=(0, 1))
    for e in snap.events:
        stamp = e.when.astimezone().strftime("%H:%M:%S") if e.when else "--:--:--"
        events.add_row(
            Text(stamp, style="dim"),
            Text(e.name, style="bold"),
            Text(e.reason, style="red" if e.type == "Warning" else "cyan"),
            Text(e.message, overflow="ellipsis", no_wrap=True),
        )
    return Group(table, Text("last events:", style="bold") if snap.events else Text(""), events)


def _bar_cell(bar: ProgressBar, done: int) -> RenderableType:
    grid = Table.grid(padding=(0, 1))
    grid.add_row(bar, Text(f"{done}/{len(LADDER)}", style="dim"))
    return grid


def plain_line(r: HostLine, now: datetime.datetime) -> str:
    stamp = now.astimezone().strftime("%H:%M:%S")
    return (
        f"[{stamp}] {r.name:<18} {r.state:<16} {r.step:<11} {r.steps_done()}/{len(LADDER)} "
        f"machine={r.consumer:<22} node={r.node:<16} GPUReady={r.gpu_ready}"
    )


class View:
    """Draws snapshots: in place on a terminal, else one line per host change and per new Event."""

    def __init__(self, out: TextIO | None = None, title: str = "hosts", live: bool | None = None) -> None:
        self._console = Console(file=out or sys.stdout)
        self._live_mode = self._console.is_terminal if live is None else live
        self._title = title
        self._live: Live | None = None
        self._seen_hosts: dict[str, tuple[str, ...]] = {}
        self._seen_events: set[str] = set()

    @property
    def in_place(self) -> bool:
        return self._live_mode

    def __enter__(self) -> View:
        if self._live_mode:
            self._live = Live(console=self._console, auto_refresh=False)  # prints during it go above it
            self._live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()  # leaves the last frame on screen, above whatever comes next
            self._live = None

    def show(self, snap: Snapshot, now: datetime.datetime | None = None) -> None:
        now = now or datetime.datetime.now(datetime.UTC)
        if self._live is not None:
            self._live.update(render(snap, now, self._title), refresh=True)
            return
        for line in self.changes(snap, now):
            print(line, file=self._console.file, flush=True)

    def changes(self, snap: Snapshot, now: datetime.datetime) -> Sequence[str]:
        """The lines the plain mode prints for this snapshot: only what differs from the last one."""
        lines = []
        for r in snap.hosts:
            if self._seen_hosts.get(r.name) != r.key:
                self._seen_hosts[r.name] = r.key
                lines.append(plain_line(r, now))
        for e in snap.events:
            if e.uid not in self._seen_events:
                self._seen_events.add(e.uid)
                lines.append(f"           event {e.kind}/{e.name} {e.reason}: {e.message}")
        return lines
