"""Ubuntu's own NVIDIA packages in the simulated archive: the precompiled-module route.

Why: the node playbook weighs two routes for the kernel module (``nvidia_driver_route``). Ubuntu publishes
signed, prebuilt ``linux-modules-nvidia-<branch>-server-open-<kernel>`` for its kernels, matched by its
``nvidia-driver-<branch>-server-open`` user space; NVIDIA's CUDA repository has DKMS. The simulation offers
both, so the playbook's choice (and its refusal to mix them) runs against real-looking package relations:

* the module package exists per kernel (the running one and the one a simulated update brings), puts the
  module files where the kernel stand-in (``capi_gpu_sim.host_shims.kmod``) loads them, and needs no
  headers, compiler or DKMS;
* the ``-server`` user space ships the same files as the CUDA repository's (``/usr/bin/nvidia-smi``,
  nvidia-persistenced and its unit) and conflicts with it, as the real packages do by their file overlaps:
  one route's module with the other's user space cannot be installed side by side.

The archive also carries its own build of the CUDA repository's branch-suffixed names (``same_names``),
sorting higher, as Ubuntu's does: the nvidia-dkms route must take NVIDIA's anyway (its apt pin).

The in-package module directory (``kernel/nvidia-<branch>srv``) and the ``0ubuntu`` version are the
simulation's; package names follow Ubuntu's.
"""

from __future__ import annotations

import dataclasses

from capi_gpu_sim import apt_standins as std


def same_names(driver_branch: str) -> list[std.Package]:
    """The archive's own build of the names NVIDIA's repository uses for the branch (Ubuntu ships
    nvidia-graphics-drivers-580 as nvidia-driver-580-open, nvidia-dkms-580-open, ...), at a version that sorts
    above NVIDIA's, so only an apt pin keeps the nvidia-dkms route on NVIDIA's build. Same files, another
    version and origin: what a route installed shows in ``dpkg-query``."""
    nvidia = [
        p
        for p in std.nvidia_packages(driver_branch)
        if p.name.endswith(driver_branch) or f"-{driver_branch}-" in p.name
    ]
    return [
        dataclasses.replace(p, version=f"{std.DRIVER_VERSIONS[driver_branch]}-1ubuntu0.24.04.1", channel=std.ARCHIVE)
        for p in nvidia
        if not p.name.startswith("nvidia-driver-pinning-")
    ]


def packages(driver_branch: str, kernels: tuple[str, ...]) -> list[std.Package]:
    b = driver_branch
    upstream = std.DRIVER_VERSIONS[b]
    version = f"{upstream}-0ubuntu0.24.04.1"
    common = f"nvidia-kernel-common-{b}-server"
    modules = [
        std.Package(
            f"linux-modules-nvidia-{b}-server-open-{k}",
            version,
            std.ARCHIVE,
            f"Linux kernel nvidia modules for version {k} (signed, prebuilt; open flavour)",
            {
                f"/lib/modules/{k}/kernel/nvidia-{b}srv/{m}.ko": std._unit(f"stand-in precompiled module {upstream}\n")
                for m in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
            },
            depends=(common,),
            conflicts=(f"nvidia-dkms-{b}-open",),
        )
        for k in kernels
    ]
    return [
        *modules,
        *same_names(b),
        std.Package(common, version, std.ARCHIVE, "shared files for the NVIDIA kernel modules", std._doc(common)),
        std.Package(
            f"nvidia-driver-{b}-server-open",
            version,
            std.ARCHIVE,
            "NVIDIA server driver metapackage (Ubuntu), open kernel modules shipped separately",
            std._doc(f"nvidia-driver-{b}-server-open"),
            depends=(
                f"nvidia-utils-{b}-server",
                f"nvidia-compute-utils-{b}-server",
                f"libnvidia-compute-{b}-server",
                common,
            ),
            conflicts=(f"nvidia-driver-{b}-open",),
        ),
        std.Package(
            f"nvidia-utils-{b}-server",
            version,
            std.ARCHIVE,
            "NVIDIA server driver support binaries: nvidia-smi (GPU shim)",
            {"/usr/bin/nvidia-smi": std._nvidia_smi(upstream), std.SIM_MIG_PARTED: std._gpu_shim("nvidia_mig_parted")},
            conflicts=(f"nvidia-utils-{b}",),
        ),
        std.Package(
            f"libnvidia-compute-{b}-server",
            version,
            std.ARCHIVE,
            "NVIDIA libcompute: NVML (a placeholder file)",
            {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": std._unit("placeholder, not a library\n")},
            conflicts=(f"libnvidia-compute-{b}",),
        ),
        std.Package(
            f"nvidia-compute-utils-{b}-server",
            version,
            std.ARCHIVE,
            "NVIDIA compute utilities: nvidia-persistenced with Ubuntu's unit",
            {
                "/usr/bin/nvidia-persistenced": std._script("persistenced", VERSION=version),
                "/lib/systemd/system/nvidia-persistenced.service": std._unit(std.PERSISTENCED_UNIT),
            },
            conflicts=(f"nvidia-compute-utils-{b}",),
        ),
    ]
