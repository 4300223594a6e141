"""One driver source per route, decided by real apt (sandboxed, never the test machine's) over the stand-in
repository, where the distribution's archive carries the CUDA repository's driver names at a version that sorts
higher, and nvidia-driver-pinning-580 pins the branch by version whatever the origin: with the role's
preferences file the nvidia-dkms route installs every driver package from NVIDIA's repository, without it (or
with the pinning package alone) apt takes the archive's; the file sorts before the pinning package's, since
apt takes the first matching record; the ubuntu-precompiled route, which adds no NVIDIA source and no pin,
installs only from the archive."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from capi_gpu.provisioning import ansible
from capi_gpu_sim import apt_standins, aptrepo

ROLE = ansible.default_playbook_dir() / "roles" / "nvidia_driver"
KERNEL = "6.8.0-90-generic"
NVIDIA_ORIGIN, ARCHIVE_ORIGIN = "NVIDIA CUDA", "Debian"  # the Release labels apt prints in a simulated install


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    aptrepo.build(root, apt_standins.packages("v1.36.3", "580", kernel_release=KERNEL))
    return root


class Apt:
    """apt-get/apt-cache under a private Dir= with its own sources.list and preferences.d."""

    def __init__(self, tmp: Path, repo: Path, channels: tuple[str, ...]) -> None:
        self.tmp = tmp
        for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "etc/apt/apt.conf.d", "prefs"):
            (tmp / d).mkdir(parents=True, exist_ok=True)
        (tmp / "status").touch()
        (tmp / "sources.list").write_text("".join(f"deb [trusted=yes] file:{repo}/{c} ./\n" for c in channels))
        assert self.run("apt-get", "update").returncode == 0

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        t = self.tmp
        opts = [
            *("-o", f"Dir={t}", "-o", f"Dir::State::status={t}/status", "-o", "APT::Sandbox::User=root"),
            *("-o", f"Dir::Etc::sourcelist={t}/sources.list", "-o", f"Dir::Etc::sourceparts={t}/etc/apt"),
            *("-o", f"Dir::Etc::parts={t}/etc/apt/apt.conf.d", "-o", f"Dir::Etc::preferencesparts={t}/prefs"),
            *("-o", f"Dir::Etc::preferences={t}/none", "-o", "Debug::NoLocking=1"),
        ]
        return subprocess.run([tool, *opts, *args], capture_output=True, text=True, timeout=120, check=False)

    def pin(self, name: str, text: str) -> None:
        (self.tmp / "prefs" / name).write_text(text)

    def installs(self, *packages: str) -> dict[str, str]:
        """What `apt-get install` would install: package -> the Release label it comes from."""
        plan = self.run("apt-get", "-s", "install", *packages)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        return dict(re.findall(r"^Inst (\S+) \(\S+ ([^:]+):", plan.stdout, re.M))


def role_defaults() -> dict[str, object]:
    return dict(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))


def rendered_pin(distribution: str = ARCHIVE_ORIGIN) -> str:
    """The role's preferences file as the template renders it for a host of ``distribution``."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    defaults = role_defaults()
    facts: dict[str, object] = {"nvidia_driver_branch": "580", "ansible_facts": {"distribution": distribution}}
    values = {k: v for k, v in defaults.items() if k.startswith("nvidia_driver_repo_")}
    values["nvidia_driver_repo_only_packages"] = [
        env.from_string(g).render(facts)
        for g in defaults["nvidia_driver_repo_only_packages"]  # type: ignore[attr-defined]
    ]
    template = (ROLE / "templates" / "nvidia-cuda.pref.j2").read_text()
    return env.from_string(template).render(ansible_managed="test", **values, **facts)


def pinning_file() -> str:
    return apt_standins.PINNING_PREFERENCES.replace("@BRANCH@", "580")


def driver_packages(installed: dict[str, str]) -> dict[str, str]:
    return {name: origin for name, origin in installed.items() if "nvidia" in name}


def test_the_archive_build_sorts_higher_so_apt_alone_would_mix_sources(tmp_path: Path, repo: Path) -> None:
    apt = Apt(tmp_path, repo, (apt_standins.NVIDIA, apt_standins.ARCHIVE))
    policy = apt.run("apt-cache", "policy", "nvidia-driver-580-open").stdout
    assert "Candidate: 580.95.05-1ubuntu0.24.04.1" in policy
    assert set(driver_packages(apt.installs("nvidia-driver-580-open")).values()) == {ARCHIVE_ORIGIN}
    # NVIDIA's branch pin lifts the branch's versions of both origins: the higher one still wins.
    apt.pin("nvidia-driver-pinning-580", pinning_file())
    assert set(driver_packages(apt.installs("nvidia-driver-580-open")).values()) == {ARCHIVE_ORIGIN}


def test_the_nvidia_route_installs_every_driver_package_from_nvidia(tmp_path: Path, repo: Path) -> None:
    apt = Apt(tmp_path, repo, (apt_standins.NVIDIA, apt_standins.ARCHIVE))
    name = Path(str(role_defaults()["nvidia_driver_repo_pin_file"])).name
    apt.pin(name, rendered_pin())
    apt.pin("nvidia-driver-pinning-580", pinning_file())
    installed = apt.installs("nvidia-driver-pinning-580", "nvidia-driver-580-open")
    drivers = driver_packages(installed)
    assert len(drivers) >= 6 and set(drivers.values()) == {NVIDIA_ORIGIN}, drivers
    assert installed["dkms"] == ARCHIVE_ORIGIN, "what NVIDIA's repository lacks still comes from the archive"
    assert name < "nvidia-driver-pinning-", "apt reads preferences.d in name order and the first match wins"


def test_the_pin_matches_the_distribution_it_renders_for() -> None:
    text = rendered_pin("Ubuntu")
    assert "Pin: release l=NVIDIA CUDA\nPin-Priority: 600" in text
    assert "Package: *nvidia*-580 *nvidia*-580-*\nPin: release o=Ubuntu\nPin-Priority: -1" in text


def test_the_ubuntu_route_installs_only_from_the_archive(tmp_path: Path, repo: Path) -> None:
    # The route adds no NVIDIA source and no pin: the archive is the only place its packages come from.
    apt = Apt(tmp_path, repo, (apt_standins.ARCHIVE,))
    installed = apt.installs(f"linux-modules-nvidia-580-server-open-{KERNEL}", "nvidia-driver-580-server-open")
    assert installed and set(installed.values()) == {ARCHIVE_ORIGIN}
    tasks = (ROLE / "tasks" / "main.yml").read_text()
    pin_task = next(
        t for t in yaml.safe_load(tasks) if t["name"] == "Pin nothing to NVIDIA's repository on Ubuntu's route"
    )
    assert pin_task["ansible.builtin.file"]["state"] == "absent"
