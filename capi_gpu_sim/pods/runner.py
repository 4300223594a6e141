"""The management node's kubelet: runs the pods scheduled to it as processes built from their manifests.

It registers one Node (the management cluster's control-plane node, labelled with the role), watches the
pods bound to it, and for each: hands out a pod IP, writes its volumes (emptyDir, Secret and ConfigMap
keys, refreshed when they change, and the ServiceAccount token from the TokenRequest API, bound to the
pod), starts each container (``container.Container``) and writes the pod's status back. A pod being
deleted gets SIGTERM, its grace period, and then the runner confirms the deletion, as the kubelet does.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capi_gpu.kube import CONFIGMAPS, NODES, PODS, SECRETS, Kube, KubeError, NotFound, Res
from capi_gpu_sim.hosts import names
from capi_gpu_sim.pods import images, podnet, podspec, volumes
from capi_gpu_sim.pods.container import Container, Launch

log = logging.getLogger(__name__)
NODE_NAME = "capi-gpu-sim-mgmt"
CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"
TOKEN_SECONDS = 3600
REFRESH_S = 2.0  # how often volumes are compared with their Secrets/ConfigMaps (the kubelet: ~1 min)
TOKEN_REQUEST = "authentication.k8s.io/v1"
VOLUMES_ROOT = Path("/run/capigpu-pods")
KUBERNETES_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Config:
    state_dir: Path
    api: tuple[str, int]  # the apiserver on the machine's loopback (what a pod in its own netns dials)
    kubernetes_service_ip: str  # the `kubernetes` Service's ClusterIP (everyone else: port 443, and DNS)
    ca_pem: bytes
    ip_prefix: str  # "127.77.3." : pods get .2 to .254
    cgroup_prefix: str  # unique per runner: the container cgroups' names start with it
    table: Mapping[str, Callable[[], images.Entry]] = field(default_factory=lambda: dict(images.TABLE))
    node_name: str = NODE_NAME
    # The restart back-off (10 s doubling to 5 min) times this: a world that crashes the operator at each of
    # a dozen steps compresses it as it compresses the operator's own timeouts (--timing-scale).
    backoff_scale: float = 1.0


class Pod:
    def __init__(self, runner: PodRunner, obj: dict[str, Any], ip: str) -> None:
        self.runner, self.obj, self.ip = runner, obj, ip
        meta = obj["metadata"]
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.dir = runner.config.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.spec = obj["spec"]
        self.facts = podspec.PodFacts(
            self.name,
            self.namespace,
            self.uid,
            ip,
            runner.config.node_name,
            self.spec.get("serviceAccountName", "default"),
            meta.get("labels") or {},
        )
        self.volumes = podspec.volumes(self.spec)
        self.containers: list[Container] = []
        self.started = _now()
        self._status_lock = threading.Lock()
        self._dirty = threading.Event()
        self.error = ""
        self.network: podnet.PodNetwork | None = None
        self._stopped = threading.Event()

    # -- volumes --------------------------------------------------------------------------------------------

    def volume_dir(self, name: str) -> Path:
        # Under /run, as the kubelet keeps them under /var/lib/kubelet: never below a path a pod mounts over
        # (an emptyDir on /tmp would hide a volume directory under the test's /tmp from the mounts after it).
        return VOLUMES_ROOT / self.runner.config.cgroup_prefix / f"{self.uid[:8]}" / name

    def refresh_volumes(self) -> None:
        k = self.runner.kube
        for v in self.volumes.values():
            d = self.volume_dir(v.name)
            if v.kind == "emptyDir":
                d.mkdir(parents=True, exist_ok=True)
                continue
            res = SECRETS if v.kind == "secret" else CONFIGMAPS
            obj = k.get_or_none(res, v.source, self.namespace)
            if obj is None:
                if not v.optional:
                    raise podspec.SpecError(f"volume {v.name}: {v.kind} {v.source} not found")
                data: dict[str, str | bytes] = {}
            elif v.kind == "secret":
                data = {key: base64.b64decode(val) for key, val in (obj.get("data") or {}).items()}
            else:
                data = dict(obj.get("data") or {})
            volumes.write_atomic(d, podspec.files_for(v, data), 0o600 if v.kind == "secret" else 0o644)  # type: ignore[arg-type]
        self._write_token()

    def _write_token(self) -> None:
        d = self.volume_dir("kube-api-access")
        have = volumes.current(d)
        if have is not None and time.time() < self._token_renew_at:
            return
        token = self.runner.token_for(self.namespace, self.facts.service_account, self.name, self.uid)
        volumes.write_atomic(d, {"token": token, "ca.crt": self.runner.config.ca_pem, "namespace": self.namespace})
        self._token_renew_at = time.time() + TOKEN_SECONDS * 0.8

    _token_renew_at = 0.0

    def hosts_file(self) -> Path:
        path: Path = VOLUMES_ROOT / self.runner.config.cgroup_prefix / self.uid[:8] / "etc-hosts"
        names = " ".join(KUBERNETES_NAMES)
        path.write_text(
            f"127.0.0.1 localhost\n{self.ip} {self.name}\n{self.runner.config.kubernetes_service_ip} {names}\n"
        )
        return path

    # -- containers ----------------------------------------------------------------------------------------

    def lookup(self, kind: str, name: str, key: str) -> str | None:
        res = SECRETS if kind == "Secret" else CONFIGMAPS
        obj = self.runner.kube.get_or_none(res, name, self.namespace)
        if obj is None:
            return None
        if kind == "Secret":
            raw = (obj.get("data") or {}).get(key)
            return None if raw is None else base64.b64decode(raw).decode()
        value = (obj.get("data") or {}).get(key)
        return None if value is None else str(value)

    def launch_for(self, c: Mapping[str, Any]) -> Callable[[], Launch]:
        entry = images.resolve(c["image"], self.runner.config.table)
        mounts = podspec.mounts(c, self.spec)
        cgroup = f"{self.runner.config.cgroup_prefix}-{self.uid[:8]}-{c['name']}"[:60]

        def launch() -> Launch:
            self.refresh_volumes()
            cfg = self.runner.config
            api = cfg.api if self.network is not None else (cfg.kubernetes_service_ip, 443)
            env = podspec.environment(c, self.facts, self.lookup, api)
            argv = images.program(podspec.argv(c, entry.entrypoint, entry.default_args, env), entry)
            binds = [
                (self.volume_dir(m.volume) / m.sub_path if m.sub_path else self.volume_dir(m.volume), m.path)
                for m in mounts
            ]
            if self.network is None:  # the kubelet's /etc/hosts, with the cluster DNS names a pod dials
                binds.append((self.hosts_file(), "/etc/hosts"))
            env = {**env, "PATH": images.path_env(entry), "HOSTNAME": self.name}
            prefix = podnet.exec_prefix(self.network.name) if self.network is not None else []
            stage = VOLUMES_ROOT / cfg.cgroup_prefix / self.uid[:8] / f"stage-{c['name']}"
            log = self.dir / f"{c['name']}.log"
            return Launch(argv, env, binds, entry.cwd, log, cgroup, prefix, list(entry.keep), stage)

        return launch

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        # As the kubelet: a pod whose Secret or ConfigMap isn't there yet waits in ContainerCreating, retried.
        while not self._stopped.is_set():
            try:
                self.refresh_volumes()
                break
            except (podspec.SpecError, KubeError, OSError) as exc:
                if str(exc) != self.error:
                    self.error = str(exc)
                    self.write_status()
                self._stopped.wait(1.0)
        if self._stopped.is_set():
            return
        self.error = ""
        try:
            entries = [images.resolve(c["image"], self.runner.config.table) for c in self.spec["containers"]]
            if any(e.own_netns for e in entries):
                ports = [int(p["containerPort"]) for c in self.spec["containers"] for p in c.get("ports") or []]
                name = f"{names.PREFIX}-{self.runner.config.cgroup_prefix}-{self.uid[:8]}"
                self.network = podnet.PodNetwork(name, self.ip, self.runner.config.api, ports)
            for c in self.spec["containers"]:
                self.containers.append(
                    Container(
                        c["name"],
                        self.ip,
                        self.launch_for(c),
                        podspec.probe(c, "livenessProbe"),
                        podspec.probe(c, "readinessProbe"),
                        podspec.probe(c, "startupProbe"),
                        grace,
                        self._dirty.set,
                        self.runner.config.backoff_scale,
                    )
                )
        except (podspec.SpecError, images.UnknownImage, KubeError, OSError, subprocess.SubprocessError) as exc:
            self.error = str(exc)
            log.warning("pod %s/%s cannot start: %s", self.namespace, self.name, exc)
            self.write_status()
            return
        for c in self.containers:
            c.start()
        self.write_status()

    def stop(self, grace_s: float | None = None) -> None:
        self._stopped.set()
        threads = [threading.Thread(target=c.stop, args=(grace_s,)) for c in self.containers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if self.network is not None:
            self.network.close()
            self.network = None

    def sync(self, volumes_too: bool) -> None:
        """Refresh volumes (a renewed certificate reaches the files) and write status if it changed."""
        if volumes_too and self.containers and not self.error:
            with contextlib.suppress(KubeError, podspec.SpecError, OSError):
                self.refresh_volumes()
        if self._dirty.is_set():
            self._dirty.clear()
            self.write_status()

    def status(self) -> dict[str, Any]:
        ready = bool(self.containers) and all(c.state.ready for c in self.containers)
        statuses = []
        for c in self.containers:
            s = c.state
            state: dict[str, Any] = (
                {
                    "running": {
                        "startedAt": dt.datetime.fromtimestamp(s.started_at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    }
                }
                if s.running
                else {"waiting": {"reason": s.waiting_reason or "ContainerCreating"}}
            )
            entry: dict[str, Any] = {
                "name": c.name,
                "ready": s.ready,
                "started": s.running,
                "restartCount": s.restarts,
                "state": state,
                "image": next(x["image"] for x in self.spec["containers"] if x["name"] == c.name),
                "imageID": "",
            }
            if s.last_exit is not None:
                entry["lastState"] = {"terminated": {"exitCode": s.last_exit, "reason": s.last_reason or "Error"}}
            statuses.append(entry)
        cond = "True" if ready else "False"
        return {
            "phase": "Pending" if self.error else "Running",
            "message": self.error or None,
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "hostIP": self.ip,
            "startTime": self.started,
            "conditions": [
                {"type": t, "status": v, "lastTransitionTime": _now()}
                for t, v in (
                    ("PodScheduled", "True"),
                    ("Initialized", "True"),
                    ("ContainersReady", cond),
                    ("Ready", cond),
                )
            ],
            "containerStatuses": statuses,
        }

    def write_status(self) -> None:
        with self._status_lock, contextlib.suppress(KubeError):
            self.runner.kube.patch(PODS, self.name, {"status": self.status()}, self.namespace, sub="status")


class PodRunner:
    def __init__(self, kube: Kube, config: Config) -> None:
        self.kube, self.config = kube, config
        self.pods: dict[str, Pod] = {}
        self.tokens: list[str] = []  # every ServiceAccount token handed to a pod (tests look for leaks)
        self._ips = iter(f"{config.ip_prefix}{n}" for n in range(2, 255))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> PodRunner:
        shutil.rmtree(VOLUMES_ROOT / self.config.cgroup_prefix, ignore_errors=True)  # a killed run's leftovers
        self.register_node()
        for target, name in ((self._watch, "pod-runner-watch"), (self._sync, "pod-runner-sync")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.config.node_name,
                "labels": {CONTROL_PLANE_ROLE: "", "kubernetes.io/os": "linux"},
            },
            # Untainted, as kind leaves its one control-plane node: third-party charts (cert-manager's) carry
            # no toleration for the control-plane taint. Our own pods tolerate it all the same.
            "spec": {},
        }
        self.kube.apply(NODES, node)
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": _now()}],
            "addresses": [{"type": "InternalIP", "address": f"{self.config.ip_prefix}1"}],
        }
        self.kube.patch(NODES, self.config.node_name, {"status": status}, sub="status")

    def token_for(self, namespace: str, account: str, pod: str, uid: str) -> str:
        body = {
            "apiVersion": TOKEN_REQUEST,
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
            },
        }
        res = Res("", "v1", "serviceaccounts")
        answer = self.kube._call("POST", res.path(namespace, account, "token"), body=body)
        token = str(answer["status"]["token"])
        self.tokens.append(token)
        return token

    def _watch(self) -> None:
        selector = f"spec.nodeName={self.config.node_name}"
        while not self._stop.is_set():
            try:
                seen = set()
                for obj in self.kube.list(PODS, field_selector=selector):
                    seen.add(obj["metadata"]["uid"])
                    self._event("ADDED", obj)
                with self._lock:
                    gone = [uid for uid in self.pods if uid not in seen]
                for uid in gone:
                    self._forget(uid)
                for kind, obj in self.kube.watch(PODS, field_selector=selector, timeout_seconds=60, stop=self._stop):
                    self._event(kind, obj)
            except Exception as exc:
                if not self._stop.is_set():
                    log.info("pod runner watch: %s; again", exc)
                    self._stop.wait(1.0)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind in ("BOOKMARK", "ERROR") or "uid" not in (obj.get("metadata") or {}):
            return
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self._forget(uid)
            return
        with self._lock:
            pod = self.pods.get(uid)
            if self._stop.is_set():  # stop() emptied ``pods`` under this lock: start nothing after it
                return
            if pod is None and not obj["metadata"].get("deletionTimestamp"):
                pod = self.pods[uid] = Pod(self, obj, next(self._ips))
                threading.Thread(target=pod.start, name=f"pod-{obj['metadata']['name']}", daemon=True).start()
                return
        if pod is not None and obj["metadata"].get("deletionTimestamp"):
            threading.Thread(target=self._terminate, args=(uid, obj), daemon=True).start()

    def _terminate(self, uid: str, obj: dict[str, Any]) -> None:
        with self._lock:
            pod = self.pods.pop(uid, None)
        if pod is None:
            return
        grace = obj["metadata"].get("deletionGracePeriodSeconds")
        pod.stop(None if grace is None else float(grace))
        with contextlib.suppress(KubeError):
            self.kube.delete(PODS, pod.name, pod.namespace, grace_period_seconds=0)
        shutil.rmtree(VOLUMES_ROOT / self.config.cgroup_prefix / pod.uid[:8], ignore_errors=True)

    def _forget(self, uid: str) -> None:
        with self._lock:
            pod = self.pods.pop(uid, None)
        if pod is not None:
            pod.stop(0)

    def _sync(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.25):
            volumes_too = time.monotonic() - last >= REFRESH_S
            if volumes_too:
                last = time.monotonic()
            with self._lock:
                pods = list(self.pods.values())
            for pod in pods:
                try:
                    pod.sync(volumes_too)
                except NotFound:
                    continue

    def endpoints(self, namespace: str, selector: Mapping[str, str], target: int | str) -> list[tuple[str, int]]:
        """Ready pods the selector matches, with ``target`` (a number or a container port's name) resolved."""
        with self._lock:
            pods = [p for p in self.pods.values() if p.namespace == namespace]
        out = []
        for p in pods:
            labels = p.facts.labels
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if not p.containers or not all(c.state.ready for c in p.containers):
                continue
            for c in p.spec["containers"]:
                with contextlib.suppress(podspec.SpecError):
                    out.append((p.ip, podspec.port_number(target, c)))
                    break
        return out

    def running(self) -> list[Pod]:
        """Every pod the runner runs now (a copy: the watch thread changes the map)."""
        with self._lock:
            return list(self.pods.values())

    def pod(self, namespace: str, name: str) -> Pod | None:
        with self._lock:
            return next((p for p in self.pods.values() if (p.namespace, p.name) == (namespace, name)), None)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every pod's containers at once: SIGTERM, then SIGKILL after ``grace_s``."""
        self._stop.set()
        with self._lock:
            pods = list(self.pods.values())
            self.pods.clear()
        threads = [threading.Thread(target=p.stop, args=(grace_s,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # The sync thread wakes every 0.25 s. The watch thread sees the stop only at its stream's next event
        # (a bookmark may be a minute away): it is a daemon and, past the check in _event, inert, so it is
        # not waited for.
        for t in self._threads:
            t.join(5 if t.name != "pod-runner-watch" else 0.1)
        shutil.rmtree(VOLUMES_ROOT / self.config.cgroup_prefix, ignore_errors=True)
