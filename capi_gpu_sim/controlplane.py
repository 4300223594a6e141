"""A real local control plane: kine, kube-apiserver, kube-controller-manager, kube-scheduler, CAPI core.

Everything the provider meets in production that can run here runs for real: schema validation,
resourceVersion conflicts, the status subresource, RBAC, CAPI's MachineDeployment -> Machine ->
InfraMachine flow, and kube-scheduler's DRA allocation with the binding-condition wait.

The workload cluster is the same apiserver (a self-hosted cluster): ``<cluster>-kubeconfig`` points back
at it. Simulated nodes are plain Node objects (the simulated kubelet writes them), so the
node-lifecycle controller is not run (nothing would heartbeat for it), and the TaintNodesByCondition
admission plugin is off (nothing would lift its not-ready taint). Every listener binds 127.0.0.1,
except CAPI's webhook server, which has no host flag in v1.14 (it gets a random port).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from capi_gpu import domain
from capi_gpu.kube import CRDS, SECRETS, Conflict, Kube
from capi_gpu_sim import audit, binaries, pki
from capi_gpu_sim.procs import Proc, reap_strays

FEATURE_GATES = "DRADeviceTaintRules=true"
RUNTIME_CONFIG = "resource.k8s.io/v1beta2=true"
KCM_CONTROLLERS = ",".join(
    [
        "resourceclaim-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "serviceaccount-controller",
        "serviceaccount-token-controller",
        "device-taint-eviction-controller",
        "root-ca-certificate-publisher-controller",
        "pod-garbage-collector-controller",
        # cluster-autoscaler drains only pods a controller recreates; its e2e runs them as ReplicaSets.
        "replicaset-controller",
        # The release's Deployments (ours, cert-manager's) roll out to ReplicaSets the pod runner runs.
        "deployment-controller",
    ]
)
REPO_CRDS = binaries.REPO / "crds"
KUBERNETES_SERVICE_NAMES = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


class ControlPlaneError(RuntimeError):
    """A component failed to start; the message names it and carries its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Options:
    binding_timeout_seconds: int = 30
    """kube-scheduler DynamicResources bindingTimeout (600 s upstream default; short in tests)."""
    with_scheduler: bool = True
    with_controller_manager: bool = True
    with_capi: bool = True
    install_our_crds: bool = True
    capi_feature_gates: str = "MachineTaintPropagation=true"
    service_cidr: str = "10.0.0.0/24"
    """Where the apiserver allocates ClusterIPs; the pod runner's kube-proxy stand-in listens on them."""


