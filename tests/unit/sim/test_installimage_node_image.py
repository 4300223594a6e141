"""The simulated installimage tells a capi-gpu node image (an archive with the manifest member, with or
without ``./``) from a plain image, and unpacks a node image as the new upper layer, owners and modes as
archived; a plain or broken archive is not one."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from capi_gpu.provisioning import image_manifest
from capi_gpu_sim.host_shims import installimage as shim


def _archive(path: Path, members: dict[str, tuple[bytes, int, int]]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, (data, mode, uid) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, uid, uid
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_the_shim_knows_the_product_s_manifest_path() -> None:
    assert shim.NODE_IMAGE_MANIFEST == image_manifest.MANIFEST_PATH


@pytest.mark.parametrize("prefix", ["", "./"])
def test_a_node_image_becomes_the_upper_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    monkeypatch.setattr(shim, "DISK", tmp_path / "disk")
    (tmp_path / "disk" / "upper").mkdir(parents=True)
    image = _archive(
        tmp_path / "node-amd64-x.tar.gz",
        {
            f"{prefix}{image_manifest.MANIFEST_PATH}": (b"{}", 0o644, 0),
            f"{prefix}usr/bin/kubelet": (b"kubelet", 0o755, 0),
            f"{prefix}var/lib/thing": (b"owned", 0o640, 107),
        },
    )
    assert shim.is_node_image(image)
    shim._unpack_node_image(image)
    upper = tmp_path / "disk" / "upper"
    assert (upper / "usr" / "bin" / "kubelet").read_bytes() == b"kubelet"
    assert (upper / "usr" / "bin" / "kubelet").stat().st_mode & 0o777 == 0o755
    assert (upper / "var" / "lib" / "thing").stat().st_uid == 107  # the test machine runs these as root


def test_a_plain_or_broken_archive_is_not_a_node_image(tmp_path: Path) -> None:
    assert not shim.is_node_image(_archive(tmp_path / "plain-amd64-x.tar.gz", {"etc/hostname": (b"x", 0o644, 0)}))
    (tmp_path / "empty-amd64-x.tar.zst").write_bytes(b"")  # the rescue system's placeholder images
    assert not shim.is_node_image(str(tmp_path / "empty-amd64-x.tar.zst"))
    assert not shim.is_node_image("https://images.example.com/node-amd64-x.tar.gz")
