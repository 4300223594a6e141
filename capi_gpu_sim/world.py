"""The whole simulated world in one object: control plane, Robot, GEX131 fleet, operator, a cluster.

``capi-gpu dev up`` and the e2e suite both stand on this, so what a user watches in ``make dev`` is
what CI proves. The operator runs as a subprocess (it can be killed at any step and restarted); the
cluster comes from ``config/clusterctl/cluster-template-dev.yaml`` rendered with dev variables.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec
from capi_gpu.kube import (
    CAPI_MACHINEDEPLOYMENTS,
    DEVICECLASSES,
    NAMESPACES,
    PODS,
    RESOURCECLAIMTEMPLATES,
    SECRETS,
    Kube,
    Res,
    ours,
)
from capi_gpu_sim import aptrepo, binaries, caph, controlplane_object, node_pods, nvidia_chart, release, templates
from capi_gpu_sim.controlplane import ControlPlane, Options
from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import cgroups, keys
from capi_gpu_sim.loopback import OctetLease
from capi_gpu_sim.operator_pods import ReleaseOperator
from capi_gpu_sim.pods.runner import Config as RunnerConfig
from capi_gpu_sim.pods.runner import PodRunner
from capi_gpu_sim.pods.services import ServiceProxy
from capi_gpu_sim.robot import RobotSim

T = TypeVar("T")
HOSTS = ours("hetznergpuhosts")
CLUSTERS = ours("hetznergpuclusters")
DRA_CLAIMS = binaries.REPO / "config" / "dra" / "claims"
DRA_CLASSES = binaries.REPO / "config" / "dra"
GATE_PLUGIN_DAEMONSET = DRA_CLASSES / "gate-plugin-daemonset.yaml"
ADDONS_TIMEOUT_S = 300.0
# Seconds a torn-down world gives its processes between SIGTERM and SIGKILL (World.stop).
TEARDOWN_GRACE_S = 1.0


@dataclass
class WorldConfig:
    state_dir: Path
    hosts: int = 3
    compression: float = 600.0  # simulated seconds per real second (Robot, resets, boots)
    timing_scale: float = 60.0  # the operator's provisioning timeouts divided by this
    namespace: str = "gpu"
    cluster: str = "dev"
    layout: str = "all-balanced"
    kubernetes_version: str = "v1.36.3"
    driver_branch: str = "580"
    binding_timeout: int = 30
    operator_args: list[str] = field(default_factory=list)
    # Robot faults (``SimFaults`` fields) in force before anything calls Robot: latency, 5xx, tight limits.
    robot_faults: dict[str, Any] = field(default_factory=dict)
    # The operator installs the workload cluster's DRA add-ons (NVIDIA's chart from its archive in
    # ../shared/upstream, the gate driver, the claim templates) through its Ansible run, as in a user's
    # cluster, and start() waits for AddonsReady. Without it (--no-addons) the world applies the same chart
    # render and the shipped manifests itself. On in `dev up` and e2e/flow/test_addons_from_nothing.py; off
    # elsewhere because the run adds 18-26 s to each world's start on the shared 2-core machine (1-host world
    # up in 13-14 s without it, 31-39 s with it; four starts, 3 Dec 2026), about 3-4 min over CI's ~10 worlds,
    # which a suite at 56 of its 60 min can't take; what they test doesn't depend on who applied the chart.
    addons: bool = False
    # Install the provider as a user does (capi_gpu_sim/release.py): `make release-manifests`' components
    # through the test-only overlay config/sim and `clusterctl init`, with cert-manager, the webhook, the
    # shipped RBAC and ``replicas`` replicas, run by the pod runner. Every e2e world and `make dev` do; off
    # (bench/scaleup only, to keep its figures comparable): the operator runs as a process of the checkout,
    # as cluster-admin, without the webhook.
    release: bool = True
    replicas: int = 1
    # The Cluster is CAPH's (capi_gpu_sim/caph.py): its infrastructureRef a HetznerCluster as CAPH leaves it
    # provisioned, our HetznerGPUCluster attached in add-on mode (spec.clusterRef), as the gpu-workers flavor has it.
    caph: bool = False
    # The HetznerGPUCluster's spec.privateNetwork (docs/private-network.md), and the fleet's private links:
    # the Robot simulator's vSwitches become layer-2 links between their ready members (capi_gpu_sim/private_link.py).
    private_network: dict[str, Any] | None = None


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class World:
    def __init__(self, config: WorldConfig) -> None:
        self.config = config
        self.loopback = OctetLease("world")
        self.service_cidr = f"127.64.{self.loopback.octet}.0/24"
        self.cp = ControlPlane(
            config.state_dir / "controlplane",
            Options(
                binding_timeout_seconds=config.binding_timeout,
                install_our_crds=not config.release,
                service_cidr=self.service_cidr,
            ),
        )
        self.pods: PodRunner | None = None
        self.services: ServiceProxy | None = None
        self.init_seconds: float | None = None
        self.robot: RobotSim | None = None
        self.fleet: Fleet | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self.kube: Kube | None = None
        self.key = keys.generate(comment="capi-gpu-dev")
        self.started = time.monotonic()
        self.operator_starts = 0
        self.released: ReleaseOperator | None = None  # the manager Deployment's containers (release worlds)
        self.node_pods: node_pods.NodePods | None = None
        self.addons_seconds: float | None = None
        """How long start() waited, once the operator ran, for its add-ons run to set AddonsReady=True."""

    @property
    def images_dir(self) -> Path:
        """Node images (docs/node-images.md) a test bakes into: the fleet serves this directory over https to
        every rescue boot (``fleet.image_url(name)``, what a template's ``spec.image.url`` names), and binds
        it at ``fleet.IMAGES_GUEST_DIR`` too, for the path form."""
        path = self.config.state_dir / "images"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def user_kubeconfig(self) -> Path:
        """The kubeconfig handed to the user (``dev up`` prints it): admin, its context's namespace the
        world's, so ``kubectl get`` and ``capi-gpu hosts list`` without ``-n`` see the world's objects.
        The control plane's own admin kubeconfig stays without one (its components, tests, the workload
        cluster's Secret)."""
        return self.config.state_dir / "kubeconfig"

    def write_user_kubeconfig(self) -> Path:
        """Write ``user_kubeconfig`` (after ``start``: it needs the control plane's CA, port and token)."""
        path = self.user_kubeconfig
        path.touch(mode=0o600)
        path.chmod(0o600)  # before the admin token goes in
        path.write_text(yaml.safe_dump(self.cp.kubeconfig_dict(namespace=self.config.namespace)))
        return path

    @property
    def k(self) -> Kube:
        assert self.kube is not None
        return self.kube

    def start(self) -> World:
        cfg = self.config
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.cp.start()
            self.kube = self.cp.kube()
            self.robot = RobotSim(compression=cfg.compression).start()
            if cfg.robot_faults:
                self.robot.set_faults(**cfg.robot_faults)
            repo = aptrepo.ensure_repo(cfg.kubernetes_version, cfg.driver_branch)
            self.repo = repo
            self.fleet = Fleet(
                FleetConfig(
                    hosts=cfg.hosts,
                    apt_repo=repo,
                    private_links=cfg.private_network is not None,
                    images_dir=self.images_dir,
                ),
                robot=self.robot,
            ).start()
            # No kubelet publishes NVIDIA slices until the chart's DaemonSet runs a plugin pod on its node:
            # node_pods decides that, as the DaemonSet controller would.
            self.fleet.attach_workload(self.kube, publish_dra=False)
            # The NVIDIA plugin's pod and the kubelet's side of pod deletion (relayout, drains, evictions).
            fleet = self.fleet
            self.node_pods = node_pods.NodePods(self.cp.kube(), lambda: list(fleet.kubelets.values())).start()
            self._namespace_and_secrets()
            if not cfg.addons:
                self._addons_by_hand()
            if cfg.release:
                self.install_release()
            self.register_hosts()
            self.apply_cluster()
            if not cfg.release:
                self.start_operator()
            if cfg.addons:
                self.wait_addons_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def install_release(self) -> None:
        """The pod runner and the Service stand-in, then `clusterctl init` of the release (cert-manager
        first), waiting until both are available; sets ``init_seconds``."""
        cfg = self.config
        slot = self.fleet.slot if self.fleet is not None else 0
        octet = self.service_cidr.split(".")[2]
        self.pods = PodRunner(
            self.cp.kube(),
            RunnerConfig(
                cfg.state_dir,
                ("127.0.0.1", self.cp.port),
                self.cp.kubernetes_service_ip,
                self.cp.ca.pem,
                f"127.65.{octet}.",
                f"f{slot}-pod",
                backoff_scale=1 / cfg.timing_scale,
            ),
        ).start()
        self.released = ReleaseOperator(self.pods)
        api = ("127.0.0.1", self.cp.port)
        self.services = ServiceProxy(self.cp.kube(), self.service_cidr, self.pods.endpoints, api).start()
        release.record_core(self.cp, self.k)
        extra = [*self._addons_args(), *cfg.operator_args]
        overlay = release.world_overlay(cfg.state_dir / "overlay", self.playbook_vars_file(), extra, cfg.replicas)
        config = release.repository(cfg.state_dir / "repository", release.components(overlay))
        assert self.robot is not None
        variables = {
            "CAPI_GPU_SIM_ROBOT_URL": self.robot.url,
            "CAPI_GPU_SIM_TIMING_SCALE": str(cfg.timing_scale),
            # The image has it at /opt/capi-gpu/libexec; the stand-in image is the checkout, so the built one.
            "CAPI_GPU_SIM_MIG_PARTED": str(binaries.ensure_mig_parted()),
        }
        out, self.init_seconds = release.init(self.cp.kubeconfig, config, cfg.state_dir / "clusterctl", variables)
        (cfg.state_dir / "clusterctl-init.log").write_text(out)
        self.operator_starts = 1

    def operator_pods(self) -> list[dict[str, Any]]:
        """The manager Deployment's pods (release worlds)."""
        return self.k.list(PODS, release.SYSTEM_NAMESPACE, label_selector="control-plane=controller-manager")

    def _namespace_and_secrets(self) -> None:
        cfg, robot = self.config, self.robot
        assert robot is not None
        self.k.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cfg.namespace}})

        def secret(name: str, data: dict[str, str], type_: str = "Opaque") -> None:
            self.k.apply(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": type_,
                    "metadata": {"name": name, "namespace": cfg.namespace},
                    "stringData": data,
                },
                cfg.namespace,
            )

        secret("robot-credentials", {"robot-user": robot.username, "robot-password": robot.password})
        secret("robot-ssh", {"ssh-privatekey": self.key.private_openssh, "ssh-publickey": self.key.public_line})
        secret(f"{cfg.cluster}-gpu-bootstrap", {"value": self.bootstrap_data()}, "cluster.x-k8s.io/secret")
        self.cp.write_workload_kubeconfig(cfg.cluster, cfg.namespace)

    def bootstrap_data(self) -> str:
        """What CABPK would render for a GPU worker: a kubeadm join with the startup taint and providerID."""
        token = f"{secrets.token_hex(3)}.{secrets.token_hex(8)}"
        join = {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "JoinConfiguration",
            "discovery": {
                "bootstrapToken": {
                    "apiServerEndpoint": self.cp.url.removeprefix("https://"),
                    "token": token,
                    "unsafeSkipCAVerification": True,
                }
            },
            "nodeRegistration": {
                "name": "{{ v1.local_hostname }}",
                "taints": [{"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}],
                "kubeletExtraArgs": [
                    {
                        "name": "provider-id",
                        "value": f"{domain.PROVIDER_ID_PREFIX}{{{{ ds.meta_data.server_number }}}}",
                    },
                    {
                        "name": "node-labels",
                        "value": f"{domain.LABEL_GPU_PRESENT}=true",
                    },
                ],
            },
        }
        content = "".join(f"      {line}\n" for line in yaml.safe_dump(join, sort_keys=False, width=1000).splitlines())
        # As CABPK writes it: jinja header, the join config as a literal block, then the runcmd.
        return (
            "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n"
            f"  permissions: '0640'\n  content: |\n{content}"
            "runcmd:\n- kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml\n"
            f"- mkdir -p /run/cluster-api && echo success > {domain.BOOTSTRAP_SENTINEL}\n"
        )

    def wait_addons_ready(self, timeout: float = ADDONS_TIMEOUT_S) -> dict[str, Any]:
        """Until the operator's add-ons run set AddonsReady=True on the world's HetznerGPUCluster; returns the
        condition. ``addons_seconds``: how long this waited (called right after the operator started)."""
        t0 = time.monotonic()

        def ready() -> dict[str, Any] | None:
            obj = self.k.get_or_none(CLUSTERS, self.config.cluster, self.config.namespace) or {}
            conds = (obj.get("status") or {}).get("conditions") or []
            cond = next((c for c in conds if c.get("type") == "AddonsReady"), None)
            if self.operator is not None and self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}); see {self.config.state_dir}")
            return cond if cond is not None and cond.get("status") == "True" else None

        cond = wait_for("AddonsReady=True on the HetznerGPUCluster", ready, timeout, interval=0.5)
        self.addons_seconds = time.monotonic() - t0
        return cond

    def _addons_by_hand(self) -> None:
        """What the operator's add-ons run would install, for worlds that run it with --no-addons: the chart's
        objects from the real chart's render (its DeviceClasses and kubelet-plugin DaemonSet among them),
        the gate DeviceClass and kubelet-plugin DaemonSet, and the claim templates in the world's namespace."""
        nvidia_chart.install(self.k)
        for path in sorted(DRA_CLASSES.glob("*deviceclass*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    self.k.apply(DEVICECLASSES, doc)
        gate_plugin = yaml.safe_load(GATE_PLUGIN_DAEMONSET.read_text())
        self.k.apply(node_pods.DAEMONSETS, gate_plugin, gate_plugin["metadata"]["namespace"])
        for path in sorted(DRA_CLAIMS.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "ResourceClaimTemplate":
                    doc["metadata"]["namespace"] = self.config.namespace
                    self.k.apply(RESOURCECLAIMTEMPLATES, doc, self.config.namespace)

    def register_hosts(self, numbers: list[int] | None = None) -> None:
        assert self.fleet is not None
        for n in sorted(self.fleet.hosts) if numbers is None else numbers:
            host = HetznerGPUHost(metadata={"name": f"gex131-{n}"}, spec=HetznerGPUHostSpec(server_number=n)).wire()
            host.pop("status", None)
            self.k.apply(HOSTS, host, self.config.namespace)

    def add_host(self) -> int:
        """One more GEX131 in the running world (its previous OS up, a kubelet, its HetznerGPUHost); returns
        its server number. A fresh host is inspected from scratch: rescue activation, reset, inspection."""
        assert self.fleet is not None
        number = max(self.fleet.hosts, default=self.fleet.config.first_server_number - 1) + 1
        self.fleet.add_host(number)
        self.fleet.attach_workload(self.k, publish_dra=False)
        self.register_hosts([number])
        return number

    def template_values(self) -> dict[str, str]:
        cfg, robot = self.config, self.robot
        assert robot is not None
        port = self.cp.url.rsplit(":", 1)[1]
        return {
            "CLUSTER_NAME": cfg.cluster,
            "NAMESPACE": cfg.namespace,
            "KUBERNETES_VERSION": cfg.kubernetes_version,
            "CONTROL_PLANE_ENDPOINT_HOST": "127.0.0.1",
            "CONTROL_PLANE_ENDPOINT_PORT": port,
            "GPU_MIG_LAYOUT": cfg.layout,
            "GPU_DRIVER_BRANCH": cfg.driver_branch,
        }

    def apply_cluster(self) -> None:
        controlplane_object.install(self.k, self.cp)
        cfg = self.config
        docs = templates.render(templates.TEMPLATES / "cluster-template-dev.yaml", self.template_values())
        if cfg.caph:
            caph.install(self.k, self.cp)
            port = int(self.cp.url.rsplit(":", 1)[1])
            self.k.apply(
                caph.HETZNER_CLUSTERS,
                caph.hetzner_cluster(cfg.cluster, cfg.namespace, "127.0.0.1", port),
                cfg.namespace,
            )
            caph.mark_provisioned(self.k, cfg.cluster, cfg.namespace)
            docs = caph.attach(docs, cfg.cluster)
        if cfg.private_network is not None:
            for doc in docs:
                if doc["kind"] == "HetznerGPUCluster":
                    doc["spec"]["privateNetwork"] = cfg.private_network
        for doc in docs:
            group, _, version = doc["apiVersion"].rpartition("/")
            res = Res(group, version, doc["kind"].lower() + "s")
            self.k.apply(res, doc, self.config.namespace)
        controlplane_object.mark_initialized(
            self.k, self.config.cluster, self.config.namespace, self.config.kubernetes_version
        )

    def playbook_vars_file(self) -> Path:
        overrides = {
            k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v)
            for k, v in aptrepo.playbook_repositories(self.repo).items()
        }
        path = self.config.state_dir / "playbook-vars.yaml"
        path.write_text(yaml.safe_dump(overrides))
        return path

    def start_operator(self, extra: list[str] | None = None) -> subprocess.Popen[bytes] | None:
        """Start the operator's process; in a release world, wait until the kubelet has restarted every
        container ``kill_operator`` stopped (there is no process of ours to start)."""
        if self.released is not None:
            assert not extra, "a release world's flags are the overlay's (WorldConfig.operator_args)"
            self.released.restarted()
            self.operator_starts += 1
            return None
        assert self.robot is not None
        self.operator_starts += 1
        log = (self.config.state_dir / f"operator-{self.operator_starts}.log").open("wb")
        argv = [
            sys.executable,
            "-m",
            "capi_gpu.cli",
            "run",
            "--kubeconfig",
            str(self.cp.kubeconfig),
            "--robot-url",
            self.robot.url,
            "--allow-plain-http",
            "--timing-scale",
            str(self.config.timing_scale),
            "--metrics-port",
            "0",
            "--liveness",
            "",
            "--artifacts-dir",
            str(self.config.state_dir / "artifacts"),
            "--playbook-vars",
            str(self.playbook_vars_file()),
            "--mig-parted",
            str(binaries.ensure_mig_parted()),
            *self._addons_args(),
            *self.config.operator_args,
            *(extra or []),
        ]
        # In a cgroup of its own, as in a container: killing it ends everything it started (ansible-playbook,
        # ssh-agent, ssh control masters), which a kill of the one process would leave running.
        group = cgroups.ensure(self._operator_cgroup())
        wrapped = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]
        self.operator = subprocess.Popen(wrapped, stdout=log, stderr=subprocess.STDOUT, cwd=binaries.REPO)
        log.close()  # the operator has its own copy of the descriptor; ours would leak (ResourceWarning)
        return self.operator

    def _addons_args(self) -> list[str]:
        if not self.config.addons:
            return ["--no-addons"]  # the world applied the same objects itself (_addons_by_hand)
        # The chart from its archive, as tests and CI install it; a user's operator pulls it from the registry.
        return ["--addons-chart", str(nvidia_chart.CHART), "--helm", str(binaries.ensure_helm())]

    def _operator_cgroup(self) -> str:
        slot = self.fleet.slot if self.fleet is not None else 0
        return f"f{slot}-operator"  # the fleet slot's name: the registry's stale sweep removes it too

    def kill_operator(self, signal_: int = 9) -> None:
        """Stop the operator with ``signal_`` (9: a crash, 15: a graceful stop) and, as a container runtime
        does when the main process ends, everything else left in its cgroup. In a release world: the same
        to each manager container, which the kubelet then restarts (``start_operator`` waits for that)."""
        if self.released is not None:
            self.released.kill(signal_)
            return
        if self.operator is not None and self.operator.poll() is None:
            self.operator.send_signal(signal_)
            try:
                self.operator.wait(30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait(10)
        if self.fleet is not None:
            cgroups.destroy(self._operator_cgroup())
        self.operator = None

    def scale(self, replicas: int, md: str | None = None) -> None:
        name = md or f"{self.config.cluster}-gpu"
        self.k.patch(CAPI_MACHINEDEPLOYMENTS, name, {"spec": {"replicas": replicas}}, self.config.namespace)

    def hosts(self) -> list[dict[str, Any]]:
        return self.k.list(HOSTS, self.config.namespace)

    def operator_failure(self) -> str | None:
        """Why the operator stopped without the test asking (its process exited, or a manager container
        restarted by itself), or None."""
        if self.released is not None:
            return self.released.unordered_exit()
        if self.operator is not None and self.operator.poll() is not None:
            return f"the operator exited ({self.operator.returncode}); see {self.config.state_dir}"
        return None

    def artifacts_dirs(self) -> list[Path]:
        """Where the operator keeps its Ansible artifacts: the manager pods' volumes, or the process's dir."""
        if self.released is not None:
            return self.released.artifacts_dirs()
        return [self.config.state_dir / "artifacts"]

    def operator_logs(self) -> str:
        """Every operator process's output: the test's processes, or the manager pods' containers."""
        paths = [*self.config.state_dir.glob("operator-*.log"), *self.config.state_dir.glob("pods/*/manager.log")]
        return "".join(p.read_text(errors="replace") for p in sorted(paths))

    def dump(self) -> Path:
        """Events and statuses of everything, for a post-mortem (a failed test prints the path)."""
        from capi_gpu.kube import CAPI_MACHINES, EVENTS, NODES

        path = self.config.state_dir / "dump.json"
        if self.kube is None:
            return path
        ns = self.config.namespace
        doc = {
            "events": [
                f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e.get('reason')}: "
                f"{e.get('message')}"
                for e in self.k.list(EVENTS, ns)
            ],
            "hosts": {h["metadata"]["name"]: h.get("status") for h in self.k.list(HOSTS, ns)},
            "machines": {m["metadata"]["name"]: m.get("status") for m in self.k.list(CAPI_MACHINES, ns)},
            "gpumachines": {
                m["metadata"]["name"]: m.get("status") for m in self.k.list(ours("hetznergpumachines"), ns)
            },
            "nodes": {
                n["metadata"]["name"]: {
                    "taints": n["spec"].get("taints"),
                    "conditions": n.get("status", {}).get("conditions"),
                }
                for n in self.k.list(NODES)
            },
        }
        path.write_text(json.dumps(doc, indent=1, default=str))
        return path

    def stop(self) -> None:
        """Tear the world down. Nothing in it outlives it (kine is in memory, the fleet's disks are
        removed), so its processes get ``TEARDOWN_GRACE_S`` to exit before SIGKILL: the operator and
        kube-apiserver each used to spend their full grace (5 s, 10 s) on every world's teardown. Tests of a
        graceful stop signal the process themselves (``kill_operator(15)``)."""
        with contextlib.suppress(Exception):
            self.dump()
        if self.released is None:
            self.kill_operator(9)
        if self.services is not None:
            self.services.stop()
        if self.pods is not None:
            self.pods.stop(TEARDOWN_GRACE_S)
            self.pods.kube.close()
        if self.node_pods is not None:
            self.node_pods.stop()
            self.node_pods.kube.close()
        if self.fleet is not None:
            self.fleet.close()
        if self.robot is not None:
            self.robot.stop()
        if self.kube is not None:
            self.kube.close()
        self.cp.stop(TEARDOWN_GRACE_S)
        self.loopback.release()