@dataclass
class ControlPlane:
    """Start with ``start()``, stop with ``stop()`` (idempotent; also run by the context manager)."""

    workdir: Path
    options: Options = field(default_factory=Options)
    procs: list[Proc] = field(default_factory=list)
    port: int = 0
    token: str = ""

    @property
    def registry(self) -> Path:
        return self.workdir / "pids"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def kubernetes_service_ip(self) -> str:
        """The first address of the Service range: the apiserver gives it to the `kubernetes` Service."""
        import ipaddress

        return str(next(ipaddress.ip_network(self.options.service_cidr).hosts()))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        bins = binaries.ensure_built()
        self.workdir.mkdir(parents=True, exist_ok=True)
        reap_strays(self.registry)
        pkidir = self.workdir / "pki"
        self.ca = pki.CA(pkidir)
        sa = pki.service_account_keys(pkidir)
        # The names and the ClusterIP of the `kubernetes` Service, as kubeadm's apiserver certificate has them:
        # pods reach the apiserver there (kopf's in-cluster login dials https://kubernetes.default.svc).
        serving = self.ca.serving(
            "apiserver",
            ["localhost", *KUBERNETES_SERVICE_NAMES],
            ["127.0.0.1", self.kubernetes_service_ip],
            cert_name="apiserver.crt",
            key_name="apiserver.key",
        )
        self.token = secrets.token_hex(16)
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        tokens.chmod(0o600)
        try:
            kine_port = free_port()
            self._spawn(
                "kine",
                [
                    str(bins.kine),
                    "--endpoint",
                    "memory://",
                    "--listen-address",
                    f"127.0.0.1:{kine_port}",
                    "--metrics-bind-address",
                    "0",
                ],
            )
            self._wait_tcp("kine", kine_port)
            self.port = free_port()
            self._spawn(
                "kube-apiserver",
                [
                    str(bins.kube_apiserver),
                    f"--etcd-servers=http://127.0.0.1:{kine_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    f"--cert-dir={pkidir}",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={self.ca.cert_path}",
                    f"--token-auth-file={tokens}",
                    "--authorization-mode=RBAC",
                    f"--service-cluster-ip-range={self.options.service_cidr}",
                    "--allow-privileged=true",
                    "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                    f"--service-account-issuer=https://127.0.0.1:{self.port}",
                    f"--service-account-key-file={sa.cert}",
                    f"--service-account-signing-key-file={sa.key}",
                    f"--feature-gates={FEATURE_GATES}",
                    f"--runtime-config={RUNTIME_CONFIG}",
                    "--enable-priority-and-fairness=false",
                    "--profiling=false",
                    # No compaction: kine's memory driver drops PrevKV from the watch event of an update
                    # whose previous revision is at or below the compacted one (etcd keeps it), and the
                    # apiserver's watch cache answers that with "etcd event received with PrevKv=nil",
                    # delivers nothing for that resource for ~30 s, then re-lists and ends every watcher.
                    # From the first compaction (5 min in) each scale-down stalled that way. The
                    # history a test world builds in memory is small.
                    "--etcd-compaction-interval=0",
                    *audit.flags(self.workdir),
                ],
            )
            self._wait_ready("kube-apiserver", f"{self.url}/readyz", timeout=90)
            self._write_kubeconfig()
            kube = self.kube()
            self.install_capi_crds(kube, bins.capi_crds)
            if self.options.install_our_crds:
                self.install_crds(kube, sorted(REPO_CRDS.glob("*.yaml")))
            if self.options.with_controller_manager:
                self._start_kcm(bins, sa)
            if self.options.with_scheduler:
                self._start_scheduler(bins)
            if self.options.with_capi:
                self._start_capi(bins)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.logs, self.registry)
        self.procs.append(proc)
        return proc

    def _start_kcm(self, bins: binaries.Binaries, sa: pki.CertPair) -> None:
        port = free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(bins.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--controllers={KCM_CONTROLLERS}",
                "--leader-elect=false",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={self.ca.cert_path}",
                f"--feature-gates={FEATURE_GATES}",
                "--use-service-account-credentials=false",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
            ],
        )
        self._wait_ready("kube-controller-manager", f"https://127.0.0.1:{port}/healthz", verify=False)

    def _start_scheduler(self, bins: binaries.Binaries) -> None:
        port = free_port()
        cfg = self.workdir / "scheduler.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                    "profiles": [
                        {
                            "schedulerName": "default-scheduler",
                            "pluginConfig": [
                                {
                                    "name": "DynamicResources",
                                    "args": {
                                        "apiVersion": "kubescheduler.config.k8s.io/v1",
                                        "kind": "DynamicResourcesArgs",
                                        "bindingTimeout": f"{self.options.binding_timeout_seconds}s",
                                    },
                                }
                            ],
                        }
                    ],
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bins.kube_scheduler),
                f"--config={cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--feature-gates={FEATURE_GATES}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
            ],
        )
        self._wait_ready("kube-scheduler", f"https://127.0.0.1:{port}/healthz", verify=False)

    def _start_capi(self, bins: binaries.Binaries) -> None:
        certs = self.ca.serving("capi-webhook", ["localhost"], ["127.0.0.1"])
        health, webhook = free_port(), free_port()
        self._spawn(
            "capi-manager",
            [
                str(bins.capi_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--diagnostics-address=127.0.0.1:{free_port()}",
                "--insecure-diagnostics",
                f"--health-addr=127.0.0.1:{health}",
                f"--webhook-port={webhook}",
                f"--webhook-cert-dir={certs.cert.parent}",
                f"--feature-gates={self.options.capi_feature_gates}",
                "--sync-period=2m",
            ],
        )
        self._wait_ready("capi-manager", f"http://127.0.0.1:{health}/readyz", timeout=90)
        self._install_webhooks(bins.capi_webhooks, webhook)

    def _install_webhooks(self, manifest: Path, port: int) -> None:
        """CAPI's own defaulting/validation webhooks, pointed at the manager on loopback."""
        import base64

        from capi_gpu.kube import Res

        ca = base64.b64encode(self.ca.pem).decode()
        kube = self.kube()
        for doc in yaml.safe_load_all(manifest.read_text()):
            if not doc:
                continue
            for hook in doc.get("webhooks", []):
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            plural = {
                "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
                "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
            }[doc["kind"]]
            doc["metadata"]["name"] = f"capi-{doc['metadata']['name']}"
            kube.apply(Res("admissionregistration.k8s.io", "v1", plural, namespaced=False), doc)

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict()))
        self.kubeconfig.chmod(0o600)

    def kubeconfig_dict(
        self, token: str | None = None, user: str = "admin", namespace: str | None = None
    ) -> dict[str, Any]:
        """``namespace``: the context's, for clients given no ``-n`` (kubectl, ``capi-gpu hosts``)."""
        import base64

        context: dict[str, str] = {"cluster": "local", "user": user}
        if namespace:
            context["namespace"] = namespace
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "local",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.ca.pem).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token or self.token}}],
            "contexts": [{"name": "local", "context": context}],
        }

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(str(self.kubeconfig))

    def write_workload_kubeconfig(self, cluster: str, namespace: str) -> None:
        """The CAPI convention: Secret ``<cluster>-kubeconfig``, key ``value``, pointing at this apiserver."""
        import base64

        value = base64.b64encode(yaml.safe_dump(self.kubeconfig_dict()).encode()).decode()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "cluster.x-k8s.io/secret",
            "metadata": {
                "name": f"{cluster}-kubeconfig",
                "namespace": namespace,
                "labels": {domain.CLUSTER_NAME_LABEL: cluster},
            },
            "data": {"value": value},
        }
        self.kube().apply(SECRETS, secret, namespace)

    def install_capi_crds(self, kube: Kube, directory: Path) -> None:
        docs = []
        for path in sorted(directory.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    # v1beta2-only use: no conversion webhook is running.
                    doc["spec"]["conversion"] = {"strategy": "None"}
                    docs.append(doc)
        self.apply_crds(kube, docs)

    def install_crds(self, kube: Kube, paths: list[Path]) -> None:
        docs = [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]
        self.apply_crds(kube, docs)

    def apply_crds(self, kube: Kube, docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            try:
                kube.create(CRDS, doc)
            except Conflict:
                current = kube.get(CRDS, doc["metadata"]["name"])
                doc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                kube.replace(CRDS, doc)
        deadline = time.monotonic() + 60
        for doc in docs:
            name = doc["metadata"]["name"]
            while True:
                conds = (kube.get(CRDS, name).get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    break
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRD {name} not Established after 60s")
                time.sleep(0.1)

    def _wait_tcp(self, name: str, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(name)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.1)
        raise self._failure(name, f"not listening on 127.0.0.1:{port} after {timeout:.0f}s")

    def _wait_ready(self, name: str, url: str, timeout: float = 60, verify: bool = True) -> None:
        deadline = time.monotonic() + timeout
        ctx: Any = (
            ssl.create_default_context(cafile=str(self.ca.cert_path)) if verify and url.startswith("https") else False
        )
        headers = {"Authorization": f"Bearer {self.token}"}
        last = ""
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                r = httpx.get(url, verify=ctx, headers=headers, timeout=2)
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise self._failure(name, f"not ready at {url} after {timeout:.0f}s ({last})")

    def _check_alive(self, name: str) -> None:
        proc = next(p for p in self.procs if p.name == name)
        if not proc.alive():
            raise self._failure(name, f"exited with {proc.popen.returncode}")

    def _failure(self, name: str, what: str) -> ControlPlaneError:
        proc = next((p for p in self.procs if p.name == name), None)
        tail = proc.tail() if proc else ""
        hint = " (port clash: another process took the port; rerun)" if "address already in use" in tail else ""
        return ControlPlaneError(f"{name} {what}{hint}; log {self.logs / (name + '.log')}:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every component, newest first: SIGTERM, then SIGKILL after ``grace_s``. A world torn down
        after its test passes a short grace: kube-apiserver otherwise spends the whole 10 s draining its
        watches, and nothing of a memory-backed control plane outlives it anyway."""
        for proc in reversed(self.procs):
            proc.stop(grace_s)
        self.procs.clear()
        reap_strays(self.registry)

    def audit_writes(self) -> list[audit.Write]:
        """Every successful write to our kinds and CAPI core's so far, and all of the operator's (``audit``)."""
        return audit.writes(audit.log_path(self.workdir))

    def component_pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.procs}

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
