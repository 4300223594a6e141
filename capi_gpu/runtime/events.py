"""Events and log lines, with secrets kept out: every message passes ``redact`` first.

Messages come from Robot, ssh, installimage and Ansible output; any of them could echo a key block or a
password. Known secret values are replaced by name, PEM blocks by a marker, and long text is cut.
Host status gets the same treatment (``redact_status``): an installimage log tail, a debug.txt excerpt or
a command's stderr lands in ``errorMessage``, an operation's outcome and the Ready condition, and status
is readable by anyone who may list hosts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from capi_gpu import logs
from capi_gpu.api.host import HetznerGPUHostStatus

log = logging.getLogger(__name__)


def redact(text: str, secrets: Iterable[str] = (), limit: int = 1024) -> str:
    text = logs.redact(text)
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[redacted]")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def redact_status(status: HetznerGPUHostStatus, secrets: Iterable[str] = ()) -> HetznerGPUHostStatus:
    """``status`` with every free-text field (error message, operation outcomes, condition messages)
    redacted. Idempotent, so a status read back and written again compares equal."""
    secrets = list(secrets)
    out = status.model_copy(deep=True)
    if out.error_message is not None:
        out.error_message = redact(out.error_message, secrets, limit=2000)
    for op in out.operations:
        if op.outcome is not None:
            op.outcome = redact(op.outcome, secrets, limit=200)
    for cond in out.conditions:
        cond.message = redact(cond.message, secrets, limit=2000)
    return out


def emit(obj: Mapping[str, Any], reason: str, message: str, warning: bool = False, secrets: Iterable[str] = ()) -> None:
    """One Event on ``obj`` (posted by kopf's background poster; never blocks a reconcile)."""
    meta = obj.get("metadata", {})
    body: Any = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
    }
    text = redact(message, secrets)
    try:
        kopf.event(kopf.Body(body), type="Warning" if warning else "Normal", reason=reason, message=text)
    except LookupError:  # outside a running operator (CLI, tests): the log is the record
        log.info("event %s/%s %s: %s", meta.get("namespace"), meta.get("name"), reason, text)
