"""A fleet of simulated GEX131 servers behind the Robot simulator, torn down completely whatever happens.

Why a fleet object: the Robot simulator decides *what* a server boots (``robot_hooks.PowerHook``);
something has to own the machines that do the booting, register them as Robot servers with the
addresses they really answer on, run their simulated kubelets, and above all clean up. Teardown is
layered so that nothing survives a failed test: ``close()`` (normal path, also from ``atexit`` and the
CLI's signal handlers) → the slot registry and ``cleanup_stale()`` for crashes (see
``hosts.registry``), which ``start()`` also runs first.

Boot decisions: a Robot reset arrives as ``on_reset(number, kind, BootTarget)``; a reboot from inside
the guest asks Robot what the next boot is (``RobotSim.consume_boot_target``: rescue if an activation
is pending, consumed as on a real server). Without a Robot simulator every boot is the disk.

The local apt repository (``FleetConfig.apt_repo``) is shared, not copied: every boot of a host's disk
binds it read-only at ``aptrepo.GUEST_DIR``, so a controller points the playbooks at it with
``aptrepo.playbook_repositories(repo)`` on any host, freshly installed or not.

With ``FleetConfig.private_links`` the Robot simulator's vSwitches become private links between the hosts
that are ready members (``capi_gpu_sim.private_link``; docs/private-network.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capi_gpu_sim import aptrepo, host_shims, private_link, robot_hooks
from capi_gpu_sim.hosts import boot, hardware, names, netns, registry, rootfs, targets, views
from capi_gpu_sim.hosts.host import Host, HostConfig, Running
from capi_gpu_sim.image_server import ImageServer

if TYPE_CHECKING:
    from capi_gpu.kube import Kube
    from capi_gpu_sim.kubelet import SimKubelet
    from capi_gpu_sim.robot import RobotSim

log = logging.getLogger(__name__)


IMAGES_GUEST_DIR = "/srv/capi-gpu-images"
"""Where ``FleetConfig.images_dir`` also appears in the rescue system (a path spec.image.url admits); the
way a user's image arrives is https, from ``image_server`` (``Fleet.image_url``)."""


@dataclass
class FleetConfig:
    hosts: int = 1
    first_server_number: int = 2_000_001
    state_root: Path | None = None  # the fleet lives in <root>/f<slot>; default /var/tmp/capi-gpu-sim
    product: str = "GEX131"
    dc: str = "FSN1-DC14"
    gpu_device_id: str = hardware.DEFAULT_GPU_DEVICE_ID
    host: HostConfig = field(default_factory=HostConfig)
    slot: int | None = None  # pin a slot (tests of the registry); default: first free
    # The local apt repository (``aptrepo.ensure_repo``), bound read-only at ``aptrepo.GUEST_DIR`` in every
    # boot of a disk, so ``aptrepo.playbook_repositories(repo)`` works on any host; None: no repository.
    apt_repo: aptrepo.AptRepo | None = None
    # Node images (docs/node-images.md): a test-machine directory bound read-only into every rescue boot at
    # ``IMAGES_GUEST_DIR``, and served over https to every host's rescue (``capi_gpu_sim.image_server``,
    # ``Fleet.image_url``); None: no images.
    images_dir: Path | None = None
    # Robot's vSwitches as private links between the hosts (``capi_gpu_sim.private_link``): the ready
    # members of a vSwitch reach each other over their VLAN interfaces, nobody else does. Needs a Robot
    # simulator; off by default, since it reads every member's interfaces every ``private_link_interval_s``.
    private_links: bool = False
    private_link_interval_s: float = 0.5


