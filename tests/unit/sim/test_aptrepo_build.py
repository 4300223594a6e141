"""The stand-in apt repository: debs built with dpkg-deb, a Packages index equal to dpkg-scanpackages'
(fields and checksums), a Release apt accepts, apt resolving pinned versions and Provides from it (in a
sandboxed apt, never the test machine's), the content-hash cache, and the catalog carrying every
package name the roles install."""

from __future__ import annotations

import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from capi_gpu.provisioning import ansible, playbook_vars
from capi_gpu_sim import apt_standins, aptrepo, host_shims

ROLES = ansible.default_playbook_dir() / "roles"


def small() -> list[apt_standins.Package]:
    return [
        apt_standins.Package(
            "kubelet", "1.36.3-1.1", "kubernetes", "k", {"/usr/bin/kubelet": host_shims.GuestFile(b"#!/bin/sh\n")}
        ),
        apt_standins.Package("kubeadm", "1.36.3-1.1", "kubernetes", "a", depends=("kubelet",)),
        apt_standins.Package(
            "containerd.io",
            "2.1.5-1",
            "docker",
            "c",
            {"/etc/containerd/config.toml": host_shims.GuestFile(b'disabled_plugins = ["cri"]\n', 0o644)},
            provides=("containerd",),
        ),
    ]


