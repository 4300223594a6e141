"""The apiserver's audit log, limited to writes to our kinds: who changed which object, and when.

Tests use it to attribute a change they observed (the clusterctl move e2e: a paused object changed; was it
our operator, or CAPI's MachineSet controller, which server-side-applies labels and annotations to
InfraMachines, or clusterctl?). Metadata level only: no request bodies, so Secrets never reach the file.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capi_gpu import domain

OPERATOR_USER = "system:serviceaccount:capi-gpu-system:capi-gpu-controller-manager"

# Our group's and CAPI core's writes at Metadata level (the move e2e attributes every change to a paused
# Machine, MachineSet or MachineDeployment to its writer: without CAPI's group, clusterctl's delete-for-move
# mark was nobody's and so counted as the operator's), and every request of the release's operator (its ServiceAccount:
# a Forbidden anywhere is a rule the shipped RBAC lacks); nothing else (RequestReceived is dropped:
# ResponseComplete carries the outcome and the time the change was committed).
POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: {domain.GROUP}
  - group: {domain.CAPI_GROUP}
- level: Metadata
  users: [{OPERATOR_USER}]
- level: None
"""


@dataclass(frozen=True)
class Write:
    at: float  # epoch seconds, when the apiserver finished the request
    user: str
    agent: str
    verb: str
    resource: str  # plural, with "/status" for the subresource
    namespace: str
    name: str
    code: int


def flags(workdir: Path) -> list[str]:
    policy = workdir / "audit-policy.yaml"
    policy.write_text(POLICY)
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log_path(workdir)}", "--audit-log-maxbackup=0"]


@dataclass(frozen=True)
class Response:
    user: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int
    message: str
    # RFC 3339 with microseconds, as the apiserver writes them: when it got the request, and when it answered.
    received: str = ""
    answered: str = ""


def _completed(path: Path) -> Iterator[dict[str, Any]]:
    """The ResponseComplete events, oldest first; a line the apiserver is still writing is skipped."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("stage") == "ResponseComplete":
            yield event


def responses(path: Path) -> list[Response]:
    """Every completed request the policy logs, whatever its outcome (``writes`` keeps the successes)."""
    out: list[Response] = []
    for event in _completed(path):
        ref, status = event.get("objectRef") or {}, event.get("responseStatus") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        out.append(
            Response(
                user=str((event.get("user") or {}).get("username", "")),
                verb=str(event.get("verb", "")),
                resource=f"{ref.get('resource', '')}{sub}",
                namespace=str(ref.get("namespace", "")),
                name=str(ref.get("name", "")),
                code=int(status.get("code") or 0),
                message=str(status.get("message", "")),
                received=str(event.get("requestReceivedTimestamp", "")),
                answered=str(event.get("stageTimestamp", "")),
            )
        )
    return out


def cut_by_client(r: Response, at: dt.datetime) -> bool:
    """A request its client had in flight when it died at ``at``: the apiserver answers 504 "context
    canceled" once the connection drops. That is the kill a test ordered, not a write the apiserver refused."""
    if r.code != 504 or "context canceled" not in r.message or not r.received:
        return False
    received = dt.datetime.fromisoformat(r.received)
    answered = dt.datetime.fromisoformat(r.answered or r.received)
    slack = dt.timedelta(seconds=1)  # the test's clock against the apiserver's log line
    return received <= at + slack and answered >= at - slack


def log_path(workdir: Path) -> Path:
    return workdir / "audit.log"


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def writes(path: Path) -> list[Write]:
    """Successful writes, oldest first; a line the apiserver is still writing is skipped. Only writes: the
    policy also keeps every read of the operator's ServiceAccount (``responses``), and a GET counted as a
    write made the move e2e blame the operator for clusterctl's delete of a paused host."""
    out: list[Write] = []
    for event in _completed(path):
        ref, code = event.get("objectRef") or {}, int((event.get("responseStatus") or {}).get("code") or 0)
        if not 200 <= code < 300 or event.get("verb") not in WRITE_VERBS:
            continue
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        out.append(
            Write(
                at=dt.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp(),
                user=str((event.get("user") or {}).get("username", "")),
                agent=str(event.get("userAgent", "")),
                verb=str(event.get("verb", "")),
                resource=f"{ref.get('resource', '')}{sub}",
                namespace=str(ref.get("namespace", "")),
                name=str(ref.get("name", "")),
                code=code,
            )
        )
    return out
