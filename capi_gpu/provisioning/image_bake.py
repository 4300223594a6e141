"""``capi-gpu image bake``: capture a prepared standby host's installed root as a node image
(docs/node-images.md), with the manifest ``image_manifest`` checks and nothing that is one node's own.

Why from the running standby and not from rescue (the issue's first design): a standby is prepared up to,
not including, the join, so nothing writes to its root but its logs; capturing it in place costs no reboot
(a rescue capture costs two, about 5.5 min each on bare metal, hetzner.md section 4) and leaves the host
a standby, claimable as soon as the bake ends. The host is paused for the bake (the CLI sets CAPI's paused
annotation; ``host_pick`` skips paused hosts), so no claim joins it mid-capture. What a running system
holds that a copy could tear (the container runtime's database) is left out, not copied.

Pure parts here (eligibility, the fixed scripts, the probe's parsing, the manifest); the SSH calls are
``ParamikoShell.bake_*``; the Kubernetes side (pause, Secrets, pins) is ``cli/image``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHost, HostState
from capi_gpu.gpu import catalog, gpuplan
from capi_gpu.provisioning import image_manifest

BAKE_DIR = "/var/tmp/capi-gpu-bake"
ARCHIVE = f"{BAKE_DIR}/node-image.tar.gz"
MANIFEST_STAGED = f"{BAKE_DIR}/manifest.json"
# The extra members (the manifest, an empty machine-id) sit under this prefix in the work dir and are
# renamed by tar's --transform: exclusions match names on disk, so ./etc/machine-id of the root stays out
# while the empty one goes in.
EXTRA = "capi-gpu-image-extra"
CAPTURE_TIMEOUT = 3600.0

EXCLUDED: tuple[tuple[str, str], ...] = (
    ("./etc/machine-id", "one node's: the image carries it empty, so systemd makes a new one at first boot"),
    ("./var/lib/dbus/machine-id", "a copy of the machine-id"),
    ("./etc/ssh/ssh_host_*", "one node's host keys: the post-install writes the new node's pinned key"),
    ("./root/.ssh", "the operator's authorized key: the post-install writes it for the new node"),
    ("./var/lib/cloud", "cloud-init's per-instance state: the new node's NoCloud seed starts it again"),
    ("./etc/cloud/cloud-init.disabled", "set after the source's first boot; the new node must run cloud-init"),
    ("./etc/hostname", "installimage writes the new node's"),
    ("./etc/hosts", "installimage writes the new node's"),
    ("./etc/netplan/*", "the source's addresses and MAC (and private address); installimage and Configure write"),
    ("./var/lib/kubelet", "kubelet state, certificates and pods"),
    ("./etc/kubernetes", "kubeadm's configuration, certificates and any join token"),
    ("./var/lib/etcd", "a control plane's data, never a worker's"),
    ("./var/lib/containerd", "the runtime's database, torn if copied while containerd runs; pulled again"),
    ("./var/log/*", "the source's logs and journal"),
    ("./root/.ansible", "the source's Configure temp files"),
    ("./root/.bash_history", "the source's shell history"),
    ("./installimage.*", "installimage's records of the source's install"),
    ("./tmp/*", "temporary files"),
    ("./var/tmp/*", "temporary files, the bake's own work dir among them"),
    ("./swapfile", "swap is written by the new node's install"),
    (f"./{image_manifest.MANIFEST_PATH}", "a manifest the source got from its own image; the bake writes anew"),
)
"""What a node image never carries: (tar pattern, anchored at the root; why). The manifest lists them."""


class BakeRefused(ValueError):
    """The host can't be baked; the message says why and what to do. Nothing was changed."""


