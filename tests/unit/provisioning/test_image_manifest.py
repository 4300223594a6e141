"""A baked image's manifest against the machine it would be installed on: every way it does not fit is one
mismatch with its own reason (GPU model, driver branch or the model's floor, a driver built for another
kernel, the operator's pinned kernel, another Kubernetes minor); the spec's fallback turns mismatches into
Fail or FullInstall; a manifest of another format version, with an unknown key or that is not JSON is
refused as unsupported, never guessed at."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capi_gpu.api.conditions import Reason
from capi_gpu.api.machine import HetznerGPUMachineSpec
from capi_gpu.api.specs import ImageFallback
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import image_manifest as im

CAT = catalog.builtin_catalog()
KERNEL = "6.8.0-87-generic"


def doc(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "formatVersion": 1,
        "gpuModel": "rtx-pro-6000",
        "driverVersion": "580.95.05",
        "kernelRelease": KERNEL,
        "driverKernel": KERNEL,
        "kubernetesVersion": "v1.36.3",
        "source": {"serverNumber": 2100001, "name": "gex131-1"},
        "createdAt": "2026-12-07T12:00:00Z",
    }
    return {k: v for k, v in (base | over).items() if v is not ...}


def manifest(**over: Any) -> im.Manifest:
    return im.parse(json.dumps(doc(**over)))


def spec(**over: Any) -> HetznerGPUMachineSpec:
    return HetznerGPUMachineSpec.model_validate({"gpu": {"model": "rtx-pro-6000"}} | over)


def test_a_bake_round_trips_and_a_fitting_image_has_no_mismatch() -> None:
    m = manifest()
    assert im.parse(im.render(m)) == m
    assert im.check(m, spec(), CAT, "v1.36.3", kernel=KERNEL) == []
    assert im.outcome([], ImageFallback.FAIL) is im.Outcome.INSTALL_IMAGE


@pytest.mark.parametrize(
    ("over", "machine", "version", "kernel", "expected"),
    [
        ({"gpuModel": "h100-80gb"}, {}, "v1.36.3", None, [("spec.gpu.model", Reason.IMAGE_GPU_MODEL_MISMATCH)]),
        (
            {"gpuModel": None, "driverVersion": None, "driverKernel": None},
            {},
            "v1.36.3",
            None,
            [("spec.gpu.model", Reason.IMAGE_GPU_MODEL_MISMATCH)],
        ),
        ({}, {"gpu": None}, "v1.36.3", None, [("spec.gpu", Reason.IMAGE_GPU_MODEL_MISMATCH)]),
        (
            {"driverVersion": "570.86.15"},
            {"gpu": {"model": "rtx-pro-6000", "driverBranch": "580"}},
            "v1.36.3",
            None,
            [
                ("spec.gpu.driverBranch", Reason.IMAGE_DRIVER_MISMATCH),  # another branch
                ("spec.gpu.driverBranch", Reason.IMAGE_DRIVER_MISMATCH),  # and below rtx-pro-6000's floor 575
            ],
        ),
        (
            {"driverVersion": "575.51.03"},
            {"gpu": {"model": "rtx-pro-6000", "driverBranch": "580"}},
            "v1.36.3",
            None,
            [("spec.gpu.driverBranch", Reason.IMAGE_DRIVER_MISMATCH)],
        ),
        ({"driverKernel": "6.8.0-86-generic"}, {}, "v1.36.3", None, [("spec.image", Reason.IMAGE_KERNEL_MISMATCH)]),
        ({}, {}, "v1.36.3", "6.8.0-90-generic", [("spec.image", Reason.IMAGE_KERNEL_MISMATCH)]),
        ({}, {}, "v1.35.2", None, [("spec.kubernetesVersion", Reason.IMAGE_KUBERNETES_MISMATCH)]),
        (
            {},
            {"kubernetesVersion": "v1.35.0"},
            "v1.36.3",  # the spec's version wins over the Machine's
            None,
            [("spec.kubernetesVersion", Reason.IMAGE_KUBERNETES_MISMATCH)],
        ),
        ({}, {}, "v1.36.9", None, []),  # another patch of the same minor fits
        (
            {"gpuModel": "h100-80gb", "kubernetesVersion": "v1.34.1", "driverKernel": "6.8.0-1-generic"},
            {},
            "v1.36.3",
            None,
            [
                ("spec.gpu.model", Reason.IMAGE_GPU_MODEL_MISMATCH),
                ("spec.kubernetesVersion", Reason.IMAGE_KUBERNETES_MISMATCH),
                ("spec.image", Reason.IMAGE_KERNEL_MISMATCH),
            ],
        ),
    ],
)
def test_each_way_an_image_does_not_fit_is_named(
    over: dict[str, Any],
    machine: dict[str, Any],
    version: str,
    kernel: str | None,
    expected: list[tuple[str, Reason]],
) -> None:
    found = im.check(manifest(**over), spec(**machine), CAT, version, kernel=kernel)
    assert [(m.field, m.reason) for m in found] == expected
    for m in found:
        assert "bake" in m.message or "set" in m.message, f"no fix named: {m}"
        assert str(m).startswith(f"{m.field}: {m.reason}: ")
    if expected:
        assert im.outcome(found, ImageFallback.FAIL) is im.Outcome.FAIL
        assert im.outcome(found, ImageFallback.FULL_INSTALL) is im.Outcome.FULL_INSTALL


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (json.dumps(doc(formatVersion=2)), "format 2"),
        (json.dumps(doc(formatVersion="1")), "format '1'"),
        (json.dumps(doc(formatVersion=...)), "format None"),
        (json.dumps(doc(layers=[])), "layers"),  # an unknown key is another format, not something to skip
        (json.dumps(doc(kernelRelease="6.8.0-87-generic; reboot")), "kernelRelease"),
        (json.dumps(doc(createdAt="2026-12-07T12:00:00")), "createdAt"),  # naive time
        (json.dumps(doc(source=...)), "source"),
        ("[1, 2]", "format None"),
        ("{not json", "not JSON"),
    ],
)
def test_a_manifest_this_release_does_not_read_is_refused(text: str, names: str) -> None:
    with pytest.raises(im.ManifestError) as err:
        im.parse(text)
    assert err.value.reason is Reason.IMAGE_MANIFEST_UNSUPPORTED
    assert names in str(err.value) and "bake" in str(err.value)
    assert "reboot" not in str(err.value), "the manifest's text is never echoed"
