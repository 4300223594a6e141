"""Who runs Configure on a server when its host object moves between management clusters mid-run. Pure.

Configure (Ansible: apt, a DKMS driver build, the MIG layout) runs 10 minutes and more on a real GEX131,
longer than clusterctl v1.14 waits for ``block-move`` (5 s growing by 1.5, 10 tries: about 6 minutes per
object; then the move fails and leaves the source Cluster paused, so the next try refuses). So Configure
does not block a move. The server itself says who runs it: before each run the operator writes a marker on
the host (``MARKER``) naming the run (its operation's ``requestedAt``, recorded in status and so in the
snapshot a move carries), the host object's uid, and the run's deadline; after the run, its outcome. A paused
source finishes its run and records it; the host object that arrives on the target has a new uid, and finds:

- the marker running under another uid, before its deadline: it waits, runs nothing;
- the marker finished, for a run its own status recorded (the snapshot carried it): it adopts that outcome,
  so Configure runs once across the move;
- otherwise (no marker, our own uid, past the deadline, a failed or unknown run): it runs. Our own uid with
  the marker still "running" is a run that died with the controller that started it (the runner is a child
  of the operator's process), as after any crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

MARKER = "/var/lib/capi-gpu/configure-run.json"


class RunState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    REBOOT_NEEDED = "reboot-needed"
    FAILED = "failed"


@dataclass(frozen=True)
class Marker:
    run: str  # the run's operation requestedAt, ISO 8601
    holder: str  # the uid of the host object whose controller runs it
    until: datetime  # no run outlives the runner's timeout
    state: RunState
    message: str = ""


def run_id(requested_at: datetime) -> str:
    return requested_at.isoformat()


def render(marker: Marker) -> str:
    return json.dumps(
        {
            "run": marker.run,
            "holder": marker.holder,
            "until": marker.until.isoformat(),
            "state": marker.state.value,
            "message": marker.message[:500],
        },
        sort_keys=True,
    )


def parse(text: str | None) -> Marker | None:
    """The marker a file holds; None when there is none or it is not one (then the next run overwrites it)."""
    if not text:
        return None
    try:
        body = json.loads(text)
        return Marker(
            run=str(body["run"]),
            holder=str(body["holder"]),
            until=datetime.fromisoformat(str(body["until"])),
            state=RunState(body["state"]),
            message=str(body.get("message", ""))[:500],
        )
    except (ValueError, KeyError, TypeError):
        return None


def starting(run: str, holder: str, now: datetime, timeout_s: float) -> Marker:
    return Marker(run, holder, now + timedelta(seconds=timeout_s), RunState.RUNNING)


@dataclass(frozen=True)
class Run:
    """Nobody else runs it: run now."""


@dataclass(frozen=True)
class Wait:
    until: datetime
    message: str


@dataclass(frozen=True)
class Adopt:
    reboot_needed: bool
    message: str


Verdict = Run | Wait | Adopt


def _deadline(marker: Marker, timeout_s: float) -> datetime | None:
    """When the marked run is over at the latest: its own ``until``, but never later than its start (the run
    id) plus this operator's runner timeout, so a marker with a far ``until`` can't hold a host forever. None:
    the run id is not a time, not a marker we wrote."""
    try:
        started = datetime.fromisoformat(marker.run)
    except ValueError:
        return None
    if started.tzinfo is None:
        return None
    return min(marker.until, started + timedelta(seconds=timeout_s))


def verdict(
    marker: Marker | None, holder: str, recorded: frozenset[str], run: str, now: datetime, timeout_s: float
) -> Verdict:
    """What this run does, given the server's marker. ``holder``: this host object's uid; ``recorded``: the
    run ids of the Configure operations this host's status holds for the current step; ``run``: this one's;
    ``timeout_s``: the runner's timeout, the longest any run lasts."""
    if marker is None or marker.holder == holder or marker.run == run:
        return Run()
    if marker.state is RunState.RUNNING:
        until = _deadline(marker, timeout_s)
        if until is not None and now < until:
            return Wait(
                until,
                f"an Ansible run started at {marker.run} by the host object this one was moved from (uid "
                f"{marker.holder}) may still be running on the server; waiting for it to finish (at the latest "
                f"{until.isoformat()}, its runner's timeout) instead of running Configure a second time",
            )
        return Run()
    if marker.run in recorded and marker.state in (RunState.DONE, RunState.REBOOT_NEEDED):
        return Adopt(
            marker.state is RunState.REBOOT_NEEDED,
            f"the Ansible run started at {marker.run} before the move finished on the server "
            f"({marker.state.value}); its outcome is adopted, not run again",
        )
    return Run()