def refusals(host: HetznerGPUHost) -> list[str]:
    """Why ``host`` can't be baked (empty: it can): only a standby our flow prepared, with its OS host key
    pinned, unclaimed and not in maintenance, holds exactly our install and nothing of a node's life."""
    out: list[str] = []
    st, spec = host.status, host.spec
    if spec.standby is None or st.state is not HostState.STANDBY or st.prepared is None:
        out.append(
            f"it is {st.state.value}, not a prepared standby: bake a host the standby pool (or spec.standby) "
            "prepared, once its state is Standby"
        )
    if spec.consumer_ref is not None:
        out.append(f"it is claimed by {spec.consumer_ref.name}: bake an unclaimed standby")
    if spec.maintenance_mode:
        out.append("it is in maintenance mode")
    if host.metadata.get("deletionTimestamp"):
        out.append("it is being deleted")
    if not st.host_keys.os or not st.ipv4:
        out.append("its OS host key or address is not recorded yet, so it can't be reached pinned")
    return out


@dataclass(frozen=True)
class Facts:
    """What the probe read on the host."""

    kernel: str
    module_kernels: tuple[str, ...]
    driver_version: str
    gpu_device: str
    kubelet_version: str
    joined: bool


PROBE_SCRIPT = r"""set -u
printf 'kernel=%s\n' "$(uname -r)"
for m in $(find /lib/modules -name 'nvidia.ko*' 2>/dev/null); do
  k=${m#/lib/modules/}; printf 'module_kernel=%s\n' "${k%%/*}"
done
printf 'driver=%s\n' "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
printf 'gpu=%s\n' "$(nvidia-smi --query-gpu=pci.device_id --format=csv,noheader 2>/dev/null | head -n1)"
printf 'kubelet=%s\n' "$(dpkg-query -W -f='${Version}' kubelet 2>/dev/null)"
if [ -e /etc/kubernetes/kubelet.conf ]; then echo joined=yes; else echo joined=no; fi
"""
"""Fixed text: nothing of any object reaches it."""


def parse_probe(text: str) -> Facts:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key.strip(), []).append(value.strip())

    def one(key: str) -> str:
        return (values.get(key) or [""])[0]

    version = re.match(r"^(?:[0-9]+:)?([0-9]+\.[0-9]+\.[0-9]+)-", one("kubelet"))
    return Facts(
        kernel=one("kernel"),
        module_kernels=tuple(sorted(set(values.get("module_kernel", [])))),
        driver_version=one("driver"),
        gpu_device=one("gpu"),
        kubelet_version=f"v{version.group(1)}" if version else "",
        joined=one("joined") == "yes",
    )


