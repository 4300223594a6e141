"""One container as a process: started in its own mount namespace with its volumes bind-mounted at their
mount paths, in a cgroup of its own (so a kill ends everything it started), probed with the manifest's
periods and thresholds, and restarted with the kubelet's back-off (at once after the first exit, then
10 s doubling to 5 min, reset after 10 min running).

What is not a container here: the process shares the machine's network namespace (the pod's IP is a
loopback address the runner hands out, and a listener must bind it: see docs/pod-runner.md), its root
filesystem (runAsUser and readOnlyRootFilesystem are not enforced) and its PID namespace.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from capi_gpu_sim.hosts import cgroups
from capi_gpu_sim.pods import probes
from capi_gpu_sim.pods.podspec import Probe

log = logging.getLogger(__name__)
BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0


@dataclass
class Launch:
    """Everything needed to (re)start the process; ``prepare`` refreshes volumes and may rebuild it."""

    argv: list[str]
    env: dict[str, str]
    binds: list[tuple[Path, str]]  # (host directory, mount path), parents first
    cwd: Path
    log_path: Path
    cgroup: str
    prefix: list[str] = field(default_factory=list)  # e.g. nsenter into the pod's network namespace
    keep: list[Path] = field(default_factory=list)  # the image's files on the machine, visible whatever is mounted
    stage: Path = Path("/run/capigpu-pods/stage")  # where ``keep`` paths are bound aside meanwhile


@dataclass
class State:
    running: bool = False
    ready: bool = False
    started_at: float = 0.0
    restarts: int = 0
    waiting_reason: str = ""
    last_exit: int | None = None
    last_reason: str = ""
    history: list[str] = field(default_factory=list)


def wrapped(launch: Launch) -> list[str]:
    """The argv run under ``unshare --mount``: join the cgroup, bind the volumes, exec the program."""
    script = ['echo $$ > "$CG/cgroup.procs"']
    # The image's own files live on the machine (the checkout, its venv): a volume mounted over a path above
    # them (an emptyDir on /tmp, where a CI clone lives) would hide them, so each is bound aside first and
    # put back at its own path after the volumes.
    covered = [k for k in launch.keep if any(k == Path(t) or Path(t) in k.parents for _, t in launch.binds)]
    for i, keep in enumerate(covered):
        stage = shlex.quote(str(launch.stage / str(i)))
        script.append(f"mkdir -p {stage} && mount --bind {shlex.quote(str(keep))} {stage}")
    for source, target in launch.binds:
        src, dst = shlex.quote(str(source)), shlex.quote(target)
        script.append(f"{{ [ -e {dst} ] || mkdir -p {dst}; }} && mount --bind {src} {dst}")
    for i, keep in enumerate(covered):
        dst = shlex.quote(str(keep))
        script.append(f"mkdir -p {dst} && mount --bind {shlex.quote(str(launch.stage / str(i)))} {dst}")
    script.append('exec "$@"')
    return [
        *launch.prefix,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-ec",
        "; ".join(script),
        "sh",
        *launch.argv,
    ]


class Container:
    def __init__(
        self,
        name: str,
        pod_ip: str,
        launch: Callable[[], Launch],
        liveness: Probe | None,
        readiness: Probe | None,
        startup: Probe | None,
        grace_s: float,
        changed: Callable[[], None],
        backoff_scale: float = 1.0,
    ) -> None:
        self.name, self.pod_ip = name, pod_ip
        self._launch, self._changed = launch, changed
        self.liveness, self.readiness, self.startup = liveness, readiness, startup
        self.grace_s = grace_s
        self.backoff_scale = backoff_scale
        self.state = State()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroup = ""
        # Held by crash() while it empties the cgroup, and by the restart while it spawns: cgroups.kill loops
        # until the cgroup is empty, so a restart at once (the first back-off is 0) used to land in the cgroup
        # mid-kill and be killed too: two restarts for one crash, which a test read as one "by itself".
        self._spawn = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"container-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_s: float | None = None) -> None:
        self._stop.set()
        self._kill(self.grace_s if grace_s is None else grace_s)
        self._thread.join(timeout=30)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _set(self, **changes: object) -> None:
        before = (self.state.running, self.state.ready, self.state.restarts, self.state.waiting_reason)
        for k, v in changes.items():
            setattr(self.state, k, v)
        if before != (self.state.running, self.state.ready, self.state.restarts, self.state.waiting_reason):
            self._changed()

    def _loop(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            launch = self._launch()
            with self._spawn, launch.log_path.open("ab") as out:
                self._cgroup = launch.cgroup
                cgroups.kill(cgroups.ensure(launch.cgroup))
                self._proc = subprocess.Popen(
                    wrapped(launch),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**launch.env, "CG": str(cgroups.path_for(launch.cgroup))},
                    cwd=launch.cwd,
                    start_new_session=True,
                )
            started = time.monotonic()
            self._set(running=True, ready=False, started_at=time.time(), waiting_reason="")
            reason = self._supervise(started)
            code = self._proc.wait()
            cgroups.kill(cgroups.path_for(launch.cgroup))
            self.state.history.append(f"{time.time():.1f} exit {code} {reason}")
            if self._stop.is_set():
                self._set(running=False, ready=False, last_exit=code, last_reason=reason)
                return
            if time.monotonic() - started > BACKOFF_RESET_S:
                backoff = 0.0
            self._set(
                running=False,
                ready=False,
                last_exit=code,
                last_reason=reason,
                restarts=self.state.restarts + 1,
                waiting_reason="CrashLoopBackOff" if backoff else "",
            )
            log.info("container %s exited %s (%s); restart in %.0fs", self.name, code, reason, backoff)
            if self._stop.wait(backoff):
                return
            start, most = BACKOFF_START_S * self.backoff_scale, BACKOFF_MAX_S * self.backoff_scale
            backoff = min(most, start if not backoff else backoff * 2)

    def _supervise(self, started: float) -> str:
        """Probe until the process exits or liveness fails; returns why it ended."""
        assert self._proc is not None
        live_fail = ready_ok = ready_fail = 0
        started_ok = self.startup is None
        next_live = started + (self.liveness.initial_delay if self.liveness else 0)
        next_ready = started + (self.readiness.initial_delay if self.readiness else 0)
        next_start = started + (self.startup.initial_delay if self.startup else 0)
        while self._proc.poll() is None and not self._stop.is_set():
            now = time.monotonic()
            if not started_ok and self.startup is not None and now >= next_start:
                next_start = now + self.startup.period
                if probes.attempt(self.startup, self.pod_ip):
                    started_ok = True
                else:
                    live_fail += 1
                    if live_fail >= self.startup.failure_threshold:
                        self._kill(self.grace_s)
                        return "startup probe failed"
            if started_ok and self.liveness is not None and now >= next_live:
                next_live = now + self.liveness.period
                live_fail = 0 if probes.attempt(self.liveness, self.pod_ip) else live_fail + 1
                if live_fail >= self.liveness.failure_threshold:
                    log.info("container %s: liveness failed %d times; killing", self.name, live_fail)
                    self._kill(self.grace_s)
                    return "liveness probe failed"
            if started_ok and now >= next_ready:
                if self.readiness is None:
                    self._set(ready=True)
                    next_ready = float("inf")
                else:
                    next_ready = now + self.readiness.period
                    if probes.attempt(self.readiness, self.pod_ip):
                        ready_ok, ready_fail = ready_ok + 1, 0
                        if ready_ok >= self.readiness.success_threshold:
                            self._set(ready=True)
                    else:
                        ready_ok, ready_fail = 0, ready_fail + 1
                        if ready_fail >= self.readiness.failure_threshold:
                            self._set(ready=False)
            self._stop.wait(0.2)
        return "stopped" if self._stop.is_set() else "exited"

    def _kill(self, grace_s: float) -> None:
        """SIGTERM, then after ``grace_s`` everything in the cgroup gets SIGKILL (the runtime's stop)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            cgroups.kill(cgroups.path_for(self._cgroup))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the container's main process only (tests: SIGTERM, a graceful exit the kubelet
        then restarts as it restarts any exit under restartPolicy Always)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    def crash(self) -> None:
        """SIGKILL the process tree now, as a node's OOM killer or a `kill -9` would (tests)."""
        with self._spawn:
            if self._cgroup:
                cgroups.kill(cgroups.path_for(self._cgroup))