def fake_gpu_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog without depending on which GPU shim modules exist yet."""
    real = apt_standins._read

    def read(pkg: str, module: str) -> bytes:
        if pkg == apt_standins.GPU_SHIM_PACKAGE:
            return b'DEFAULTS = {"driver_version": "1.0"}\n'
        return real(pkg, module)

    monkeypatch.setattr(apt_standins, "_read", read)


def test_the_packaged_nvidia_smi_reports_its_package_version(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu_shim(monkeypatch)
    # NVIDIA's build (the archive carries its own of the same name, ubuntu_nvidia.same_names).
    (smi,) = [p for p in apt_standins.nvidia_packages("580") if p.name == "nvidia-utils-580"]
    assert smi.version == "580.95.05-1"
    assert b'"driver_version": "580.95.05"' in smi.files["/usr/bin/nvidia-smi"].content


def stanzas(text: str) -> dict[str, dict[str, str]]:
    out = {}
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith(" "):
                fields[key] += "\n" + line
            else:
                key, _, value = line.partition(": ")
                fields[key] = value
        out[fields["Package"]] = fields
    return out


def sandbox_apt(tmp: Path, repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "etc/apt/apt.conf.d"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "status").touch()
    lines = "".join(f"deb [trusted=yes] file:{repo}/{c} ./\n" for c in ("kubernetes", "docker"))
    (tmp / "sources.list").write_text(lines)
    opts = [
        *("-o", f"Dir={tmp}", "-o", f"Dir::State::status={tmp}/status"),
        *("-o", f"Dir::Etc::sourcelist={tmp}/sources.list", "-o", f"Dir::Etc::sourceparts={tmp}/etc/apt"),
        *("-o", f"Dir::Etc::parts={tmp}/etc/apt/apt.conf.d", "-o", "Debug::NoLocking=1"),
    ]
    return subprocess.run(["apt-get", *opts, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_index_matches_dpkg_scanpackages(tmp_path: Path) -> None:
    aptrepo.build(tmp_path, small())
    channel = tmp_path / "kubernetes"
    ours = stanzas((channel / "Packages").read_text())
    theirs = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=channel, capture_output=True, text=True, check=True
    ).stdout
    assert ours == stanzas(theirs)
    assert ours["kubeadm"]["Depends"] == "kubelet"


def test_apt_resolves_pinned_versions_and_provides_from_the_repo(tmp_path: Path) -> None:
    aptrepo.build(tmp_path / "repo", small())
    update = sandbox_apt(tmp_path / "apt", tmp_path / "repo", "update")
    assert update.returncode == 0, update.stderr
    assert "Err:" not in update.stdout
    plan = sandbox_apt(tmp_path / "apt", tmp_path / "repo", "-s", "install", "kubeadm=1.36.3-*", "containerd")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Inst kubelet (1.36.3-1.1" in plan.stdout
    assert "Inst containerd.io (2.1.5-1" in plan.stdout
    missing = sandbox_apt(tmp_path / "apt", tmp_path / "repo", "-s", "install", "kubelet=1.35.0-*")
    assert missing.returncode != 0


def test_conffiles_and_modes_are_in_the_deb(tmp_path: Path) -> None:
    aptrepo.build(tmp_path, small())
    deb = tmp_path / "docker" / "containerd.io_2.1.5-1_all.deb"
    conffiles = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True, text=True, check=True
    )
    assert conffiles.stdout.strip() == "/etc/containerd/config.toml"
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(tmp_path / "kubernetes" / "kubelet_1.36.3-1.1_all.deb")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-rwxr-xr-x root/root" in listing and "./usr/bin/kubelet" in listing


def test_a_repo_is_built_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apt_standins, "packages", lambda *_a, **_k: small())
    first = aptrepo.ensure_repo("v1.36.3", root=tmp_path)
    before = (first.channel_dir("docker") / "Packages").stat().st_mtime_ns
    again = aptrepo.ensure_repo("v1.36.3", root=tmp_path)
    assert again.repo_dir == first.repo_dir
    assert (again.channel_dir("docker") / "Packages").stat().st_mtime_ns == before
    assert not list(tmp_path.glob("*.tmp-*"))


def test_the_playbook_points_at_the_guest_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu_shim(monkeypatch)
    repo = aptrepo.AptRepo(tmp_path, tuple(apt_standins.packages("v1.36.3")))
    kwargs = aptrepo.playbook_repositories(repo)
    assert kwargs["kubernetes_repo"] == playbook_vars.AptRepository(
        uri="file:/srv/capi-gpu-apt/kubernetes", suite="./", trusted=True
    )
    # The default route: the shipped binary is copied; the GPU shim's mig-parted applies (no NVML here).
    assert "mig_manager_deb" not in kwargs
    assert kwargs["mig_parted_exec"] == apt_standins.SIM_MIG_PARTED
    utils = {p.name: p for p in repo.packages}["nvidia-utils-580"]
    assert apt_standins.SIM_MIG_PARTED in utils.files


def test_the_catalog_has_every_package_the_roles_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins carry the real names: the ubuntu2404 CUDA repository's branch-suffixed ones up to 580 and
    its nvidia-driver-pinning-580, the archive's headers for the running kernel."""
    fake_gpu_shim(monkeypatch)
    names = {p.name for p in apt_standins.packages("v1.36.3", "580", kernel_release="6.8.0-90-generic")}
    defaults = {}
    for role in ("nvidia_driver", "container_toolkit", "kubelet"):
        defaults |= yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    facts = {"nvidia_driver_branch": "580", "ansible_facts": {"kernel": "6.8.0-90-generic", "distribution": "Ubuntu"}}
    driver = yaml.safe_load(env.from_string(defaults["nvidia_driver_packages_by_route"]["nvidia-dkms"]).render(facts))
    headers = [env.from_string(h).render(facts) for h in defaults["nvidia_driver_headers_packages"]]
    assert driver == ["nvidia-driver-580-open"]
    pinning = env.from_string(defaults["nvidia_driver_pinning_package"]).render(facts).strip()
    assert pinning == "nvidia-driver-pinning-580"
    wanted = {
        *driver,
        *headers,
        *defaults["container_toolkit_packages"],
        defaults["container_toolkit_containerd_package"],
        *defaults["kubelet_packages"],
        "nvidia-mig-manager",
        pinning,
    }
    assert wanted <= names
    assert "nvidia-open" not in names  # 590 and later: not simulated


def test_the_driver_depends_on_the_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh image cannot install the driver (dkms, X libraries) or kubelet (conntrack) from the vendor
    repositories alone: their dependencies live only in the archive channel."""
    fake_gpu_shim(monkeypatch)
    pkgs = {p.name: p for p in apt_standins.packages("v1.36.3", "580", kernel_release="6.8.0-90-generic")}
    assert pkgs["nvidia-dkms-580-open"].depends == ("dkms",)
    for name in ("dkms", "libx11-6", "conntrack", "linux-headers-6.8.0-90-generic"):
        assert pkgs[name].channel == apt_standins.ARCHIVE
    assert "conntrack" in pkgs["kubelet"].depends