def manifest(host: HetznerGPUHost, facts: Facts, cat: catalog.Catalog, now: datetime | None = None) -> str:
    """The manifest text for an image of ``host``; ``BakeRefused`` when the host is not what its spec says
    (another GPU, a driver outside the branch, no module for the running kernel) or not quiet (joined)."""
    assert host.spec.standby is not None
    sb = host.spec.standby
    model = sb.gpu.model or gpuplan.DEFAULT_MODEL  # as the install does; the probe checks the GPU is it
    problems: list[str] = []
    if facts.joined:
        problems.append("it has joined a cluster (/etc/kubernetes/kubelet.conf): bake a standby that never joined")
    if model not in cat:
        problems.append(f"GPU model {model!r} is not in the catalog")
    elif _model_of(cat, facts.gpu_device) != model:
        seen = _model_of(cat, facts.gpu_device) or facts.gpu_device or "no GPU"
        problems.append(f"nvidia-smi reports {seen}, not the {cat.model(model).product_name}")
    if not facts.driver_version.startswith(f"{sb.gpu.driver_branch}."):
        problems.append(f"driver {facts.driver_version or 'none'!r} is not of branch {sb.gpu.driver_branch}")
    if facts.kernel not in facts.module_kernels:
        problems.append(f"the running kernel {facts.kernel} has no NVIDIA module (reboot it into its kernel)")
    if facts.kubelet_version != sb.kubernetes_version:
        have = facts.kubelet_version or "missing"
        problems.append(f"kubelet is {have}, the standby spec wants {sb.kubernetes_version}")
    if problems:
        raise BakeRefused("; ".join(problems))
    try:
        doc = image_manifest.Manifest(
            format_version=1,
            gpu_model=model,
            driver_version=facts.driver_version,
            kernel_release=facts.kernel,
            driver_kernel=facts.kernel,
            kubernetes_version=facts.kubelet_version,
            source=image_manifest.SourceHost(server_number=host.spec.server_number, name=str(host.metadata["name"])),
            created_at=now or datetime.now(UTC),
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise BakeRefused(f"the host reports a {where} a manifest can't hold: {str(first['input'])[:80]!r}") from None
    return image_manifest.render(doc)


def _model_of(cat: catalog.Catalog, device_id: str) -> str | None:
    try:
        found = cat.for_device_id(device_id) if device_id else None
    except catalog.CatalogError:
        return None
    return found.key if found else None


DISK_FILESYSTEMS = ("ext2", "ext3", "ext4", "xfs", "btrfs", "vfat")


MOUNT_LOOP = (
    r"""skip=()
made=()
while read -r target fstype fsroot; do
  [ "$target" = / ] && continue
  case "$fstype" in """
    + "|".join(DISK_FILESYSTEMS)
    + r""") [ "$fsroot" = / ] && continue;; esac
  skip+=("--exclude=.$target")
  under=no
  for m in "${made[@]}"; do case "$target" in "$m"/*) under=yes;; esac; done
  [ $under = yes ] && continue
  made+=("$target")
  mkdir -p "$extra$target"
  chmod "$(stat -c %a "$target")" "$extra$target"
  members+=("./"""
    + EXTRA
    + r"""$target")
done < <(findmnt -rn -o TARGET,FSTYPE,FSROOT)
"""
)
"""Which mounts go in (bash; reads ``extra``, appends to ``members``, sets ``skip``): see ``capture_script``."""


def capture_script() -> str:
    """Fixed text: reads the manifest from ``MANIFEST_STAGED`` (written over SFTP), writes ``ARCHIVE`` with
    the manifest first, the empty machine-id, and the root less ``EXCLUDED``; prints its sha256 and size.

    Which mounts go in: every whole disk filesystem (``DISK_FILESYSTEMS`` mounted at its own root: /boot
    and /boot/efi are often partitions of their own, and the image needs the kernels); every other mount
    (proc, sysfs, tmpfs, devpts, cgroup, bind mounts of directories) is left out and its mount point goes in
    as an empty directory with the mode it shows, as an installable image has /proc, /sys, /dev, /run."""
    excludes = " ".join(f"--exclude='{pattern}'" for pattern, _ in EXCLUDED)
    extra = f"{BAKE_DIR}/{EXTRA}"
    return f"""set -eu
set -o pipefail
umask 077
rm -rf '{extra}' '{ARCHIVE}'
mkdir -p '{extra}/etc/capi-gpu'
cp '{MANIFEST_STAGED}' '{extra}/{image_manifest.MANIFEST_PATH}'
: > '{extra}/etc/machine-id'
chmod 0444 '{extra}/etc/machine-id'
chmod 0644 '{extra}/{image_manifest.MANIFEST_PATH}'
members=('./{EXTRA}/{image_manifest.MANIFEST_PATH}' './{EXTRA}/etc/machine-id')
extra='{extra}'
{MOUNT_LOOP}tar --create --numeric-owner --xattrs --acls --anchored --wildcards --no-recursion \
  --transform='s,^\\./{EXTRA}/,./,' --file=- -C '{BAKE_DIR}' "${{members[@]}}" \
  --recursion -C / {excludes} "${{skip[@]}}" . | gzip -1 > '{ARCHIVE}.part' || {{
  echo "tar or gzip failed (status 1: a file changed while it was read; bake again once the host is quiet)" >&2
  rm -f '{ARCHIVE}.part'; exit 1; }}
mv '{ARCHIVE}.part' '{ARCHIVE}'
rm -rf '{extra}'
printf '%s %s\\n' "$(sha256sum '{ARCHIVE}' | cut -d' ' -f1)" "$(stat -c %s '{ARCHIVE}')"
"""


CLEANUP_SCRIPT = f"rm -rf '{BAKE_DIR}'"


def paused_patch(on: bool) -> dict[str, object]:
    """The merge patch that pauses (or unpauses) the host for the bake."""
    return {"metadata": {"annotations": {domain.PAUSED_ANNOTATION: "" if on else None}}}
