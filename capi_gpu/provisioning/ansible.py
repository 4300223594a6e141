"""Running the node playbook (site.yml) on one host through ansible-runner, with a pinned host key.

Why this shape: the controller needs one meaningful operation, "prepare this node with these vars",
and a small typed answer (``ansible_events.PlaybookResult``); everything about ansible-runner's
private data dir, inventory, environment and event stream stays inside ``AnsibleRunner``. The
``PlaybookRunner`` Protocol is what controllers depend on; tests wire a simulator in its place.

Security properties, each one tested:

* **Every SSH connection checks the pinned host key**: the run gets its own ``known_hosts`` holding
  only the pinned OS key, and ssh runs with ``StrictHostKeyChecking=yes`` and that file as the only
  known-hosts file. The operator's environment cannot switch checking off (inherited ``ANSIBLE_*``
  variables are dropped), and ssh master connections live in a per-run directory, so a connection
  to an earlier boot target (rescue, other key) is never reused.
* **The private key never touches the artifacts**: it is handed to ansible-runner in memory
  (``suppress_env_files``), which passes it through a fifo to ``ssh-agent``; the fifo is gone once
  ``ssh-add`` has read it. The environment recorded in the artifacts is reduced to what the run set
  plus a short allowlist, so operator secrets in the process environment don't land on disk.
* **Every extra var is data, never a template**: ``ansible_data.write_extravars`` is the only writer of the
  run's extra vars (tagged ``!unsafe``), so a spec string like ``{{ lookup('pipe', …) }}`` reaches the play
  as that string and runs nothing on the operator.
* Failure messages are sanitized (``ansible_events.sanitize``) with the key as a known secret.

Artifacts are kept per host and run (``<root>/<host>/<run id>/``), the newest ``keep_runs`` of each.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import ansible_runner

from capi_gpu.provisioning import ansible_data, ansible_events, playbook_vars

EventSink = Callable[[ansible_events.TaskEvent], None]

HOST_KEY_TYPES: Final = frozenset(
    {"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"}
)
# What an ansible-playbook run may inherit from the operator's environment; everything else it gets
# is set explicitly below.
ENV_ALLOWLIST: Final = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME"})
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def default_playbook_dir() -> Path:
    """The repository's playbooks/ (the container image copies them to the same relative place)."""
    return Path(__file__).resolve().parents[2] / "playbooks"


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to run: a host's address, its pinned OS host key and the private key."""

    name: str
    """Inventory name and artifacts directory: the HetznerGPUHost name."""
    address: str
    host_key: str
    """The pinned OS host key, ``<type> <base64>`` (as in known_hosts, without the host field)."""
    private_key: str = field(repr=False)
    port: int = 22
    user: str = "root"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"target name {self.name!r} is not a DNS-label-like name")
        if not 0 < self.port < 65536:
            raise ValueError(f"bad port {self.port}")
        known_hosts_line(self.address, self.port, self.host_key)  # validates the key


def known_hosts_line(address: str, port: int, host_key: str) -> str:
    """The one known_hosts line for the pinned key; refuses anything that is not one plain key."""
    parts = host_key.split()
    if len(parts) < 2 or parts[0] not in HOST_KEY_TYPES:
        raise ValueError("host key must be '<type> <base64>' with a supported type")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error as exc:
        raise ValueError("host key is not base64") from exc
    if len(blob) < 4 or blob[4 : 4 + len(parts[0])] != parts[0].encode():
        raise ValueError("host key blob does not match its type")
    if not re.fullmatch(r"[A-Za-z0-9.:-]+", address):
        raise ValueError(f"bad address {address!r}")
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {parts[0]} {parts[1]}\n"


class PlaybookRunner(Protocol):
    """Runs site.yml on one host. ``on_event`` is called on the event loop for each task step."""

    async def prepare_node(
        self, target: SSHTarget, variables: playbook_vars.PlaybookVars, on_event: EventSink | None = None
    ) -> ansible_events.PlaybookResult: ...


