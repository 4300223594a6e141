"""The server side of Configure's hand-over across a move: read the run marker before a run, write it around
the run. The decision is ``provisioning.handover``'s; this is the SSH around it."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.controllers.host_context import HostEnv, hostname
from capi_gpu.controllers.host_probes import open_shell, os_pin
from capi_gpu.provisioning import handover, ssh
from capi_gpu.provisioning.model import ActionKind
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)


def current_run(host: HetznerGPUHost, now: datetime) -> tuple[str, frozenset[str]]:
    """This run's id (the Configure operation the pass recorded before acting) and every Configure run the
    host's status recorded in the current step (a restored snapshot's included)."""
    since = host.status.step_started_at
    ops = [
        op
        for op in host.status.operations
        if op.name == ActionKind.CONFIGURE.value and (since is None or op.requested_at >= since)
    ]
    open_ = [op for op in ops if op.outcome is None]
    run = handover.run_id(open_[-1].requested_at if open_ else now)
    return run, frozenset(handover.run_id(op.requested_at) for op in ops)


def check(deps: Deps, host: HetznerGPUHost, env: HostEnv, run: str, recorded: frozenset[str]) -> handover.Verdict:
    """Blocking (SSH): the verdict on the server's marker. Raises ``ssh.SSHError`` when it can't be read."""
    shell = open_shell(deps, host, env, os_pin(env.os_key.public))
    try:
        marker = handover.parse(shell.read_file(handover.MARKER))
    finally:
        with contextlib.suppress(Exception):
            shell.close()
    return handover.verdict(marker, _uid(host), recorded, run, deps.clock(), deps.settings.ansible_timeout_s)


def mark(deps: Deps, host: HetznerGPUHost, env: HostEnv, marker: handover.Marker) -> bool:
    """Blocking (SSH): write the marker; False (logged) when the server can't be reached. A run not marked
    as started is not one a moved host would wait for; an outcome not marked is run again after a move."""
    try:
        shell = open_shell(deps, host, env, os_pin(env.os_key.public))
        try:
            shell.write_file(handover.MARKER, handover.render(marker), 0o644, parents=True)
        finally:
            with contextlib.suppress(Exception):
                shell.close()
    except ssh.SSHError as exc:
        log.warning("host %s: could not write the Configure run marker (%s): %s", hostname(host), marker.state, exc)
        return False
    return True


def starting(deps: Deps, host: HetznerGPUHost, run: str) -> handover.Marker:
    return handover.starting(run, _uid(host), deps.clock(), deps.settings.ansible_timeout_s)


def _uid(host: HetznerGPUHost) -> str:
    return str(host.metadata.get("uid", ""))
