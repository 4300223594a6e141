"""A simulated kubelet per host, running on the test machine: join record in, Node (and DRA slices) out.

Why outside the guest: the workload apiserver listens on the test machine's loopback only, which a
host's network namespace can't reach (and must not: only loopback listeners are allowed). The kubeadm
shim inside the host leaves a join record (``/var/lib/kubelet/sim-join.json``); this reads it through
the host's filesystem (polling, bounded) and does what kubelet registration does:

- a Node named after the join, with its taints (``--register-with-taints``), labels
  (``--node-labels``) and ``spec.providerID`` (``--provider-id``), capacity/allocatable of a GEX131
  (48 CPUs, 256 Gi, 110 pods, the NVMe as ephemeral storage), addresses, nodeInfo with the boot id,
  a Ready condition, and a Lease in ``kube-node-lease`` renewed every ``heartbeat_s``;
- while the host is down or in rescue, Ready turns Unknown (what the node lifecycle controller
  would show); after every boot of the installed OS it is Ready again and the DRA publisher restarts
  (static MIG: it re-reads the GPU once per start);
- at every start (each boot served) it deletes every ResourceSlice of its node, of any driver, as the
  real kubelet does before plugins register again: the plugins, and capi-gpu's gate, must republish;
- after ``kubeadm reset`` (a reset record newer than the join) the Node and its slices are deleted.

The NVIDIA DRA plugin is a pod the kubelet runs, so the publisher starts only once the guest's
``kubelet.service`` is active (the MIG boot unit is ordered before it: at every boot the plugin finds the
layout already there); a hand-built guest without a kubelet unit publishes as soon as it joined. While it
runs, the publisher is health-checked as the driver's ``NVMLDeviceHealthCheck`` does: a GPU that fell off
the bus (the GPU shim's lost markers) gets its devices tainted ``gpu.nvidia.com/gpu-lost``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import shlex
import threading
import time
from typing import Any

from capi_gpu.kube import NODES, RESOURCESLICES, Conflict, Kube, NotFound, Obj, Res
from capi_gpu_sim import dra_publisher
from capi_gpu_sim.hosts.host import Host, Running, State

log = logging.getLogger(__name__)

LEASES = Res("coordination.k8s.io", "v1", "leases")
JOIN_RECORD = "/var/lib/kubelet/sim-join.json"
DEFAULT_FILE = "/etc/default/kubelet"  # the kubelet unit's EnvironmentFile (the kubelet role writes it)
RESET_RECORD = "/var/lib/kubelet/sim-reset.json"
GPU_LOST_MARKER = "/run/gpu-shim/lost"  # the GPU shim's "lost until reboot"
GPU_SHIM_CONFIG = "/var/lib/gpu-shim/config.json"  # its "lost" knob: lost for good
HEALTH_CHECK_S = 1.0
CAPACITY = {
    "cpu": "48",
    "memory": "263856952Ki",
    "pods": "110",
    "ephemeral-storage": "937692504Ki",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
}
ALLOCATABLE = {
    "cpu": "47",
    "memory": "261657400Ki",
    "pods": "110",
    "ephemeral-storage": "864172000Ki",
    "hugepages-1Gi": "0",
    "hugepages-2Mi": "0",
}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SimKubelet:
    def __init__(
        self,
        host: Host,
        kube: Kube,
        *,
        poll_s: float = 0.25,
        heartbeat_s: float = 10.0,
        kubelet_version: str = "v1.36.3",
        brand: str = "NvidiaRTX",
        publish_dra: bool = True,
    ) -> None:
        self.host = host
        self.kube = kube
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.kubelet_version = kubelet_version
        self.brand = brand  # NVML BRAND_NVIDIA_RTX as the driver names it (verify on a real GEX131)
        self.publish_dra = publish_dra
        self.node_name: str | None = None
        self.publisher: dra_publisher.DraPublisher | None = None
        self._join: dict[str, Any] | None = None
        self._served_boot = 0
        self._ready: str | None = None
        self._last_beat = 0.0
        self._next_publish_try = 0.0
        self._next_health_check = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{host.name}", daemon=True)
        self.errors: list[str] = []
        self.wiped = 0  # kubelet starts that deleted the node's slices (tests read it)

    def start(self) -> SimKubelet:
        self._thread.start()
        return self

    def stop(self, delete_node: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if delete_node and self.node_name:
            self._delete_node()

    def wait_node(self, timeout: float = 30.0, ready: bool = True) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.node_name and (not ready or self._ready == "True"):
                return True
            time.sleep(0.05)
        return False

    def wait_published(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.publisher is not None and self.publisher.published:
                return True
            time.sleep(0.05)
        return False

    # -- loop -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._tick()
            except Exception as exc:  # the apiserver may be restarting; keep going, bounded by stop()
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.debug("kubelet %s: %s", self.host.name, exc)

    def _read_json(self, path: str) -> dict[str, Any] | None:
        raw = self.host.read_file(path)
        if not raw:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _node_ip(self) -> str:
        """The kubelet's ``--node-ip`` from ``KUBELET_EXTRA_ARGS`` in /etc/default/kubelet (what the unit passes
        to the real kubelet), else the host's main address, as a real kubelet picks its default route's."""
        return node_ip(self.host.read_file(DEFAULT_FILE)) or self.host.guest_ip

    def _tick(self) -> None:
        up = self.host.state is State.UP and self.host.running is Running.INSTALLED
        if not up:
            if self.node_name and self._ready != "Unknown":
                self._set_ready("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
            return
        join = self._read_json(JOIN_RECORD)
        reset = self._read_json(RESET_RECORD)
        if join is None:
            if self.node_name and reset is not None:
                self._delete_node()
            elif self.node_name and self._ready != "Unknown":
                self._set_ready("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
            return
        boot = self.host.boot_count()
        if self._join is None or join.get("joinedAt") != self._join.get("joinedAt"):
            self._join = join
            self._register(join)
            self._served_boot = 0
        if self._served_boot != boot:
            self._wipe_slices()
            self._set_ready("True", "KubeletReady", "kubelet is posting ready status")
            self._served_boot = boot
            self.publisher = None
        if self.publish_dra and self.node_name:
            self._dra_tick()
        if time.monotonic() - self._last_beat > self.heartbeat_s:
            self._heartbeat()

    def _dra_tick(self) -> None:
        now = time.monotonic()
        if self.publisher is None:
            if now > self._next_publish_try:
                self._next_publish_try = now + 2.0
                if self._kubelet_unit_running():
                    self._start_publisher()
        elif not self.publisher.gpu_lost and self.publisher.published and now > self._next_health_check:
            self._next_health_check = now + HEALTH_CHECK_S
            if self._gpu_lost():
                log.info("kubelet %s: GPU lost; the DRA plugin taints its devices", self.host.name)
                self.publisher.mark_gpu_lost()

    # -- node -----------------------------------------------------------------------------------
    def _node_body(self, join: dict[str, Any]) -> Obj:
        name = str(join["nodeName"])
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            **{str(k): str(v) for k, v in (join.get("labels") or {}).items()},
        }
        spec: Obj = {
            "taints": [
                {k: v for k, v in t.items() if k in ("key", "value", "effect")} for t in join.get("taints") or []
            ]
        }
        if join.get("providerID"):
            spec["providerID"] = join["providerID"]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": self._status("True", "KubeletReady", "kubelet is posting ready status"),
        }

    def _status(self, ready: str, reason: str, message: str) -> Obj:
        now = _now()
        conds = [
            {
                "type": t,
                "status": "False",
                "reason": r,
                "message": m,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for t, r, m in (
                ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID"),
            )
        ]
        conds.append(
            {
                "type": "Ready",
                "status": ready,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        )
        name = self.node_name or (self._join or {}).get("nodeName", self.host.name)
        return {
            "capacity": dict(CAPACITY),
            "allocatable": dict(ALLOCATABLE),
            "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": self._node_ip()}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": f"sim-{self.host.server_number}",
                "bootID": self.host.boot_id or "",
                "kernelVersion": "6.1.0-sim-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://2.1.5",
                "kubeletVersion": self.kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        }

    def _register(self, join: dict[str, Any]) -> None:
        body = self._node_body(join)
        name = body["metadata"]["name"]
        try:
            self.kube.create(NODES, body)
        except Conflict:
            self.kube.patch(NODES, name, {"metadata": {"labels": body["metadata"]["labels"]}})
        self.node_name = name
        self.kube.patch(NODES, name, {"status": body["status"]}, sub="status")
        self._ready = "True"
        log.info("kubelet %s: registered node %s", self.host.name, name)

    def _set_ready(self, status: str, reason: str, message: str) -> None:
        if not self.node_name:
            return
        try:
            self.kube.patch(NODES, self.node_name, {"status": self._status(status, reason, message)}, sub="status")
            self._ready = status
        except NotFound:
            self.node_name = None

    def _heartbeat(self) -> None:
        if not self.node_name:
            return
        self._last_beat = time.monotonic()
        node = self.kube.get(NODES, self.node_name)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node_name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node["metadata"]["uid"]}
                ],
            },
            "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": 40, "renewTime": _micro_now()},
        }
        try:
            self.kube.create(LEASES, lease, namespace="kube-node-lease")
        except Conflict:
            self.kube.patch(LEASES, self.node_name, {"spec": lease["spec"]}, namespace="kube-node-lease")

    def _delete_node(self) -> None:
        name = self.node_name
        if name is None:
            return
        if self.publisher is not None:
            self.publisher.stop()
        self.kube.delete(LEASES, name, namespace="kube-node-lease")
        self.kube.delete(NODES, name)
        log.info("kubelet %s: deleted node %s after kubeadm reset", self.host.name, name)
        self.node_name, self._join, self.publisher, self._ready = None, None, None, None

    # -- DRA ------------------------------------------------------------------------------------
    def _wipe_slices(self) -> None:
        """The kubelet's start-up clean-up: no slice of this node survives it, whoever published it."""
        if not self.node_name:
            return
        for item in self.kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={self.node_name}"):
            self.kube.delete(RESOURCESLICES, item["metadata"]["name"])
        self.wiped += 1

    def _read_gpu(self) -> tuple[dra_publisher.GpuFacts, list[dra_publisher.MigFacts]]:
        outs = []
        query = [f"--query-gpu={','.join(dra_publisher.QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
        for args in (query, ["-q", "-x"], ["-L"], ["mig", "-lgi"]):
            res = self.host.exec(["nvidia-smi", *args], timeout=30)
            if res.returncode != 0 and args != ["mig", "-lgi"]:  # -lgi exits 6 when there are no instances
                raise dra_publisher.GpuUnavailable(f"nvidia-smi {' '.join(args)}: exit {res.returncode}")
            outs.append(res.stdout.decode(errors="replace"))
        return dra_publisher.parse_gpu(outs[0], outs[1], outs[2], outs[3], self.brand)

    def _kubelet_unit_running(self) -> bool:
        """The plugin pod can only run once kubelet does; a guest without a kubelet unit has nothing to wait for."""
        res = self.host.exec(["systemctl", "show", "-p", "LoadState,ActiveState", "kubelet.service"], timeout=30)
        props = dict(line.split("=", 1) for line in res.stdout.decode(errors="replace").splitlines() if "=" in line)
        return props.get("LoadState") == "not-found" or props.get("ActiveState") == "active"

    def _gpu_lost(self) -> bool:
        """NVML's view, from the GPU shim's own state: lost until the next boot, or for good."""
        if self.host.read_file(GPU_LOST_MARKER) is not None:
            return True
        config = self._read_json(GPU_SHIM_CONFIG)
        return bool(config and config.get("lost"))

    def _start_publisher(self) -> None:
        assert self.node_name is not None
        node = self.kube.get(NODES, self.node_name)
        pub = dra_publisher.DraPublisher(self.kube, self.node_name, node["metadata"]["uid"], self._read_gpu)
        try:
            pub.start()
        except dra_publisher.GpuUnavailable as exc:
            log.debug("kubelet %s: DRA plugin waits for the driver: %s", self.host.name, exc)
            return
        self.publisher = pub


def node_ip(default_file: bytes | None) -> str | None:
    """``--node-ip`` in an /etc/default/kubelet's ``KUBELET_EXTRA_ARGS`` (shell words, ``=`` or a separate word;
    the last one wins, as with Go's flag parsing), or None when absent. Not an IPv4 address: None, so a bad
    value shows as the node keeping its main address (the real kubelet would refuse to start instead)."""
    if not default_file:
        return None
    found: str | None = None
    for line in default_file.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if not sep or key.strip() != "KUBELET_EXTRA_ARGS":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]  # systemd's EnvironmentFile: the whole quoted rest of the line
        try:
            words = shlex.split(value)
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word.startswith("--node-ip="):
                found = word.split("=", 1)[1]
            elif word == "--node-ip" and i + 1 < len(words):
                found = words[i + 1]
    if found is None:
        return None
    try:
        return str(ipaddress.IPv4Address(found))
    except ValueError:
        return None
