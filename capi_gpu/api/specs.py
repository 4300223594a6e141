"""Spec blocks shared by machines, templates and standby hosts: the OS image and the GPU stack.

A standby host is prepared with exactly these blocks, and a claim compares them (``prepared_key``) to
decide whether the standby matches or must be re-prepared, so they live in one module.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from capi_gpu.api.base import KubeModel, cel, validations

DEFAULT_IMAGE = "/root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.zst"
IMAGE_SUFFIX_PATTERN = r"^\S+\.(tar|tar\.gz|tgz|tar\.bz|tar\.bz2|tbz|tar\.xz|txz|tar\.zst)$"


class FileSystem(StrEnum):
    EXT4 = "ext4"
    EXT3 = "ext3"
    XFS = "xfs"
    BTRFS = "btrfs"
    SWAP = "swap"


class Partition(KubeModel):
    """One installimage PART line."""

    mount: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^(/\S*|swap|lvm)$")]
    """Mount point (/, /boot, ...), swap, or lvm."""
    file_system: FileSystem
    """File system for the partition."""
    size: Annotated[str, Field(max_length=16, pattern=r"^(all|[1-9][0-9]*[MGT])$")]
    """Size like 1024M, 100G, or all (the last partition only)."""


class InstallImageSpec(KubeModel):
    """What installimage writes from the rescue system."""

    image_path: Annotated[
        str,
        Field(default="/root/.oldroot/nfs/images/Ubuntu-2404-noble-amd64-base.tar.zst", pattern=IMAGE_SUFFIX_PATTERN),
    ]
    """Image (IMAGE line): a path in the rescue system or an http(s) URL of a tar archive."""
    partitions: Annotated[
        list[Partition],
        Field(
            min_length=1,
            max_length=16,
            json_schema_extra=validations(
                cel(
                    "self.all(p, p.size != 'all') || self[size(self) - 1].size == 'all' "
                    "&& size(self.filter(p, p.size == 'all')) == 1",
                    "only the last partition may have size all: give the others a size like 100G",
                )
            ),
        ),
    ] = [
        Partition(mount="/boot", file_system=FileSystem.EXT4, size="1024M"),
        Partition(mount="/", file_system=FileSystem.EXT4, size="all"),
    ]
    """Partitions, in order."""
    swraid: Annotated[int, Field(ge=0, le=1)] = 1
    """1 builds a software RAID over the root devices."""
    swraid_level: Literal[0, 1, 5, 6, 10] = 1
    """RAID level: 0, 1, 5, 6 or 10."""
    post_install_script: Annotated[str | None, Field(max_length=65536)] = None
    """Extra shell run by installimage's -x step after ours (OS host key, NoCloud seed)."""


# A baked node image (docs/node-images.md): an https URL on a DNS name (no IP literal, so neither loopback
# nor the metadata address; no userinfo and no query, so no credential or signed token rides in the spec),
# or an absolute path in the rescue system (the simulator's images, Hetzner's /root/.oldroot/nfs share).
# A path segment is at most one dot and then a letter, digit, _ or -, so never ``.`` or ``..``; the name
# ends in an archive suffix installimage takes.
_SEGMENT = r"\.?[A-Za-z0-9_-][A-Za-z0-9._+-]{0,127}"
_ARCHIVE = r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz|tar\.zst)"
_DNS_NAME = r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
NODE_IMAGE_URL_PATTERN = rf"^(https://{_DNS_NAME}(:[0-9]{{1,5}})?|)(/{_SEGMENT})*/{_SEGMENT}{_ARCHIVE}$"


class ImageFallback(StrEnum):
    FAIL = "Fail"
    """A manifest that does not match the machine's GPU model, driver branch, kernel or Kubernetes minor
    fails closed: a condition names the mismatch, nothing is written to the disk."""
    FULL_INSTALL = "FullInstall"
    """On a mismatch, install plain Ubuntu and run the full node install, as without an image."""


