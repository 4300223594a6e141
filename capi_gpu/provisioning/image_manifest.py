"""The manifest a baked node image carries (docs/node-images.md), and the pure check of it against the
machine spec that would be installed from it.

The manifest is a member of the archive (``MANIFEST_PATH``), not a file beside it: the spec's sha256 then
covers it too, so whoever can swap a file on the image server can't make a wrong image pass the check
while the archive's checksum still matches. It also stays on the installed node, as the image's provenance.

What a GPU node needs from its image is decided when the image is built: the driver is compiled for one
kernel, the kubelet is one version, the MIG unit knows one GPU model. So the manifest says all of it, and
``check`` says every way it does not fit the spec, each with the condition reason the machine gets and a
message naming the fix. Admission can't run this (it sees only the URL and sha256; the manifest is in the
archive), so it runs when the provisioning route reads the manifest; ``outcome`` then applies the spec's
``fallback``. Pure: no I/O, the caller passes the manifest text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from capi_gpu.api.conditions import Reason
from capi_gpu.api.machine import HetznerGPUMachineSpec
from capi_gpu.api.specs import ImageFallback
from capi_gpu.gpu import catalog, gpuplan

FORMAT_VERSION = 1
"""The manifest format this release reads; a bake writes it, a newer format is refused, never guessed at."""
MANIFEST_PATH = "etc/capi-gpu/image-manifest.json"
"""The manifest's member name in the archive (relative to its root, with or without a leading ``./``), and
so its path on the node installed from it."""


# A kernel release as uname -r prints it: Ubuntu's flavours have more than one part after the ABI number
# (6.8.0-1015-nvidia-64k), so only the shape is fixed: no spaces, quotes or shell text.
KERNEL_RELEASE = r"^[0-9]+\.[0-9]+(\.[0-9]+)?(-[A-Za-z0-9._+]{1,32}){0,4}$"


class _Strict(BaseModel):
    # A manifest is written by our bake only: an unknown key is another format, not something to ignore.
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class SourceHost(_Strict):
    """The host the image was captured from (a standby or a drained worker our flow provisioned)."""

    server_number: Annotated[int, Field(ge=1)]
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")]


class Manifest(_Strict):
    """What the image holds; every field is checked against the spec except the provenance."""

    format_version: Literal[1]
    gpu_model: Annotated[str | None, Field(pattern=r"^[a-z0-9-]{1,32}$")]
    """Catalog key of the GPU the image's stack and MIG unit were installed for; None: no GPU stack."""
    driver_version: Annotated[str | None, Field(pattern=r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")]
    """Full NVIDIA driver version, e.g. 580.95.05; None with no GPU stack."""
    kernel_release: Annotated[str, Field(pattern=KERNEL_RELEASE)]
    """uname -r of the image's kernel, e.g. 6.8.0-87-generic or 6.8.0-1015-nvidia-64k."""
    driver_kernel: Annotated[str | None, Field(pattern=KERNEL_RELEASE)]
    """The kernel the driver modules were built for; must be ``kernel_release`` (else the GPU is dark)."""
    kubernetes_version: Annotated[str, Field(pattern=r"^v1\.[0-9]+\.[0-9]+$")]
    """kubelet/kubeadm version installed."""
    source: SourceHost
    created_at: AwareDatetime

    @property
    def driver_branch(self) -> int | None:
        return int(self.driver_version.split(".", 1)[0]) if self.driver_version else None


class ManifestError(ValueError):
    """Not a manifest this release reads: the condition reason is ``IMAGE_MANIFEST_UNSUPPORTED``."""

    reason = Reason.IMAGE_MANIFEST_UNSUPPORTED


def parse(text: str) -> Manifest:
    """The manifest in ``text``; ``ManifestError`` (with a message, never the text) when it isn't one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"the image manifest is not JSON ({exc.msg}): bake the image again") from None
    version = doc.get("formatVersion") if isinstance(doc, dict) else None
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"image manifest format {version!r} is not {FORMAT_VERSION}, the one this release reads: bake the "
            "image with this release's capi-gpu image bake"
        )
    try:
        return Manifest.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise ManifestError(f"image manifest field {where}: {first['msg']}: bake the image again") from None


def render(manifest: Manifest) -> str:
    """The JSON a bake writes (camelCase keys, as our other documents), read back by ``parse``."""
    return json.dumps(manifest.model_dump(mode="json", by_alias=True), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Mismatch:
    """One way the image does not fit the spec: the spec field it contradicts, the reason, the fix."""

    field: str
    reason: Reason
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}: {self.message}"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check(
    manifest: Manifest,
    spec: HetznerGPUMachineSpec,
    cat: catalog.Catalog,
    machine_version: str,
    kernel: str | None = None,
) -> list[Mismatch]:
    """Every mismatch between ``manifest`` and ``spec`` (empty: the image fits). ``machine_version`` is the
    CAPI Machine's spec.version, used where ``spec.kubernetesVersion`` is unset (as the full install does);
    ``kernel``, when the route pins one (the operator's kernel), must be the image's."""
    out: list[Mismatch] = []
    image = "the image"
    if spec.gpu is None:
        if manifest.gpu_model is not None:
            out.append(
                Mismatch(
                    "spec.gpu",
                    Reason.IMAGE_GPU_MODEL_MISMATCH,
                    f"{image} carries the {manifest.gpu_model} GPU stack and this machine has no spec.gpu: "
                    "use an image baked from a host without a GPU stack, or set spec.gpu",
                )
            )
    else:
        out += _gpu(manifest, spec, cat)
    wanted = spec.kubernetes_version or machine_version
    if _minor(manifest.kubernetes_version) != _minor(wanted):
        out.append(
            Mismatch(
                "spec.kubernetesVersion",
                Reason.IMAGE_KUBERNETES_MISMATCH,
                f"{image} has kubelet {manifest.kubernetes_version}, the machine wants {wanted} (another minor): "
                f"bake an image from a {_minor(wanted)} node",
            )
        )
    if manifest.driver_kernel is not None and manifest.driver_kernel != manifest.kernel_release:
        out.append(
            Mismatch(
                "spec.image",
                Reason.IMAGE_KERNEL_MISMATCH,
                f"{image}'s driver was built for kernel {manifest.driver_kernel} but it boots "
                f"{manifest.kernel_release}: bake it again from a host rebooted into its current kernel",
            )
        )
    if kernel is not None and manifest.kernel_release != kernel:
        out.append(
            Mismatch(
                "spec.image",
                Reason.IMAGE_KERNEL_MISMATCH,
                f"{image} boots kernel {manifest.kernel_release}, this installation pins {kernel}: "
                "bake an image from a host on the pinned kernel",
            )
        )
    return out


def _gpu(manifest: Manifest, spec: HetznerGPUMachineSpec, cat: catalog.Catalog) -> list[Mismatch]:
    assert spec.gpu is not None
    out: list[Mismatch] = []
    model = spec.gpu.model or gpuplan.DEFAULT_MODEL
    if manifest.gpu_model != model:
        have = manifest.gpu_model or "no GPU stack"
        out.append(
            Mismatch(
                "spec.gpu.model",
                Reason.IMAGE_GPU_MODEL_MISMATCH,
                f"the image was baked for {have}, the machine wants {model}: bake an image from a {model} host",
            )
        )
    branch, wanted = manifest.driver_branch, int(spec.gpu.driver_branch)
    if branch is None:
        return out
    if branch != wanted:
        out.append(
            Mismatch(
                "spec.gpu.driverBranch",
                Reason.IMAGE_DRIVER_MISMATCH,
                f"the image has driver {manifest.driver_version} (branch {branch}), the machine wants branch "
                f"{wanted}: bake an image with driverBranch {wanted}, or set driverBranch {branch}",
            )
        )
    if model in cat and branch < cat.model(model).min_driver.floor:
        floor = cat.model(model).min_driver.floor
        out.append(
            Mismatch(
                "spec.gpu.driverBranch",
                Reason.IMAGE_DRIVER_MISMATCH,
                f"the image has driver {manifest.driver_version}, below {model}'s MIG floor {floor}: "
                f"bake an image with driverBranch {floor} or later",
            )
        )
    return out


class Outcome(StrEnum):
    INSTALL_IMAGE = "InstallImage"
    """The image fits: installimage writes it after the sha256 check in rescue."""
    FULL_INSTALL = "FullInstall"
    """A mismatch and fallback FullInstall: plain Ubuntu and the whole node install, as without an image."""
    FAIL = "Fail"
    """A mismatch and fallback Fail: the machine's condition names each mismatch; no disk is touched."""


def outcome(mismatches: list[Mismatch], fallback: ImageFallback) -> Outcome:
    if not mismatches:
        return Outcome.INSTALL_IMAGE
    return Outcome.FULL_INSTALL if fallback is ImageFallback.FULL_INSTALL else Outcome.FAIL