class Fleet:
    """``with Fleet(FleetConfig(hosts=2), robot=sim) as fleet: ...``"""

    def __init__(self, config: FleetConfig | None = None, robot: RobotSim | None = None) -> None:
        self.config = config or FleetConfig()
        self.robot = robot
        self.hosts: dict[int, Host] = {}
        self.kubelets: dict[int, SimKubelet] = {}
        self._lease: registry.SlotLease | None = None
        self._lock = threading.RLock()
        self._closed = False
        self.state_dir = Path()
        self._base = Path()
        self._layers: tuple[Path, Path] = (Path(), Path())
        self._inner = Path()
        self.rootfs_report: rootfs.BuildReport | None = None
        self.private_links: private_link.PrivateLinks | None = None
        self.image_server: ImageServer | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Fleet:
        registry.cleanup_stale()
        self._lease = registry.SlotLease.acquire(self.config.slot)
        slot = self._lease.slot
        atexit.register(self.close)
        try:
            self.state_dir = (self.config.state_root or names.DEFAULT_STATE_ROOT) / f"f{slot}"
            self.state_dir.mkdir(parents=True, exist_ok=True)
            (self.state_dir / registry.MARKER).write_text(f"fleet slot {slot}, pid {os.getpid()}\n")
            self._record()
            netns.check_network_free(slot)
            self.rootfs_report = rootfs.ensure_rootfs()
            self._base = self.rootfs_report.path
            self._layers = views.build_layers(self.state_dir / "layers", tuple(g for _, g in self._disk_binds()))
            self._inner = boot.write_inner(self.state_dir / "boot-inner.sh")
            if self.config.images_dir is not None:
                self.image_server = ImageServer(self.config.images_dir, self.state_dir / "image-server")
            if self.robot is not None:
                self.robot.power_hook = self
                self.robot.new_server_hook = self
                self.config.host.time_scale = 1.0 / self.robot.clock.compression
            for i in range(self.config.hosts):
                self.add_host(self.config.first_server_number + i)
            if self.config.private_links:
                self._start_private_links()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def slot(self) -> int:
        if self._lease is None:
            raise RuntimeError("fleet not started")
        return self._lease.slot

    def _record(self) -> None:
        if self._lease is not None:
            self._lease.write(
                {
                    "state_dir": str(self.state_dir),
                    "hosts": [
                        {"server_number": n, "netns": h.hn.netns, "veth": h.hn.veth_host, "cgroup": h.hn.cgroup_name}
                        for n, h in self.hosts.items()
                    ],
                }
            )

    def _start_private_links(self) -> None:
        robot = self.robot
        if robot is None:
            raise ValueError("FleetConfig.private_links needs a Robot simulator: its vSwitches are the links")

        def hosts() -> dict[int, names.HostNames]:
            with self._lock:
                return {n: h.hn for n, h in self.hosts.items()}

        self.private_links = private_link.PrivateLinks(
            self.slot, robot.vswitch_links, hosts, self.config.private_link_interval_s
        ).start()

    def _rescue_binds(self) -> tuple[tuple[Path, str], ...]:
        images = self.config.images_dir
        return () if images is None else ((images, IMAGES_GUEST_DIR),)

    def _disk_binds(self) -> tuple[tuple[Path, str], ...]:
        repo = self.config.apt_repo
        return () if repo is None else ((repo.repo_dir, aptrepo.GUEST_DIR),)

    def add_host(self, server_number: int, register: bool = True) -> Host:
        with self._lock:
            index = len(self.hosts)
            hn = names.HostNames(self.slot, index)
            host = Host(
                hn,
                server_number,
                self.state_dir / "hosts" / hn.key,
                self._base,
                self._layers,
                self._inner,
                hardware.gex131(server_number, self.config.gpu_device_id),
                self._next_boot,
                self.config.host,
                disk_binds=self._disk_binds(),
                rescue_binds=self._rescue_binds(),
                rescue_files={} if self.image_server is None else self.image_server.rescue_files(hn.host_ip),
            )
            self.hosts[server_number] = host
            self._record()
        host.create()
        if self.image_server is not None:
            self.image_server.serve_on(hn.host_ip)  # the veth end exists from create() on
        if self.robot is not None and register and not self.robot.set_server_ip(server_number, hn.guest_ip):
            self.robot.add_server(
                server_number,
                name=f"gex131-{index}",
                ip=hn.guest_ip,
                product=self.config.product,
                dc=self.config.dc,
            )
        host.power_on(targets.DiskBoot())
        return host

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for kubelet in list(self.kubelets.values()):
            kubelet.stop()
        if self.image_server is not None:
            self.image_server.close()
        if self.private_links is not None:
            try:
                self.private_links.close()
            except Exception:
                log.exception("fleet: removing the private links failed; the registry sweep will finish it")
        for host in list(self.hosts.values()):
            try:
                host.destroy()
            except Exception:
                log.exception("fleet: destroying %s failed; the registry sweep will finish it", host.name)
        if self._lease is not None:
            registry.cleanup_slot(self._lease.slot)
            self._lease.release()
        atexit.unregister(self.close)

    # -- Robot hooks ----------------------------------------------------------------------------
    def on_reset(self, server_number: int, kind: str, boot_target: robot_hooks.BootTarget) -> None:
        host = self.hosts.get(server_number)
        if host is None:
            log.warning("fleet: reset for unknown server %s", server_number)
            return
        match boot_target.kind:
            case robot_hooks.BootKind.OFF:
                host.power_off(hard=kind == "power_long")
            case robot_hooks.BootKind.HUNG:
                host.never_boot_again = True
                host.reset(kind, targets.DiskBoot())
            case robot_hooks.BootKind.RESCUE | robot_hooks.BootKind.INSTALLED:
                host.never_boot_again = False  # Robot says it boots now (a "never boot" fault was lifted)
                host.reset(kind, _target(boot_target))

    def on_new_server(self, server: robot_hooks.NewServer) -> None:
        host = self.add_host(server.server_number, register=False)
        if self.robot is not None:
            self.robot.set_server_ip(server.server_number, host.guest_ip)

    def _next_boot(self, host: Host) -> targets.BootTarget:
        """After a reboot from inside the guest: what Robot would boot now (consumes a rescue activation)."""
        if self.robot is None:
            return targets.DiskBoot()
        try:
            boot_target = self.robot.consume_boot_target(host.server_number)
        except KeyError:  # a machine Robot does not list (added with register=False): its disk
            return targets.DiskBoot()
        if boot_target.kind is robot_hooks.BootKind.HUNG:
            host.never_boot_again = True  # the host's scheduler then keeps it dark
        return _target(boot_target)

    # -- workload side --------------------------------------------------------------------------
    def attach_workload(self, kube: Kube, **kubelet_options: Any) -> dict[int, SimKubelet]:
        """Start a simulated kubelet (and DRA publisher) per host against the workload apiserver."""
        from capi_gpu_sim.kubelet import SimKubelet

        for number, host in self.hosts.items():
            if number not in self.kubelets:
                self.kubelets[number] = SimKubelet(host, kube, **kubelet_options).start()
        return self.kubelets

    # -- conveniences for tests -----------------------------------------------------------------
    def image_url(self, file_name: str) -> str:
        """The https URL under which every host's rescue fetches ``images_dir/file_name``."""
        if self.image_server is None:
            raise ValueError("FleetConfig.images_dir is not set: this fleet serves no images")
        return self.image_server.url(file_name)

    def host(self, server_number: int | None = None) -> Host:
        if server_number is None:
            return next(iter(self.hosts.values()))
        return self.hosts[server_number]

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "server_number": n,
                "server_ip": h.guest_ip,
                "netns": h.hn.netns,
                "state": h.state.value,
                "running": h.running.value,
                "product": self.config.product,
                "dc": self.config.dc,
            }
            for n, h in self.hosts.items()
        ]


def _target(t: robot_hooks.BootTarget) -> targets.BootTarget:
    if t.kind is robot_hooks.BootKind.RESCUE:
        return targets.RescueBoot(t.authorized_keys, tuple(k.private_openssh for k in t.host_keys), t.rescue_password)
    return targets.DiskBoot()


def install_on_disk(host: Host, files: dict[str, host_shims.GuestFile]) -> None:
    """Put files on the host's disk (the installed OS), live if that OS runs, else into its upper dir.
    For tests that need a program in the OS without going through the apt repository."""
    live = host.init_pid() is not None and host.running in (Running.INSTALLED, Running.PREVIOUS)
    for guest_path, f in files.items():
        target = host.guest_path(guest_path) if live else host.disk_dir / "upper" / guest_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        if f.link is not None:
            target.symlink_to(f.link)
        else:
            target.write_bytes(f.content)
            target.chmod(f.mode)
