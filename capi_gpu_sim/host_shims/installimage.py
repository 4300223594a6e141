"""Hetzner's `installimage`, simulated inside a host's rescue system.

Why it exists: the provider drives installimage exactly as on a real server (write ``/autosetup``, run
``installimage -a -c /autosetup -x /root/post-install.sh`` under nohup, poll, read ``/root/debug.txt``),
so the shim must accept what installimage accepts and reject what it rejects, with the same messages
(hetzneronline/installimage ``functions.sh`` ``validate_vars``). Then it "installs": partitions recorded
on the host's simulated disks, the ``installed`` view's upper dir reset (a fresh image), hostname and
new host keys written, the post-install script run chrooted into the new system (where the provider
writes the OS host key and the NoCloud seed), config and debug log copied to ``/installimage.conf`` and
``/installimage.debug`` there, and a record left for the simulator so the next boot is the new OS.
Every run appends its start and its end to ``/run/sim/disk/installimage-runs.jsonl`` (the host's
``installimage_runs()``), so a test can tell one install from two. Fault knob (hardware.json):
``installimage_replaces_hostkey`` makes the install generate its own ed25519 host key after the post-install
script, as an image that ships one would: the installed OS then presents a key nobody pinned.

The installed OS is the simulator's bookworm tree whatever IMAGE names: the image name is validated
(suffix, architecture, existence for local paths) but a plain image is not unpacked. A capi-gpu node
image (a local archive with the ``etc/capi-gpu/image-manifest.json`` member, docs/node-images.md) is:
it becomes the new upper layer over the bookworm tree instead of the empty one, so the node comes up
with what the image carried (the simulator's stand-in for installimage writing the image's root). UEFI is decided as
installimage decides it, by ``/sys/firmware/efi`` (the simulator shows it when the ``uefi`` hardware knob
is set): then the config needs exactly one ESP (``PART /boot/efi esp 256M`` or larger).

Paths (bind-mounted by the simulator into the rescue view): ``/run/sim/disk`` (upper, work,
partitions.json, installed.json), ``/run/sim/image`` (the read-only base tree), ``/run/sim/hw``.
Standard library only; runs with the guest's python3.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DISK = Path(os.environ.get("SIM_DISK", "/run/sim/disk"))
IMAGE_ROOT = Path(os.environ.get("SIM_IMAGE", "/run/sim/image"))
HW_PATH = Path(os.environ.get("SIM_HW_PATH", "/run/sim/hw/hardware.json"))
DEBUG = Path("/root/debug.txt")
# installimage's only test for UEFI (functions.sh: ``[ -d /sys/firmware/efi ] && UEFI=1``).
EFI_DIR = Path("/sys/firmware/efi")
FOLD = Path("/installimage")
SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar.zst", ".tzst")
FILESYSTEMS = {"bios_grub", "btrfs", "ext2", "ext3", "ext4", "reiserfs", "xfs", "swap", "none", "esp"}
MIB = 1024 * 1024
NODE_IMAGE_MANIFEST = "etc/capi-gpu/image-manifest.json"  # capi_gpu.provisioning.image_manifest.MANIFEST_PATH


class ConfigError(Exception):
    """A validation failure; the message is installimage's own wording."""


@dataclass
class Part:
    mount: str
    fs: str
    size: str  # MiB as digits, or "all"


@dataclass
class Config:
    drives: dict[int, str] = field(default_factory=dict)
    swraid: str = "0"
    swraidlevel: str = "1"
    bootloader: str = "grub"
    hostname: str = ""
    image: str = ""
    governor: str = "performance"
    parts: list[Part] = field(default_factory=list)
    lvs: list[list[str]] = field(default_factory=list)
    sshkeys_url: str = ""
    format_drives: dict[int, str] = field(default_factory=dict)


def debug(msg: str) -> None:
    with DEBUG.open("a") as fh:
        fh.write(f"{time.strftime('[%H:%M:%S]')} {msg}\n")


def _size_mib(raw: str) -> str:
    if raw.lower() == "all":
        return "all"
    m = re.fullmatch(r"(\d+)([MGT]?)", raw, flags=re.IGNORECASE)
    if not m:
        return raw
    factor = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return str(int(m.group(1)) * factor)


SIMPLE_KEYS = {
    "SWRAID": "swraid",
    "SWRAIDLEVEL": "swraidlevel",
    "BOOTLOADER": "bootloader",
    "HOSTNAME": "hostname",
    "IMAGE": "image",
    "GOVERNOR": "governor",
    "SSHKEYS_URL": "sshkeys_url",
}


