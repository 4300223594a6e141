"""Running the add-ons playbook (playbooks/addons.yml) against one workload cluster's API.

Why a separate runner from ``ansible.AnsibleRunner``: this play talks to a Kubernetes API through
kubernetes.core (helm, k8s) on the operator's own machine, not to a host over SSH, so it has no host key
to pin and no private key to hide; what it must hide is the workload kubeconfig. The kubeconfig goes into
a 0600 file inside the run's private data dir and is deleted when the run ends, and its credentials are
sanitized out of every failure message. Its extra vars go through ``ansible_data`` like every run's, so
no spec value is ever rendered as a template on the operator. Controllers depend on the ``AddonsInstaller``
Protocol; its one operation is "make this cluster's add-ons be this", answered with a small typed ``AddonsOutcome``.

The failure classes are decided by ``classify`` from the failed task's name and message: a chart that
can't be fetched, values the chart refuses, a cluster API that does not answer, or anything else. Each
is retried by the caller; none leaves a half-installed state that blocks nodes, because the chart is
installed without ``--wait`` and a failed install leaves a release helm upgrades on the next run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

import ansible_runner
import yaml

from capi_gpu.provisioning import ansible_data, ansible_events
from capi_gpu.provisioning.ansible import ENV_ALLOWLIST, default_playbook_dir

PLAYBOOK: Final = "addons.yml"
DEFAULT_CHART_REF: Final = "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu"
DEFAULT_CHART_VERSION: Final = "0.4.1"
CHART_TASK: Final = "Install or upgrade NVIDIA's DRA driver chart"
# The venv's interpreter: kubernetes.core's modules need the kubernetes package installed there.
_INVENTORY: Final = {
    "all": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
}


class Failure(StrEnum):
    """Why an add-ons run failed; the condition reason on HetznerGPUCluster ``AddonsReady``."""

    CHART_UNAVAILABLE = "ChartUnavailable"
    VALUES_INVALID = "ChartValuesInvalid"
    CLUSTER_UNREACHABLE = "WorkloadClusterUnreachable"
    FAILED = "AddonsFailed"


@dataclass(frozen=True)
class AddonsRequest:
    """What the cluster's add-ons should be; its ``digest`` says whether a run is due again."""

    manage_dra_driver: bool = True
    chart_ref: str = DEFAULT_CHART_REF
    chart_version: str = DEFAULT_CHART_VERSION
    extra_values: dict[str, Any] = field(default_factory=dict)
    claim_namespaces: tuple[str, ...] = ("default",)
    gate_plugin_image: str = ""

    def extra_vars(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dra_driver_managed": self.manage_dra_driver,
            "dra_driver_chart_ref": self.chart_ref,
            "dra_driver_chart_version": self.chart_version,
            "dra_driver_extra_values": self.extra_values,
            "addons_claim_namespaces": list(self.claim_namespaces),
        }
        if self.gate_plugin_image:
            out["gate_plugin_image"] = self.gate_plugin_image
        return out

    def digest(self, playbook_dir: Path) -> str:
        """Changes with the request and with the shipped files the play applies (values, manifests)."""
        h = hashlib.sha256(json.dumps(self.extra_vars(), sort_keys=True).encode())
        config = playbook_dir.parent / "config"
        for rel in ("dra-driver/values.yaml", "dra/gate-deviceclass.yaml", "dra/gate-plugin-daemonset.yaml"):
            h.update((config / rel).read_bytes())
        for path in sorted((config / "dra" / "claims").glob("*.yaml")):
            h.update(path.read_bytes())
        h.update((playbook_dir / PLAYBOOK).read_bytes())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class AddonsOutcome:
    ok: bool
    changed: int
    duration_s: float
    failure: Failure | None = None
    message: str = ""


def classify(result: ansible_events.PlaybookResult) -> AddonsOutcome:
    """The outcome of one run: which failure class, from the failed task and its (sanitized) message."""
    if result.ok:
        return AddonsOutcome(True, result.changed, result.duration_s)
    failed = result.failed
    message = failed.message if failed is not None else str(result.status)
    lowered = message.lower()
    label = failed.label if failed is not None else "ansible-playbook"
    if any(m in lowered for m in ("connection refused", "no route to host", "i/o timeout", "unauthorized")):
        kind = Failure.CLUSTER_UNREACHABLE
    elif failed is not None and failed.task == CHART_TASK:
        fetch = ("failed to download", "not found", "no such file", "path", "failed to fetch", "unable to locate")
        values = ("values", "execution error", "template", "schema", "yaml", "parse error")
        if any(m in lowered for m in values) and "failed to download" not in lowered:
            kind = Failure.VALUES_INVALID
        elif any(m in lowered for m in fetch):
            kind = Failure.CHART_UNAVAILABLE
        else:
            kind = Failure.FAILED
    else:
        kind = Failure.FAILED
    return AddonsOutcome(False, result.changed, result.duration_s, kind, f"{label}: {message}")


