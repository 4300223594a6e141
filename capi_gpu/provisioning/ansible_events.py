"""ansible-runner's event stream, turned into the few typed facts the controller acts on.

Why a separate, pure module: the event dicts are ansible-runner's (loosely documented, nested, with
per-item duplicates for loops), while the controller needs four things — which task is running (for
a progress condition and Events), which role and task failed and why (for the error condition),
whether the play asked for a reboot, and the counts. Folding the stream here, with no I/O, keeps the
runner adapter thin and lets the parsing be tested from recorded events.

Failure messages are sanitized before they leave this module: ANSI colour, private-key blocks and
any caller-supplied secret string are removed, and the text is bounded, because it ends up in
conditions and Events.

Reboot contract (see ``playbooks/roles/reboot_request``): the play records run-wide ``set_stats``
data ``{capi_gpu_reboot_needed: true, capi_gpu_reboot_reason: <reason>}``, which ansible-runner puts
into the ``playbook_on_stats`` event as ``artifact_data``, and ends the host cleanly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

REBOOT_STATS_KEY: Final = "capi_gpu_reboot_needed"
REBOOT_REASON_KEY: Final = "capi_gpu_reboot_reason"

# Roles that only help the site roles; a failure inside one is reported under the role that called it.
HELPER_ROLES: Final = frozenset({"apt_source", "reboot_request"})

MESSAGE_LIMIT: Final = 480

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|$)", re.S)
_HOST_KEY_FAILURE = ("host key verification failed", "remote host identification has changed")


class TaskPhase(StrEnum):
    STARTED = "started"
    OK = "ok"
    CHANGED = "changed"
    SKIPPED = "skipped"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


class RunStatus(StrEnum):
    SUCCEEDED = "Succeeded"
    REBOOT_NEEDED = "RebootNeeded"
    """The play stopped cleanly and asks the controller to reboot the host, then run it again."""
    FAILED = "Failed"
    """A task failed: ``PlaybookResult.failed`` names the role and task."""
    UNREACHABLE = "Unreachable"
    HOST_KEY_MISMATCH = "HostKeyMismatch"
    """ssh refused the host: its key is not the pinned one. Never retried blindly."""
    TIMED_OUT = "TimedOut"
    CANCELED = "Canceled"
    ERROR = "Error"
    """ansible-playbook itself failed (syntax, missing role, runner setup) before or outside a task."""


@dataclass(frozen=True)
class TaskEvent:
    """One step of the play, as the controller shows it (Events, a progress condition)."""

    phase: TaskPhase
    role: str
    task: str
    host: str = ""
    message: str = ""
    ignored: bool = False

    @property
    def label(self) -> str:
        return f"{self.role}: {self.task}" if self.role else self.task


@dataclass(frozen=True)
class FailedTask:
    role: str
    task: str
    message: str
    unreachable: bool = False

    @property
    def label(self) -> str:
        return f"{self.role}: {self.task}" if self.role else self.task


@dataclass(frozen=True)
class HostStats:
    ok: int = 0
    changed: int = 0
    failures: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass(frozen=True)
class PlaybookResult:
    """What one run of site.yml came to; small enough to put (minus ``artifacts``) into status."""

    status: RunStatus
    stats: HostStats
    artifacts: Path
    duration_s: float
    failed: FailedTask | None = None
    reboot_reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.SUCCEEDED

    @property
    def reboot_needed(self) -> bool:
        return self.status is RunStatus.REBOOT_NEEDED

    @property
    def changed(self) -> int:
        return self.stats.changed


def sanitize(text: str, secrets: Iterable[str] = (), limit: int = MESSAGE_LIMIT) -> str:
    """One line of at most ``limit`` characters, without colour codes, key blocks or ``secrets``."""
    text = _PEM.sub("[redacted private key]", _ANSI.sub("", text))
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_message(res: Mapping[str, Any]) -> str:
    """The useful part of a failed module result: msg, then stderr (or stdout), per failed loop item."""
    items = res.get("results")
    if isinstance(items, list):
        failed_items = [i for i in items if isinstance(i, Mapping) and i.get("failed")]
        if failed_items:
            return "; ".join(failure_message(i) for i in failed_items[:3])
    parts = []
    msg = res.get("msg")
    if msg:
        parts.append(str(msg))
    for key in ("stderr", "module_stderr", "stdout"):
        value = res.get(key)
        if value and str(value).strip() and str(value).strip() not in parts:
            parts.append(str(value).strip()[-600:])
            break
    if not parts and "rc" in res:
        parts.append(f"rc={res['rc']}")
    return ": ".join(parts) or "failed"


@dataclass
class EventFolder:
    """Folds ansible-runner events into TaskEvents and, at the end, one PlaybookResult."""

    secrets: tuple[str, ...] = ()
    _role: str = ""
    _failed: FailedTask | None = None
    _stats: HostStats = field(default_factory=HostStats)
    _artifact_data: dict[str, Any] = field(default_factory=dict)
    _saw_stats: bool = False

    def fold(self, event: Mapping[str, Any]) -> TaskEvent | None:
        """Take one event; return the TaskEvent it means to the controller, if any."""
        kind = str(event.get("event", ""))
        data = event.get("event_data") or {}
        if kind == "playbook_on_stats":
            self._take_stats(data)
            return None
        phase = _phase(kind, data)
        if phase is None:
            return None
        role, task = self._attribute(str(data.get("role") or ""), str(data.get("task") or ""), phase)
        host = str(data.get("host") or "")
        res = data.get("res") or {}
        message, ignored = "", bool(data.get("ignore_errors"))
        if phase in (TaskPhase.FAILED, TaskPhase.UNREACHABLE):
            message = sanitize(failure_message(res), self.secrets)
            if not ignored and self._failed is None:
                self._failed = FailedTask(role, task, message, phase is TaskPhase.UNREACHABLE)
        return TaskEvent(phase, role, task, host, message, ignored)

    def _attribute(self, role: str, task: str, phase: TaskPhase) -> tuple[str, str]:
        if role in HELPER_ROLES:
            return self._role, f"{role} / {task}"
        if phase is TaskPhase.STARTED:
            self._role = role
        return role, task

    def _take_stats(self, data: Mapping[str, Any]) -> None:
        self._saw_stats = True

        def total(key: str) -> int:
            per_host = data.get(key) or {}
            return sum(int(v) for v in per_host.values()) if isinstance(per_host, Mapping) else 0

        self._stats = HostStats(
            ok=total("ok"),
            changed=total("changed"),
            failures=total("failures"),
            unreachable=total("dark"),
            skipped=total("skipped"),
            rescued=total("rescued"),
            ignored=total("ignored"),
        )
        artifact = data.get("artifact_data")
        self._artifact_data = dict(artifact) if isinstance(artifact, Mapping) else {}

    def result(self, runner_status: str, artifacts: Path, duration_s: float, tail: str = "") -> PlaybookResult:
        """The run's result, from the folded events and ansible-runner's final status string."""
        status, failed = self._status(runner_status, tail)
        reason = str(self._artifact_data.get(REBOOT_REASON_KEY, "")) if status is RunStatus.REBOOT_NEEDED else ""
        return PlaybookResult(status, self._stats, artifacts, duration_s, failed, reason)

    def _status(self, runner_status: str, tail: str) -> tuple[RunStatus, FailedTask | None]:
        if runner_status == "timeout":
            return RunStatus.TIMED_OUT, self._failed
        if runner_status == "canceled":
            return RunStatus.CANCELED, self._failed
        if self._failed is not None:
            if self._failed.unreachable:
                lowered = self._failed.message.lower()
                if any(marker in lowered for marker in _HOST_KEY_FAILURE):
                    return RunStatus.HOST_KEY_MISMATCH, self._failed
                return RunStatus.UNREACHABLE, self._failed
            return RunStatus.FAILED, self._failed
        if runner_status != "successful" or not self._saw_stats:
            return RunStatus.ERROR, FailedTask("", "ansible-playbook", sanitize(tail or runner_status, self.secrets))
        if self._artifact_data.get(REBOOT_STATS_KEY) is True:
            return RunStatus.REBOOT_NEEDED, None
        return RunStatus.SUCCEEDED, None


def _phase(kind: str, data: Mapping[str, Any]) -> TaskPhase | None:
    if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
        return TaskPhase.STARTED
    if kind == "runner_on_ok":
        res = data.get("res") or {}
        return TaskPhase.CHANGED if isinstance(res, Mapping) and res.get("changed") else TaskPhase.OK
    if kind == "runner_on_skipped":
        return TaskPhase.SKIPPED
    if kind == "runner_on_failed":
        return TaskPhase.FAILED
    if kind == "runner_on_unreachable":
        return TaskPhase.UNREACHABLE
    return None