def parse(text: str) -> Config:
    cfg = Config()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, rest = line.partition(" ")
        rest = rest.strip()
        words = rest.split()
        if m := re.fullmatch(r"(FORMAT)?DRIVE(\d+)", key):
            (cfg.format_drives if m.group(1) else cfg.drives)[int(m.group(2))] = rest
        elif key in SIMPLE_KEYS:
            setattr(cfg, SIMPLE_KEYS[key], rest)
        elif key == "PART":
            words += [""] * (3 - len(words))
            cfg.parts.append(Part(words[0], words[1], _size_mib(words[2])))
        elif key == "LV":
            cfg.lvs.append(words)
        else:
            debug(f"ignoring unknown config line: {key}")
    return cfg


def _disk_names() -> dict[str, int]:
    hw = json.loads(HW_PATH.read_text())
    return {d["name"]: int(d["size"]) for d in hw.get("disks", [])}


def resolve_drive(path: str) -> str | None:
    """The disk name behind a DRIVE value, or None when it is not one of this server's disks."""
    names = _disk_names()
    if path.startswith("/dev/disk/"):
        path = os.path.realpath(path)
    if path.startswith("/dev/") and path[5:] in names:
        return path[5:]
    return None


def _validate_image(image: str) -> None:
    if not image:
        raise ConfigError("ERROR: No valid IMAGEPATH")
    name = image.rsplit("/", 1)[-1]
    if not name.endswith(SUFFIXES):
        ext = name.split(".", 1)[1] if "." in name else name
        raise ConfigError(f"ERROR: {ext} is no valid FILETYPE for images")
    arch = re.sub(r".*-(32|64|i386|amd64|arm64)-.*", r"\1", name)
    if "-" in arch:
        raise ConfigError("ERROR: can not determine image arch from filename")
    if arch not in ("amd64", "64", "32", "i386", "x86_64"):  # img_arch_matches_sysarch
        raise ConfigError(f"ERROR: can not install an {arch} image on a x86_64 system")
    if image.startswith("/") and not Path(image).is_file():
        raise ConfigError(f"ERROR: Image file {image} not found")


def _validate_drives(cfg: Config) -> list[str]:
    if cfg.swraid not in ("0", "1"):
        raise ConfigError("ERROR: Value for SWRAID is not correct")
    if cfg.swraid == "1" and cfg.swraidlevel not in ("0", "1", "5", "6", "10"):
        raise ConfigError("ERROR: Value for SWRAIDLEVEL is not correct")
    if 1 not in cfg.drives or resolve_drive(cfg.drives[1]) is None:
        raise ConfigError(f"ERROR: Value for DRIVE1 is not correct: {cfg.drives.get(1, '')} ")
    seen: dict[str, int] = {}
    used: list[str] = []
    for i in sorted(cfg.drives):
        drive = cfg.drives[i]
        if drive in seen:
            raise ConfigError(f"Duplicate DRIVE definition. {drive} used for DRIVE{seen[drive]} and DRIVE{i}")
        seen[drive] = i
        fmt = cfg.format_drives.get(i, "0")
        if i > 1 and fmt not in ("0", "1"):
            raise ConfigError(f"ERROR: Value for FORMATDRIVE{i} is not correct")
        if i > 1 and fmt == "1" and cfg.swraid == "1":
            raise ConfigError(
                f"ERROR: FORMATDRIVE{i} _AND_ SWRAID are active - use one or none of these options, not both"
            )
        if cfg.swraid == "1" or fmt == "1" or i == 1:
            name = resolve_drive(drive)
            if name is None:
                raise ConfigError(f"ERROR: Value for DRIVE{i} is not correct: {drive}")
            used.append(name)
    _validate_raid(cfg)
    return used


def _validate_raid(cfg: Config) -> None:
    count = len(cfg.drives)
    if cfg.swraid == "1":
        if count <= 1:
            raise ConfigError("ERROR: You need to select at least 2 disks for creating software raid!")
        need = {"5": 3, "6": 4, "10": 2}.get(cfg.swraidlevel, 0)
        if count < need:
            raise ConfigError(f"ERROR: Not enough disks for RAID level {cfg.swraidlevel}")
        if cfg.swraidlevel in ("0", "5", "6", "10") and not any(p.mount == "/boot" for p in cfg.parts):
            raise ConfigError("ERROR: You need a /boot partition when using software RAID level 0, 5, 6 or 10")


