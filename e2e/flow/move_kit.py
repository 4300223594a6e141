"""A second management cluster for `clusterctl move`: its own control plane (kine + kube-apiserver + CAPI core)
and our release installed on it by the pinned `clusterctl init` of the world's own local repository
(cert-manager, the webhook, the shipped RBAC), run by a pod runner of its own, talking to the same Robot
simulator and the same fleet as the world it stands next to.

CAPI core runs as a process of the control plane on both sides, so its inventory entry (and the sim's
stand-in control-plane provider's) is recorded as `clusterctl init` would have; the move itself is the
real, pinned clusterctl binary.

The workload cluster stays where it is: its nodes live on the world's apiserver, and the moved
``<cluster>-kubeconfig`` Secret keeps pointing there.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from capi_gpu import domain
from capi_gpu.kube import NAMESPACES, SECRETS, Kube
from capi_gpu_sim import binaries, controlplane_object, release
from capi_gpu_sim.controlplane import ControlPlane, Options
from capi_gpu_sim.loopback import OctetLease
from capi_gpu_sim.pods.runner import Config as RunnerConfig
from capi_gpu_sim.pods.runner import PodRunner
from capi_gpu_sim.pods.services import ServiceProxy
from capi_gpu_sim.world import TEARDOWN_GRACE_S, World

# The sim's stand-in control-plane provider, recorded as `clusterctl init` would (nothing installs it).
CONTROL_PLANE_SIM = ("capi-sim-system", "control-plane-sim", "sim", "ControlPlaneProvider", "v0.1.0")


def label_for_move(kube: Kube, namespace: str, names: list[str]) -> None:
    """What docs/clusterctl.md tells users: Secrets nothing owns carry clusterctl's move label."""
    for name in names:
        kube.patch(SECRETS, name, {"metadata": {"labels": {domain.MOVE_LABEL: ""}}}, namespace)


@dataclass
class Target:
    """The second management cluster. ``start`` brings it up empty but initialised; ``stop`` ends it."""

    world: World
    workdir: Path
    cp: ControlPlane = field(init=False)
    pods: PodRunner | None = None
    services: ServiceProxy | None = None

    def __post_init__(self) -> None:
        assert self.world.config.release, "the target installs the same release as the world"
        # The release's Deployments need the deployment/replicaset controllers and the scheduler; the
        # workload cluster (pods, claims, nodes) is still the world's.
        self.loopback = OctetLease("move-target")
        self.service_cidr = f"127.66.{self.loopback.octet}.0/24"
        options = Options(install_our_crds=False, service_cidr=self.service_cidr)
        self.cp = ControlPlane(self.workdir / "controlplane", options)

    def start(self) -> Target:
        """The target initialised as a user would: `clusterctl init` of the same release repository, its own
        pod runner and Service stand-in; the sim's control-plane provider recorded on both sides."""
        world = self.world
        self.cp.start()
        self.kube = self.cp.kube()
        controlplane_object.install(self.kube, self.cp)
        for cp, kube in ((world.cp, world.k), (self.cp, self.kube)):
            release.record_core(cp, kube)
            release.record_provider(kube, *CONTROL_PLANE_SIM)
        slot = world.fleet.slot if world.fleet else 0
        octet = self.service_cidr.split(".")[2]
        api = ("127.0.0.1", self.cp.port)
        self.pods = PodRunner(
            self.cp.kube(),
            RunnerConfig(
                self.workdir, api, self.cp.kubernetes_service_ip, self.cp.ca.pem, f"127.67.{octet}.", f"f{slot}-podt"
            ),
        ).start()
        self.services = ServiceProxy(self.cp.kube(), self.service_cidr, self.pods.endpoints, api).start()
        ns = world.config.namespace
        self.kube.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        assert world.robot is not None
        variables = {
            "CAPI_GPU_SIM_ROBOT_URL": world.robot.url,
            "CAPI_GPU_SIM_TIMING_SCALE": str(world.config.timing_scale),
            "CAPI_GPU_SIM_MIG_PARTED": str(binaries.ensure_mig_parted()),
        }
        config = world.config.state_dir / "repository" / "clusterctl.yaml"
        release.init(self.cp.kubeconfig, config, self.workdir / "clusterctl", variables)
        return self

    def operator_log(self) -> str:
        paths = sorted(self.workdir.glob("pods/*/manager.log"))
        return "".join(p.read_text(errors="replace") for p in paths if p.exists())

    def stop(self) -> None:
        if self.services is not None:
            self.services.stop()
        if self.pods is not None:
            self.pods.stop(TEARDOWN_GRACE_S)
            self.pods.kube.close()
        if getattr(self, "kube", None) is not None:
            self.kube.close()
        self.cp.stop(TEARDOWN_GRACE_S)
        self.loopback.release()


def clusterctl_move(source: Path, target: Path, namespace: str, home: Path, refused: bool = False) -> tuple[str, float]:
    """The pinned clusterctl: ``move --kubeconfig SOURCE --to-kubeconfig TARGET -n NAMESPACE``; its output
    and wall time. Offline: no version check, a config directory of its own. ``refused``: it must fail."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "xdg"),
        "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
    }
    argv = [str(binaries.ensure_clusterctl()), "move", "--kubeconfig", str(source), "--to-kubeconfig", str(target),
            "--namespace", namespace, "-v", "3"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    took = time.monotonic() - started
    assert (proc.returncode != 0) == refused, f"clusterctl move exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr, took
