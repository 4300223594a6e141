"""capi-gpu image bake's pure parts: which hosts can be baked, what the probe must show, the manifest it
writes (read back by the install route's own parser), and the CLI's refusals, which change nothing."""

from __future__ import annotations

import argparse
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.api.base import ObjectReference
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostSpec, HetznerGPUHostStatus, HostStandby, HostState
from capi_gpu.api.specs import GPUSpec
from capi_gpu.cli import EXIT_USAGE, image
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import image_bake, image_manifest

CAT = catalog.builtin_catalog()
OS_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMr6hGnAL4o1q0pJvYxXWAfCh4oEPGh5bL0uhEmNAJNt gex-1"


def standby(**over: Any) -> HetznerGPUHost:
    status = {"state": HostState.STANDBY, "prepared": "abc/def", "ipv4": "192.0.2.10"} | over.pop("status", {})
    host = HetznerGPUHost(
        metadata={"name": "gex-1", "resourceVersion": "7"},
        spec=HetznerGPUHostSpec(
            server_number=2100001, standby=HostStandby(gpu=GPUSpec(model="rtx-pro-6000"), template="gpu")
        ),
        status=HetznerGPUHostStatus(**status),
    )
    host.status.host_keys.os = OS_KEY
    for key, value in over.items():
        setattr(host.spec, key, value)
    return host


def test_a_prepared_unclaimed_standby_can_be_baked() -> None:
    assert image_bake.refusals(standby()) == []


@pytest.mark.parametrize(
    ("host", "says"),
    [
        (standby(status={"state": HostState.AVAILABLE, "prepared": None}), "not a prepared standby"),
        (standby(status={"state": HostState.STANDBY_PREPARING}), "not a prepared standby"),
        (standby(status={"prepared": None}), "not a prepared standby"),
        (
            standby(consumer_ref=ObjectReference(api_version=domain.API_VERSION, name="m-1", kind="HetznerGPUMachine")),
            "claimed by m-1",
        ),
        (standby(maintenance_mode=True), "maintenance"),
        (standby(status={"ipv4": None}), "OS host key or address"),
    ],
)
def test_anything_else_is_refused_with_the_reason(host: HetznerGPUHost, says: str) -> None:
    assert any(says in r for r in image_bake.refusals(host)), image_bake.refusals(host)


PROBE = """kernel=6.8.0-87-generic
module_kernel=6.8.0-87-generic
module_kernel=6.8.0-85-generic
driver=580.95.05
gpu=0x2BB510DE
kubelet=1.36.3-1.1
joined=no
"""


def test_the_probe_makes_a_manifest_the_install_route_reads_back() -> None:
    facts = image_bake.parse_probe(PROBE)
    assert facts.module_kernels == ("6.8.0-85-generic", "6.8.0-87-generic")
    text = image_bake.manifest(standby(), facts, CAT, datetime(2026, 12, 7, tzinfo=UTC))
    m = image_manifest.parse(text)
    assert (m.gpu_model, m.driver_version, m.kernel_release, m.driver_kernel, m.kubernetes_version) == (
        "rtx-pro-6000",
        "580.95.05",
        "6.8.0-87-generic",
        "6.8.0-87-generic",
        "v1.36.3",
    )
    assert (m.source.server_number, m.source.name) == (2100001, "gex-1")


@pytest.mark.parametrize(
    ("replace", "says"),
    [
        (("joined=no", "joined=yes"), "has joined a cluster"),
        (("gpu=0x2BB510DE", "gpu=0x233010DE"), "nvidia-smi reports h100-80gb"),
        (("gpu=0x2BB510DE", "gpu="), "nvidia-smi reports no GPU"),
        (("driver=580.95.05", "driver=575.64.03"), "not of branch 580"),
        (("module_kernel=6.8.0-87-generic\n", ""), "running kernel 6.8.0-87-generic has no NVIDIA module"),
        (("kubelet=1.36.3-1.1", "kubelet=1.35.2-1.1"), "kubelet is v1.35.2"),
        (("kubelet=1.36.3-1.1", "kubelet="), "kubelet is missing"),
        (("6.8.0-87-generic", "6.8.0-87-generic; reboot"), "kernel_release a manifest can't hold"),
    ],
)
def test_a_host_that_is_not_what_its_spec_says_is_refused(replace: tuple[str, str], says: str) -> None:
    facts = image_bake.parse_probe(PROBE.replace(*replace))
    with pytest.raises(image_bake.BakeRefused, match=says):
        image_bake.manifest(standby(), facts, CAT)


def test_an_unset_model_is_the_default_one_and_the_probe_must_find_it() -> None:
    host = standby(standby=HostStandby(gpu=GPUSpec(model=None)))
    assert image_bake.refusals(host) == []
    assert (
        image_manifest.parse(image_bake.manifest(host, image_bake.parse_probe(PROBE), CAT)).gpu_model == "rtx-pro-6000"
    )


def test_ubuntu_kernel_flavours_with_more_parts_make_a_manifest() -> None:
    probe = PROBE.replace("6.8.0-87-generic", "6.8.0-1015-nvidia-64k")
    m = image_manifest.parse(image_bake.manifest(standby(), image_bake.parse_probe(probe), CAT))
    assert m.kernel_release == "6.8.0-1015-nvidia-64k"