def _check_part(i: int, part: Part, last: bool) -> None:
    if not re.match(r"^(/\w*|none$|swap$|lvm$|btrfs\.\w+)", part.mount):
        raise ConfigError(
            f"ERROR: Mountpoint for partition {i} is not correct: '{part.mount}' is not a valid mountpoint"
        )
    if part.fs not in FILESYSTEMS and part.mount != "lvm":
        raise ConfigError(f"ERROR: Filesystem for partition {i} is not correct")
    if part.fs == "none" and part.mount != "none":
        raise ConfigError(f"ERROR: No filesystem for partition {i}, but mounted to {part.mount}")
    if part.size == "all" and not last:
        raise ConfigError('ERROR: Partition size "all" has to be on the last partition')
    if part.size != "all" and (not part.size.isdigit() or part.size == "0"):
        raise ConfigError(f"ERROR: The size of the partition PART {part.mount} is not a valid number")
    if part.fs == "esp":  # functions.sh validate_vars, "count ESP"
        if part.mount != "/boot/efi":
            raise ConfigError("ERROR: EFI System Partition (ESP) must be mounted at /boot/efi")
        if part.size == "all":
            raise ConfigError("ERROR: EFI System Partition MUST NOT be all remaining disk space")
        if int(part.size) < 256:
            raise ConfigError(f"ERROR: EFI System Partition (ESP) has to be at least 256M (current size: {part.size})")
    if part.mount == "/boot" and part.size != "all" and int(part.size) < 200:
        raise ConfigError(f"ERROR: Your /boot partition has to be at least 200M (current size: {part.size})")
    if part.mount == "/" and part.size != "all" and int(part.size) < 1500:
        raise ConfigError(f"ERROR: Your / partition has to be at least 1500M (current size: {part.size})")


def _validate_parts(cfg: Config) -> None:
    if not cfg.parts:
        raise ConfigError("ERROR: The config has no partitions")
    for i, part in enumerate(cfg.parts, start=1):
        _check_part(i, part, last=i == len(cfg.parts))
    if EFI_DIR.is_dir() and sum(1 for p in cfg.parts if p.fs == "esp") != 1:
        raise ConfigError("ERROR: ESP missing or multiple ESP found")
    mounts = [p.mount for p in cfg.parts if p.mount not in ("lvm", "swap", "none")]
    mounts += [lv[2] for lv in cfg.lvs if len(lv) > 2 and lv[2] != "none"]
    dupes = sorted({m for m in mounts if mounts.count(m) > 1})
    if dupes:
        raise ConfigError(f"ERROR: There are identical mountpoints in the config ({', '.join(dupes)})")
    vgs = {p.fs for p in cfg.parts if p.mount == "lvm"}
    for lv in cfg.lvs:
        if len(lv) < 5:
            raise ConfigError(f"ERROR: Mountpoint for LV '{lv[1] if len(lv) > 1 else ''}' is not correct")
        if lv[0] not in vgs:
            raise ConfigError(f"ERROR: LVM volume group '{lv[0]}' not defined")
    if "/" not in mounts:
        raise ConfigError("ERROR: You dont have a partition for /")


def validate(cfg: Config) -> list[str]:
    """installimage's order of checks; returns the disk names the install will write."""
    _validate_image(cfg.image)
    used = _validate_drives(cfg)
    _validate_parts(cfg)
    sizes = _disk_names()
    drive_mib = min(sizes[d] for d in used) // MIB - 1024 * sum(1 for p in cfg.parts if p.size == "all")
    parts_mib = sum(int(p.size) for p in cfg.parts if p.size != "all")
    if drive_mib < parts_mib:
        raise ConfigError(
            "ERROR: You are going to use more space than your drives have available.\n"
            f"Usage: {parts_mib} MiB of {drive_mib} MiB\nDiff: {drive_mib - parts_mib} MiB"
        )
    if cfg.bootloader.lower() != "grub":
        raise ConfigError("ERROR: No valid BOOTLOADER")
    if cfg.governor.lower() not in ("powersave", "performance", "ondemand"):
        raise ConfigError("ERROR: No valid GOVERNOR")
    if not cfg.hostname:
        raise ConfigError("ERROR: HOSTNAME may not be empty")
    return used