@dataclass(frozen=True)
class AnsibleRunner:
    """The real PlaybookRunner, on ansible-runner and the venv's ansible-playbook."""

    artifacts_root: Path
    playbook_dir: Path = field(default_factory=default_playbook_dir)
    playbook: str = "site.yml"
    keep_runs: int = 10
    timeout_s: int = 3600
    connect_timeout_s: int = 30
    python_interpreter: str = "/usr/bin/python3"
    connection: Literal["ssh", "local"] = "ssh"
    """``local`` only for the runner's own tests (a trivial playbook on the test machine)."""
    check_mode: bool = False
    """``--check``: predict the changes and make none (a drift check on a provisioned node)."""
    parallel: int = 10
    """Runs at once (``Settings.ansible_parallel``). Each holds a thread for minutes, so they get their own
    pool: in the loop's default executor (6 threads on 2 CPUs) six runs starved every other host's SSH step."""
    _pool: ThreadPoolExecutor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="ansible")
        object.__setattr__(self, "_pool", pool)

    async def prepare_node(
        self, target: SSHTarget, variables: playbook_vars.PlaybookVars, on_event: EventSink | None = None
    ) -> ansible_events.PlaybookResult:
        return await self.run_playbook(target, variables.extra_vars(), on_event)

    async def run_playbook(
        self, target: SSHTarget, extra_vars: Mapping[str, Any], on_event: EventSink | None = None
    ) -> ansible_events.PlaybookResult:
        """Run ``self.playbook`` off the event loop; cancelling the caller cancels the run."""
        loop = asyncio.get_running_loop()
        cancel = threading.Event()

        def sink(event: ansible_events.TaskEvent) -> None:
            if on_event is not None:
                loop.call_soon_threadsafe(on_event, event)

        future = loop.run_in_executor(self._pool, self.run_blocking, target, dict(extra_vars), sink, cancel)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def run_blocking(
        self,
        target: SSHTarget,
        extra_vars: dict[str, Any],
        on_event: EventSink | None = None,
        cancel: threading.Event | None = None,
    ) -> ansible_events.PlaybookResult:
        """The synchronous run; ``on_event`` is called from this thread."""
        run_dir = self._new_run_dir(target.name)
        control_dir = Path(tempfile.mkdtemp(prefix="cgcp-"))
        folder = ansible_events.EventFolder(secrets=(target.private_key.strip(),))
        started = time.monotonic()

        def handle(event: dict[str, Any]) -> bool:
            step = folder.fold(event)
            if step is not None and on_event is not None:
                on_event(step)
            return True

        envvars = self._envvars(run_dir, control_dir)
        try:
            self._write_private_data(run_dir, target, extra_vars)
            runner = ansible_runner.interface.init_runner(
                private_data_dir=str(run_dir),
                project_dir=str(self.playbook_dir),
                playbook=self.playbook,
                inventory=str(run_dir / "inventory" / "hosts.json"),
                ident="run",
                envvars=envvars,
                ssh_key=target.private_key,
                cmdline="--check" if self.check_mode else None,
                suppress_env_files=True,
                quiet=True,
                timeout=self.timeout_s,
                event_handler=handle,
                cancel_callback=lambda: cancel is not None and cancel.is_set(),
            )
            runner.config.env = _reduced_env(runner.config.env, os.environ, envvars)
            runner.run()
            status, tail = str(runner.status), _stdout_tail(run_dir / "artifacts" / "run" / "stdout")
        finally:
            _close_ssh_masters(control_dir)
            shutil.rmtree(control_dir, ignore_errors=True)
            self._prune(target.name)
        return folder.result(status, run_dir, time.monotonic() - started, tail)

    def _new_run_dir(self, host: str) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        run_dir = self.artifacts_root / host / f"{stamp}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True, mode=0o700)
        return run_dir

    def _write_private_data(self, run_dir: Path, target: SSHTarget, extra_vars: dict[str, Any]) -> None:
        known_hosts = run_dir / "known_hosts"
        _write_private(known_hosts, known_hosts_line(target.address, target.port, target.host_key))
        ssh_args = " ".join(
            [
                "-o StrictHostKeyChecking=yes",
                f"-o UserKnownHostsFile={known_hosts}",
                "-o GlobalKnownHostsFile=/dev/null",
                "-o CheckHostIP=no",
                "-o BatchMode=yes",
                "-o PasswordAuthentication=no",
                "-o KbdInteractiveAuthentication=no",
                f"-o ConnectTimeout={self.connect_timeout_s}",
            ]
        )
        host_vars = {
            "ansible_host": target.address,
            "ansible_port": target.port,
            "ansible_user": target.user,
            "ansible_connection": self.connection,
            "ansible_python_interpreter": self.python_interpreter,
            "ansible_ssh_common_args": ssh_args,
        }
        inventory = {"all": {"hosts": {target.name: host_vars}}}
        (run_dir / "inventory").mkdir(mode=0o700)
        _write_private(run_dir / "inventory" / "hosts.json", json.dumps(inventory, indent=2))
        ansible_data.write_extravars(run_dir, extra_vars)
        _write_private(run_dir / "ansible.cfg", "# capi-gpu: settings come from the environment\n")

    def _envvars(self, run_dir: Path, control_dir: Path) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {
            "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
            "ANSIBLE_CONFIG": str(run_dir / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(self.playbook_dir / "roles"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
            "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_TIMEOUT": str(self.connect_timeout_s),
            "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp"),
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "True",
            "ANSIBLE_FORCE_COLOR": "False",
            "ANSIBLE_DEPRECATION_WARNINGS": "False",
        }

    def _prune(self, host: str) -> None:
        runs = sorted(p for p in (self.artifacts_root / host).iterdir() if p.is_dir())
        for old in runs[: max(0, len(runs) - self.keep_runs)]:
            shutil.rmtree(old, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _reduced_env(env: Mapping[str, str], inherited: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """Drop what came unchanged from the operator's environment, except the allowlist and ours."""
    return {k: v for k, v in env.items() if k in ENV_ALLOWLIST or k in ours or inherited.get(k) != v}


def _stdout_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def _close_ssh_masters(control_dir: Path) -> None:
    """Stop this run's ssh master connections now instead of leaving them for ControlPersist."""
    for sock in control_dir.iterdir() if control_dir.exists() else ():
        subprocess.run(
            ["ssh", "-o", "ControlPath=" + str(sock), "-O", "exit", "capi-gpu-master"],
            capture_output=True,
            timeout=10,
            check=False,
        )