def test_identity_and_node_state_are_excluded_and_the_script_names_each_pattern() -> None:
    patterns = [p for p, _ in image_bake.EXCLUDED]
    for must in ("./etc/machine-id", "./etc/ssh/ssh_host_*", "./root/.ssh", "./var/lib/cloud", "./var/lib/kubelet",
                 "./etc/kubernetes", "./var/log/*", "./etc/netplan/*", "./installimage.*"):  # fmt: skip
        assert must in patterns
    script = image_bake.capture_script()
    assert all(f"--exclude='{p}'" in script for p in patterns)
    assert "findmnt" in script and "--anchored" in script and "pipefail" in script


class _Kube:
    def __init__(self, host: dict[str, Any]) -> None:
        self.host, self.patches = host, []  # type: ignore[var-annotated]

    def get(self, res: Any, name: str, ns: str | None = None) -> dict[str, Any]:
        return self.host

    def patch(self, res: Any, name: str, body: dict[str, Any], ns: str | None = None) -> dict[str, Any]:
        self.patches.append(body)
        return self.host

    def close(self) -> None:
        pass


def _args(to: Path) -> argparse.Namespace:
    return argparse.Namespace(to=str(to), host="gex-1", namespace="ns", kubeconfig=None, context=None, url=None)


def test_the_cli_refuses_a_host_that_is_not_a_standby_and_pauses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = standby(status={"state": HostState.PROVISIONED}).model_dump(by_alias=True, mode="json")
    fake = _Kube(obj)
    monkeypatch.setattr(image.kubeargs, "connect", lambda _: fake)
    rc = image.kubeargs.guarded(image.run_bake)(_args(tmp_path / "x.tar.gz"))
    assert rc == EXIT_USAGE and fake.patches == []
    assert "not a prepared standby" in capsys.readouterr().err
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.mark.parametrize("name", ["x.tar.zst", "x.img"])
def test_the_cli_refuses_another_suffix_or_an_existing_file(tmp_path: Path, name: str) -> None:
    with pytest.raises(image.CliFailure, match=r"must end in \.tar\.gz"):
        image._target(str(tmp_path / name))
    (tmp_path / "y.tar.gz").write_text("keep")
    with pytest.raises(image.CliFailure, match="never overwritten"):
        image._target(str(tmp_path / "y.tar.gz"))
    assert (tmp_path / "y.tar.gz").read_text() == "keep"


def test_pausing_and_unpausing_are_merge_patches_of_capis_annotation() -> None:
    assert image_bake.paused_patch(True) == {"metadata": {"annotations": {domain.PAUSED_ANNOTATION: ""}}}
    assert image_bake.paused_patch(False) == {"metadata": {"annotations": {domain.PAUSED_ANNOTATION: None}}}


FINDMNT = """/ overlay /
/proc proc /
/proc/sys proc /sys
/sys sysfs /
/sys/fs/cgroup cgroup2 /
/dev tmpfs /
/dev/pts devpts /
/run tmpfs /
/run/sim/hw ext4 /srv/sim/hw
/boot ext4 /
/boot/efi vfat /
/srv/apt xfs /home/ci/apt
/tmp tmpfs /
"""


def test_disk_filesystems_go_in_and_every_other_mount_is_an_empty_directory(tmp_path: Path) -> None:
    """/boot and /boot/efi (partitions of their own on many installs: the image needs the kernels) are
    captured; proc, sysfs, tmpfs, devpts, cgroup and bind mounts of directories are not, and their top
    mount points are recreated empty, with the mode each shows."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "findmnt").write_text(f"#!/bin/sh\ncat <<'X'\n{FINDMNT}X\n")
    (stub / "stat").write_text('#!/bin/sh\ncase "$3" in /tmp) echo 1777;; /proc|/sys) echo 555;; *) echo 755;; esac\n')
    for f in stub.iterdir():
        f.chmod(0o755)
    script = (
        f"extra='{tmp_path}/extra'\nmembers=()\n{image_bake.MOUNT_LOOP}"
        + 'printf "%s\\n" "${skip[@]}" --- "${members[@]}"\n'
    )
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={"PATH": f"{stub}:/usr/bin:/bin"}, check=True
    ).stdout.split("---\n")
    skipped = [line.removeprefix("--exclude=.") for line in out[0].split()]
    assert skipped == ["/proc", "/proc/sys", "/sys", "/sys/fs/cgroup", "/dev", "/dev/pts", "/run", "/run/sim/hw",
                       "/srv/apt", "/tmp"]  # fmt: skip
    assert out[1].split() == [f"./{image_bake.EXTRA}{d}" for d in ("/proc", "/sys", "/dev", "/run", "/srv/apt", "/tmp")]
    modes = {d: oct((tmp_path / "extra" / d).stat().st_mode & 0o7777) for d in ("proc", "tmp", "run")}
    assert modes == {"proc": "0o555", "tmp": "0o1777", "run": "0o755"}
