"""The netplan stand-in's ``generate [--root-dir DIR]`` (capi_gpu_sim.host_shims.netplan), which the
private_network role runs on a scratch root before it installs its file: it reads the configuration under DIR
only, accepts installimage's file with the role's VLAN on it, and refuses, as netplan's parser does, a vlan
whose link names no interface of the configuration (a NIC that only a ``match:`` finds), or without an id."""

from __future__ import annotations

from pathlib import Path

import pytest

from capi_gpu_sim.host_shims import NETCFG
from capi_gpu_sim.host_shims import netplan as shim

VLAN = """network:
  version: 2
  vlans:
    "eth0.4000": {id: 4000, link: "eth0", mtu: 1400, addresses: ["10.0.1.10/24"]}
"""


def root_with(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    etc = tmp_path / "etc" / "netplan"
    etc.mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return tmp_path


def test_the_role_file_beside_installimages_is_accepted_under_the_root_only(tmp_path: Path) -> None:
    root = root_with(tmp_path, {"01-netcfg.yaml": NETCFG, "60-capi-gpu-vswitch.yaml": VLAN})
    assert shim.main(["netplan", "generate", "--root-dir", str(root)]) == 0
    assert shim.main(["netplan", "generate", f"--root-dir={root}"]) == 0
    assert list(shim.wanted(root)) == ["eth0.4000"]
    assert shim.wanted(tmp_path / "empty") == {}  # nothing under another root: / was not read


@pytest.mark.parametrize(
    ("netcfg", "vlan", "refusal"),
    [
        # installimage keyed by an id that matches the NIC: the link must name the id, not the kernel name.
        (
            "network: {version: 2, ethernets: {mainnic: {match: {name: eth0}}}}\n",
            VLAN,
            "eth0.4000: interface 'eth0' is not defined",
        ),
        (NETCFG.decode(), VLAN.replace("id: 4000", 'id: "4000"'), "vlan eth0.4000 needs an integer id and a link"),
        (NETCFG.decode(), VLAN.replace('link: "eth0", ', ""), "vlan eth0.4000 needs an integer id and a link"),
    ],
)
def test_a_configuration_netplan_refuses_fails_generate(tmp_path: Path, netcfg: str, vlan: str, refusal: str) -> None:
    root = root_with(tmp_path, {"01-netcfg.yaml": netcfg, "60-capi-gpu-vswitch.yaml": vlan})
    with pytest.raises(SystemExit) as refused:
        shim.main(["netplan", "generate", "--root-dir", str(root)])
    assert refusal in str(refused.value.code)


@pytest.mark.parametrize("argv", [["generate", "--root-dir"], ["generate", "--root-dir", ""], ["generate", "-x"], []])
def test_other_arguments_are_refused(argv: list[str]) -> None:
    assert shim.main(["netplan", *argv]) == 2