def _step(n: int, text: str, status: str = "done") -> None:
    print(f"  {n:>2}/10  :  {text:<44}{status}", flush=True)
    debug(f"# {text}: {status}")


def _record_partitions(cfg: Config, disks: list[str]) -> None:
    path = DISK / "partitions.json"
    table: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    sizes = _disk_names()
    for name in disks:
        rows, left = [], sizes[name] - MIB
        for part in cfg.parts:
            size = left if part.size == "all" else int(part.size) * MIB
            left -= size
            fstype = (
                "linux_raid_member"
                if cfg.swraid == "1"
                else ("LVM2_member" if part.mount == "lvm" else part.fs if part.fs != "none" else None)
            )
            rows.append({"size": size, "fstype": fstype, "mount": part.mount})
        table[name] = rows
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(path)


def _reset_upper() -> None:
    for sub in ("upper", "work"):
        target = DISK / sub
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(mode=0o755)


SIM_GPU_STATE = "var/lib/gpu-shim"


def is_node_image(image: str) -> bool:
    """A local archive carrying the capi-gpu manifest (GNU tar finds the compression itself)."""
    if not image.startswith("/"):
        return False
    for member in (NODE_IMAGE_MANIFEST, f"./{NODE_IMAGE_MANIFEST}"):
        cmd = ["tar", "-xOf", image, "--occurrence=1", member]
        if subprocess.run(cmd, capture_output=True, timeout=600, check=False).returncode == 0:
            return True
    return False


def _unpack_node_image(image: str) -> None:
    """The image's tree as the new upper layer (owners and modes as archived: the rescue system is root)."""
    cmd = ["tar", "-xpf", image, "--numeric-owner", "-C", str(DISK / "upper")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"ERROR: extracting {image} failed: {proc.stderr[-500:]}")
    # The simulated GPU keeps its state in the host's firmware layer, which a bake of a running root reads
    # through the overlay; it is the source's hardware, not its OS, so the new disk never carries it.
    shutil.rmtree(DISK / "upper" / SIM_GPU_STATE, ignore_errors=True)


def _mount_new_system(hdd: Path) -> None:
    hdd.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={IMAGE_ROOT},upperdir={DISK / 'upper'},workdir={DISK / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(hdd)], check=True, timeout=30)
    binds = (("proc", ["-t", "proc", "proc"]), ("dev", ["--rbind", "/dev"]), ("sys", ["--rbind", "/sys"]))
    for sub, args in binds:
        subprocess.run(["mount", *args, str(hdd / sub)], check=True, timeout=30)


def _umount(hdd: Path) -> None:
    for sub in ("sys", "dev", "proc", ""):
        subprocess.run(["umount", "-l", str(hdd / sub) if sub else str(hdd)], check=False, timeout=30)