class AddonsInstaller(Protocol):
    """Makes one workload cluster's DRA add-ons match a request."""

    @property
    def playbook_dir(self) -> Path:
        """Where addons.yml is; ``AddonsRequest.digest`` hashes the files it applies from there."""
        ...

    async def install(self, cluster: str, kubeconfig: str, request: AddonsRequest) -> AddonsOutcome: ...


@dataclass(frozen=True)
class AnsibleAddons:
    """The real AddonsInstaller: addons.yml through ansible-runner on this machine (connection local)."""

    artifacts_root: Path
    helm_binary: str = "helm"
    playbook_dir: Path = field(default_factory=default_playbook_dir)
    keep_runs: int = 5
    timeout_s: int = 900
    parallel: int = 2
    _pool: ThreadPoolExecutor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pool", ThreadPoolExecutor(self.parallel, thread_name_prefix="addons"))

    async def install(self, cluster: str, kubeconfig: str, request: AddonsRequest) -> AddonsOutcome:
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        future = loop.run_in_executor(self._pool, self.run_blocking, cluster, kubeconfig, request, cancel)
        try:
            return classify(await asyncio.shield(future))
        except asyncio.CancelledError:
            cancel.set()
            raise

    def run_blocking(
        self, cluster: str, kubeconfig: str, request: AddonsRequest, cancel: threading.Event | None = None
    ) -> ansible_events.PlaybookResult:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        run_dir = self.artifacts_root / cluster / f"{stamp}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True, mode=0o700)
        folder = ansible_events.EventFolder(secrets=_kubeconfig_secrets(kubeconfig))
        started = time.monotonic()
        kc_path = run_dir / "kubeconfig"
        try:
            _write_private(kc_path, kubeconfig)
            extra = request.extra_vars() | {"addons_kubeconfig": str(kc_path), "helm_binary": self.helm_binary}
            ansible_data.write_extravars(run_dir, extra)
            _write_private(run_dir / "ansible.cfg", "# capi-gpu: settings come from the environment\n")
            envvars = {
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
                "ANSIBLE_CONFIG": str(run_dir / "ansible.cfg"),
                "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp"),
                "ANSIBLE_RETRY_FILES_ENABLED": "False",
                "ANSIBLE_NOCOLOR": "True",
                "ANSIBLE_DEPRECATION_WARNINGS": "False",
                "ANSIBLE_LOCALHOST_WARNING": "False",
                "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
                "HELM_CACHE_HOME": str(run_dir / "helm" / "cache"),
                "HELM_CONFIG_HOME": str(run_dir / "helm" / "config"),
                "HELM_DATA_HOME": str(run_dir / "helm" / "data"),
            }
            runner = ansible_runner.interface.init_runner(
                private_data_dir=str(run_dir),
                project_dir=str(self.playbook_dir),
                playbook=PLAYBOOK,
                ident="run",
                inventory=_INVENTORY,
                envvars=envvars,
                quiet=True,
                timeout=self.timeout_s,
                event_handler=lambda e: folder.fold(e) is not None or True,
                cancel_callback=lambda: cancel is not None and cancel.is_set(),
            )
            runner.config.env = {
                k: v for k, v in runner.config.env.items() if k in ENV_ALLOWLIST or k in envvars or k not in os.environ
            }
            runner.run()
            status = str(runner.status)
            tail = _tail(run_dir / "artifacts" / "run" / "stdout")
        finally:
            kc_path.unlink(missing_ok=True)
            (run_dir / ansible_data.EXTRAVARS).unlink(missing_ok=True)
            self._prune(cluster)
        return folder.result(status, run_dir, time.monotonic() - started, tail)

    def _prune(self, cluster: str) -> None:
        runs = sorted(p for p in (self.artifacts_root / cluster).iterdir() if p.is_dir())
        for old in runs[: max(0, len(runs) - self.keep_runs)]:
            shutil.rmtree(old, ignore_errors=True)


def _kubeconfig_secrets(kubeconfig: str) -> tuple[str, ...]:
    """The credential strings of a kubeconfig, so no failure message can carry one."""
    try:
        doc = yaml.safe_load(kubeconfig) or {}
    except yaml.YAMLError:
        return ()
    out: list[str] = []
    for user in doc.get("users") or []:
        for key, value in (user.get("user") or {}).items():
            if key in ("token", "client-key-data", "client-certificate-data", "password") and value:
                out.append(str(value))
    return tuple(out)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError:
        return ""