class NodeImageSpec(KubeModel):
    """A baked node image (``capi-gpu image bake``): installimage writes it instead of plain Ubuntu, after
    checking its sha256 in rescue and its manifest against this spec (``provisioning.node_image``)."""

    url: Annotated[str, Field(min_length=1, max_length=1024, pattern=NODE_IMAGE_URL_PATTERN)]
    """https://<dns-name>/<path>.tar.zst (no credentials, no query) or an absolute path in the rescue system."""
    sha256: Annotated[str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
    """sha256 of the archive, lower-case hex; checked in rescue before anything is written."""
    fallback: ImageFallback = ImageFallback.FAIL
    """What a mismatch between the image's manifest and this spec does: Fail (default) or FullInstall."""


class MigMode(StrEnum):
    STATIC = "Static"
    """Layout pre-applied by mig-parted at boot; the NVIDIA DRA plugin announces what exists."""
    DYNAMIC = "Dynamic"
    """The NVIDIA DRA driver's DynamicMIG: it creates instances per claim; no layout is pre-applied."""


class MigLayout(KubeModel):
    """The MIG layout: a named preset or explicit profile counts (validated for placement by the controller)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!(has(self.preset) && has(self.profiles))",
                "preset and profiles are mutually exclusive: keep preset (e.g. all-1g.24gb) or profiles "
                "(e.g. {1g.24gb: 2, 2g.48gb: 1}), not both",
                reason="FieldValueForbidden",
            ),
        )
    )

    preset: Annotated[str | None, Field(pattern=r"^all-[a-z0-9.+-]+$", max_length=63)] = None
    """A mig-parted preset name such as all-1g.24gb or all-balanced."""
    profiles: Annotated[dict[str, Annotated[int, Field(ge=1, le=8)]] | None, Field(max_length=16)] = None
    """Profile -> instance count, e.g. {1g.24gb: 2, 2g.48gb: 1}."""


class GPUSpec(KubeModel):
    """The NVIDIA stack Ansible installs and the MIG layout it applies before the kubelet joins."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.migMode) || self.migMode != 'Dynamic' || !has(self.layout)",
                "migMode Dynamic lets the DRA driver create instances and destroys pre-made ones; "
                "remove layout or use migMode Static",
                field=".layout",
                reason="FieldValueForbidden",
            ),
        )
    )

    model: Annotated[str | None, Field(pattern=r"^[a-z0-9-]+$", max_length=32)] = None
    """GPU catalog name the host must carry (rtx-pro-6000, h100-80gb, h200-141gb); any MIG-capable GPU when unset."""
    driver_branch: Annotated[str, Field(pattern=r"^[0-9]{3}$")] = "580"
    """NVIDIA driver branch to pin (580 is a long-term branch); at least the GPU model's floor from the catalog
    (capi-gpu layouts show: rtx-pro-6000 575, h100-80gb 525, h200-141gb 550), else the spec is refused.
    Package repositories are operator settings (a mirror is infrastructure, not a per-machine choice)."""
    mig_mode: MigMode = MigMode.STATIC
    """Static pre-applies the layout; Dynamic leaves MIG to the DRA driver (no layout allowed)."""
    layout: MigLayout | None = None
    """MIG layout applied at every boot before kubelet and the DRA plugin; whole GPU when unset."""


class StandbySpec(KubeModel):
    """What a standby host is prepared with: up to, not including, the join."""

    install_image: InstallImageSpec = InstallImageSpec()
    """OS image settings."""
    gpu: GPUSpec = GPUSpec()
    """GPU stack and layout."""
    kubernetes_version: Annotated[str, Field(pattern=r"^v1\.[0-9]+\.[0-9]+$")] = "v1.36.3"
    """kubelet/kubeadm version to install."""


def _digest(doc: object) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def image_key(image: InstallImageSpec) -> str:
    return _digest(image.wire())


def prepared_key(image: InstallImageSpec, gpu: GPUSpec | None, kubernetes_version: str) -> str:
    """``<image>/<gpu+k8s>`` digests of what a prepared host carries: one string compare decides whether a
    standby matches a claim, and the image half alone whether only Ansible needs to run again."""
    return f"{image_key(image)}/{_digest({'gpu': gpu.wire() if gpu else None, 'k8s': kubernetes_version})}"
