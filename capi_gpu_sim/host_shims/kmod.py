"""`modprobe`, `update-initramfs` and the boot-time coldplug of a simulated GEX131's kernel, one multi-call script.

Why: a simulated host shares the test machine's kernel, which has no NVIDIA GPU and must never load a
module for a guest. Yet the node playbook's hardest failures on a fresh real server are about the kernel:
DKMS built no module (no headers for the running kernel), nouveau holds the GPU (not blacklisted, or
blacklisted without regenerating the initramfs that loads it first), nvidia-persistenced started before
the module was loaded. So the installed image carries this stand-in of the kernel's module state:

* loaded modules are files under ``/run/sim-kmod/`` (a fresh tmpfs every boot, like the kernel's);
* ``modprobe nvidia`` loads only a module that exists for the running kernel
  (``/lib/modules/$(uname -r)/**/nvidia.ko*``, what the DKMS build writes), and fails as the real one
  does ("could not insert 'nvidia': No such device") while nouveau holds the GPU; ``modprobe -r nouveau``
  fails ("in use", the console is on it);
* ``update-initramfs -u [-k K|all]`` records which modules ``/etc/modprobe.d`` blacklists in
  ``/boot/initrd.img-K`` (JSON here, not a cpio);
* ``coldplug`` (a sysinit unit) does what udev does at boot: nouveau binds the GPU when the GPU shim's
  ``nouveau_binds`` knob is set and the initramfs does not blacklist it (the image's own initramfs, written
  before any blacklist, does not), then ``nvidia`` loads when its module exists and nouveau does not hold
  the GPU.

* ``kernel-update`` (after every dpkg run): the ``kernel_update`` knob's kernel lands mid-run, once, and
  ``/boot/vmlinuz`` points at it. The simulated host cannot boot it (it shares the test machine's kernel):
  what the simulation checks is that the playbook builds the module for it and asks for the reboot.

The GPU shim and the nvidia-persistenced stand-in answer only while ``/run/sim-kmod/nvidia`` exists.
Runs inside the guest with the guest's python3 and the standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.environ.get("SIM_KMOD_ROOT", "/"))
STATE = ROOT / "run/sim-kmod"
GPU_CONFIG = ROOT / "var/lib/gpu-shim/config.json"
NVIDIA = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
# What depends on what, so `modprobe -r nvidia` fails while a dependant is loaded.
DEPENDS = {"nvidia_uvm": "nvidia", "nvidia_modeset": "nvidia", "nvidia_drm": "nvidia_modeset"}


def kernel() -> str:
    return os.uname().release


def canonical(name: str) -> str:
    return name.replace("-", "_")


def loaded(name: str) -> bool:
    return (STATE / canonical(name)).exists()


def module_file(name: str, release: str) -> Path | None:
    base = ROOT / "lib/modules" / release
    if not base.is_dir():
        return None
    for path in sorted(base.rglob("*.ko*")):
        if canonical(path.name.split(".ko")[0]) == canonical(name):
            return path
    return None


def blacklisted_in_etc() -> list[str]:
    names: set[str] = set()
    conf = ROOT / "etc/modprobe.d"
    for path in sorted(conf.glob("*.conf")) if conf.is_dir() else []:
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*blacklist\s+(\S+)", line)
            if m:
                names.add(canonical(m.group(1)))
    return sorted(names)


def _gpu_knobs() -> dict[str, object]:
    try:
        data = json.loads(GPU_CONFIG.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mark(name: str) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / canonical(name)).write_text("")


def load(name: str, quiet: bool) -> int:
    name = canonical(name)
    if loaded(name):
        return 0
    if name == "nouveau" or name not in NVIDIA:
        _mark(name)  # the rest of the kernel is the real kernel's business: accept
        return 0
    release = kernel()
    if module_file(name, release) is None:
        if not quiet:
            print(f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{release}", file=sys.stderr)
        return 1
    if loaded("nouveau"):
        print(f"modprobe: ERROR: could not insert '{name}': No such device", file=sys.stderr)
        return 1
    dep = DEPENDS.get(name)
    if dep and load(dep, quiet) != 0:
        return 1
    _mark(name)
    return 0


def remove(name: str) -> int:
    name = canonical(name)
    if not loaded(name):
        print(f"modprobe: FATAL: Module {name} is not in kernel.", file=sys.stderr)
        return 1
    users = [m for m, dep in DEPENDS.items() if dep == name and loaded(m)]
    if users or name == "nouveau":
        print(f"modprobe: FATAL: Module {name} is in use.", file=sys.stderr)
        return 1
    (STATE / name).unlink()
    return 0


def modprobe(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        print("modprobe: ERROR: missing module name.", file=sys.stderr)
        return 1
    quiet = "-q" in flags or "--quiet" in flags
    if "-r" in flags or "--remove" in flags:
        return max(remove(n) for n in names)
    return load(names[0], quiet)


def update_initramfs(argv: list[str]) -> int:
    if not ({"-u", "-c"} & set(argv)):
        print("Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]", file=sys.stderr)
        return 2
    release = argv[argv.index("-k") + 1] if "-k" in argv and argv.index("-k") + 1 < len(argv) else kernel()
    releases = [p.name for p in (ROOT / "lib/modules").iterdir()] if release == "all" else [release]
    for rel in sorted(releases):
        image = ROOT / "boot" / f"initrd.img-{rel}"
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_text(json.dumps({"kernel": rel, "blacklist": blacklisted_in_etc()}) + "\n")
        print(f"update-initramfs: Generating /boot/initrd.img-{rel}")
    return 0


def initramfs_blacklist(release: str) -> list[str]:
    try:
        data = json.loads((ROOT / "boot" / f"initrd.img-{release}").read_text())
    except (OSError, ValueError):
        return []  # the image's own initramfs: built before any blacklist of ours, nouveau inside
    return list(data.get("blacklist", []))


def coldplug() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    release = kernel()
    if _gpu_knobs().get("nouveau_binds") and "nouveau" not in initramfs_blacklist(release):
        _mark("nouveau")
    if not loaded("nouveau") and module_file("nvidia", release) is not None:
        for name in NVIDIA:
            load(name, quiet=True)
    print(f"sim coldplug: loaded {sorted(p.name for p in STATE.iterdir())}")
    return 0


def kernel_update() -> int:
    """A kernel update landing while the node playbook runs, as unattended-upgrades does on a fresh image:
    run after every dpkg invocation (``DPkg::Post-Invoke``), it installs once the kernel the GPU shim's
    ``kernel_update`` knob names, as the kernel package's postinst does: module directory, image, the
    ``/boot/vmlinuz`` link moved to it (the kernel the next boot starts), ``/etc/kernel/postinst.d`` hooks
    (DKMS builds only where headers exist) and an initramfs made from today's ``/etc/modprobe.d``."""
    release = str(_gpu_knobs().get("kernel_update") or "")
    done = ROOT / "var/lib/sim-kmod-kernel-update"
    if not release or done.exists():
        return 0
    (ROOT / "usr/lib/modules" / release).mkdir(parents=True, exist_ok=True)
    (ROOT / "usr/lib/modules" / release / "modules.dep").write_text("")
    boot = ROOT / "boot"
    (boot / f"vmlinuz-{release}").write_text(f"stand-in kernel image {release}\n")
    link = boot / "vmlinuz"
    link.unlink(missing_ok=True)
    link.symlink_to(f"vmlinuz-{release}")
    hooks = ROOT / "etc/kernel/postinst.d"
    for hook in sorted(hooks.iterdir()) if hooks.is_dir() else []:
        if os.access(hook, os.X_OK):
            subprocess.run([str(hook), release, str(boot / f"vmlinuz-{release}")], check=False, timeout=120)
    update_initramfs(["-c", "-k", release])
    done.write_text(release + "\n")
    print(f"sim: kernel {release} installed; the next boot starts it")
    return 0


def main() -> int:
    prog = Path(sys.argv[0]).name
    if prog == "update-initramfs":
        return update_initramfs(sys.argv[1:])
    if prog == "modprobe":
        return modprobe(sys.argv[1:])
    if sys.argv[1:2] == ["coldplug"]:
        return coldplug()
    if sys.argv[1:2] == ["kernel-update"]:
        return kernel_update()
    print(f"kmod shim: unknown program {prog}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
