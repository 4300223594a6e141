"""roles/private_network against its contract: it reads exactly the keys of ``VLANInterface.playbook_vars()``,
the node IP travels through the kubelet role's kubelet_extra_args into /etc/default/kubelet, and the role
runs first in site.yml. Run for real (ansible_connection=local, nothing past the first task touches the
machine): absent or empty ``private_network`` runs nothing; a VLAN out of range, a string VLAN, an address
that is not an IPv4 interface (a template among them, which stays a string), a route that is not a network
or not inside RFC 1918 (a default route, a public network), or a value that is not a mapping stops the play
at the values check, before anything is read or written."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capi_gpu.provisioning import ansible, ansible_events, private_network

ROLES = ansible.default_playbook_dir() / "roles"
ROLE = ROLES / "private_network"
GOOD = private_network.VLANInterface(4000, 1400, "10.0.1.10/24", "10.0.1.1", ("10.0.0.0/16",)).playbook_vars()


def test_the_role_reads_the_keys_the_controller_sends() -> None:
    text = (
        "\n".join(p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
        + (ROLE / "templates" / "netplan.yaml.j2").read_text()
    )
    used = set(re.findall(r"private_network\['([a-z_]+)'\]", text))
    assert used == set(GOOD["private_network"])
    assert set(GOOD) == {"private_network", "kubelet_extra_args"}


def test_the_node_ip_lands_in_the_kubelet_defaults_file() -> None:
    template = (ROLES / "kubelet" / "templates" / "kubelet.default.j2").read_text()
    assert "+ kubelet_extra_args" in template and "KUBELET_EXTRA_ARGS=" in template
    tasks = yaml.safe_load((ROLES / "kubelet" / "tasks" / "main.yml").read_text())
    assert any(t.get("ansible.builtin.template", {}).get("dest") == "/etc/default/kubelet" for t in tasks)
    assert GOOD["kubelet_extra_args"] == ["--node-ip=10.0.1.10"]


@pytest.fixture
def runner(tmp_path: Path) -> ansible.AnsibleRunner:
    project = tmp_path / "project"
    (project / "roles").mkdir(parents=True)
    shutil.copytree(ROLE, project / "roles" / "private_network")
    play = [
        {"name": "Private network only", "hosts": "all", "gather_facts": False, "roles": [{"role": "private_network"}]}
    ]
    (project / "site.yml").write_text(yaml.safe_dump(play))
    return ansible.AnsibleRunner(
        artifacts_root=tmp_path / "artifacts",
        playbook_dir=project,
        connection="local",
        python_interpreter=sys.executable,
        timeout_s=120,
    )


@pytest.fixture
def target() -> ansible.SSHTarget:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return ansible.SSHTarget(name="gex131-a", address="127.0.0.1", host_key=public.decode(), private_key=private)


@pytest.mark.parametrize("extra", [{}, {"private_network": {}}])
async def test_without_a_private_network_nothing_runs(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, extra: dict[str, Any]
) -> None:
    events: list[ansible_events.TaskEvent] = []
    result = await runner.run_playbook(target, extra, events.append)
    assert result.status is ansible_events.RunStatus.SUCCEEDED, result.failed
    assert result.changed == 0
    ran = {e.task for e in events if e.phase is not ansible_events.TaskPhase.SKIPPED}
    assert not ran & {
        "Check the private network's values",
        "Find the NIC that carries the main IP (the default route's)",
    }


def bad(**change: Any) -> dict[str, Any]:
    return {"private_network": {**GOOD["private_network"], **change}}


@pytest.mark.parametrize(
    "extra",
    [
        bad(vlan=3999),
        bad(vlan="4000"),
        bad(address="{{ lookup('pipe', 'id') }}"),
        bad(address="10.0.1.10"),  # no prefix
        bad(gateway="10.0.1.1\nnetwork: {}"),
        bad(routes="10.0.0.0/16"),
        bad(routes=["10.0.0.0/16", "10.0.0.0/16 via 1.2.3.4"]),
        bad(mtu=1500),
        {"private_network": "vlan 4000"},
        bad(routes=["10.0.0.0/16", "0.0.0.0/0"]),
        bad(routes=["8.8.8.0/24"]),
        bad(routes=["10.0.0.0/7"]),
        bad(routes=["172.32.0.0/16"]),
    ],
    ids=[
        "vlan-range",
        "vlan-string",
        "template",
        "no-prefix",
        "gateway-newline",
        "routes-string",
        "route-junk",
        "mtu",
        "not-a-mapping",
        "default-route",
        "public-route",
        "wider-than-10/8",
        "outside-172.16/12",
    ],
)
async def test_bad_values_stop_the_play_before_anything_is_read_or_written(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, extra: dict[str, Any]
) -> None:
    result = await runner.run_playbook(target, extra)
    assert result.status is ansible_events.RunStatus.FAILED
    assert result.failed is not None
    assert (result.failed.role, result.failed.task) == ("private_network", "Check the private network's values")
    assert "private_network must be" in result.failed.message