def _configure(cfg: Config, hdd: Path, keep_hostkeys: bool) -> None:
    (hdd / "etc" / "hostname").write_text(cfg.hostname + "\n")
    (hdd / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {cfg.hostname}\n::1 localhost\n")
    (hdd / "etc" / "fstab").write_text(
        "# written by installimage (simulated); partitions are not mounted\n"
        + "".join(f"# PART {p.mount} {p.fs} {p.size}\n" for p in cfg.parts)
    )
    os.chmod(hdd / "root", 0o700)
    if keep_hostkeys:
        for key in Path("/etc/ssh").glob("ssh_host_*"):
            shutil.copy2(key, hdd / "etc" / "ssh" / key.name)
    else:
        subprocess.run(["chroot", str(hdd), "ssh-keygen", "-A"], check=True, timeout=60, capture_output=True)
    keys = Path(cfg.sshkeys_url) if cfg.sshkeys_url.startswith("/") else Path("/root/.ssh/authorized_keys")
    if keys.is_file():
        dot_ssh = hdd / "root" / ".ssh"
        dot_ssh.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(keys, dot_ssh / "authorized_keys")
        os.chmod(dot_ssh / "authorized_keys", 0o600)


def _post_install(script: Path, hdd: Path) -> None:
    target = hdd / "post-install"
    shutil.copyfile(script, target)
    os.chmod(target, 0o755)
    proc = subprocess.run(
        ["chroot", str(hdd), "/post-install"], capture_output=True, text=True, timeout=600, check=False
    )
    debug("post-install output:\n" + proc.stdout + proc.stderr)
    sys.stdout.write(proc.stdout)
    target.unlink()
    if proc.returncode != 0:
        raise ConfigError(f"ERROR: post-install script failed (exit {proc.returncode})")


def _replace_hostkey(hdd: Path) -> None:
    key = hdd / "etc" / "ssh" / "ssh_host_ed25519_key"
    for path in (key, key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    cmd = ["chroot", str(hdd), "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", "/etc/ssh/ssh_host_ed25519_key"]
    subprocess.run(cmd, check=True, timeout=60, capture_output=True)


def _record_run(event: str, **fields: Any) -> None:
    with (DISK / "installimage-runs.jsonl").open("a") as fh:
        fh.write(json.dumps({"event": event, "at": time.time(), **fields}) + "\n")


def install(cfg: Config, disks: list[str], post: Path | None, keep_hostkeys: bool) -> None:
    delay = float(json.loads(HW_PATH.read_text()).get("installimage_seconds", 1.0))
    _step(1, "Deleting partitions")
    _record_partitions(cfg, disks)
    _step(2, "Creating partitions and /etc/fstab")
    _reset_upper()
    node_image = is_node_image(cfg.image)
    if node_image:
        _unpack_node_image(cfg.image)
    hdd = FOLD / "hdd"
    _mount_new_system(hdd)
    try:
        _step(3, "Formatting partitions")
        time.sleep(delay)
        _step(
            4,
            f"Extracting image ({'local' if cfg.image.startswith('/') else 'http'})",
            "done" if not node_image else "done (capi-gpu node image)",
        )
        _configure(cfg, hdd, keep_hostkeys)
        _step(5, "Setting up network config")
        _step(6, "Generating new SSH keys" if not keep_hostkeys else "Copying SSH keys")
        _step(7, "Installing bootloader grub")
        if post is not None:
            _post_install(post, hdd)
            _step(8, "Executing post-install script")
        if json.loads(HW_PATH.read_text()).get("installimage_replaces_hostkey"):
            _replace_hostkey(hdd)
        if Path("/autosetup").exists():
            shutil.copyfile("/autosetup", hdd / "installimage.conf")
        shutil.copyfile(DEBUG, hdd / "installimage.debug")
    finally:
        _umount(hdd)
    record = {
        "hostname": cfg.hostname,
        "image": cfg.image,
        "node_image": node_image,
        "disks": disks,
        "at": time.time(),
    }
    (DISK / "installed.json").write_text(json.dumps(record))
    _step(9, "Installation complete")


def _args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    it = iter(argv)
    for arg in it:
        if arg in ("-a", "-h"):
            out[arg] = "1"
        elif arg in ("-c", "-x", "-n", "-r", "-l", "-i", "-p", "-d", "-K", "-t", "-G", "-v", "-g"):
            out[arg] = next(it, "")
        else:
            raise ConfigError(f"installimage: unknown option {arg}")
    return out


def main(argv: list[str]) -> int:
    _record_run("start", argv=argv)
    rc = _main(argv)
    _record_run("end", rc=rc)
    return rc


def _main(argv: list[str]) -> int:
    DEBUG.write_text("")
    try:
        opts = _args(argv)
        if "-c" in opts:
            src = Path(opts["-c"])
            if not src.is_file():
                raise ConfigError(f"ERROR: config file {src} not found")
            if src.resolve() != Path("/autosetup").resolve():
                shutil.copyfile(src, "/autosetup")
        if not Path("/autosetup").is_file():
            raise ConfigError("ERROR: interactive mode is not simulated: write /autosetup or pass -c")
        post = Path(opts["-x"]) if opts.get("-x") else None
        if post is not None and not post.is_file():
            raise ConfigError(f"ERROR: post-install script {post} not found")
        print("\n                Hetzner Online GmbH - installimage (simulated)\n", flush=True)
        cfg = parse(Path("/autosetup").read_text())
        cfg.hostname = opts.get("-n", cfg.hostname)
        disks = validate(cfg)
        _step(0, "Reading configuration")
        install(cfg, disks, post, keep_hostkeys=opts.get("-t") == "yes")
    except ConfigError as exc:
        debug(str(exc))
        print(str(exc), flush=True)
        print(
            "\n  An error occured while installing the new system!\n  See the debug file /root/debug.txt "
            "for details.\n",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except (OSError, subprocess.SubprocessError) as exc:
        debug(f"ERROR: {exc}")
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        "\n                  INSTALLATION COMPLETE\n   You can now reboot and log in to your new system "
        "with\n   the same credentials as you used to log into the rescue system.\n",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
