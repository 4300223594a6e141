"""Data is never code for Ansible: a Jinja payload in any extra var, through the real runners and the real
add-ons playbook, reaches the play as the literal string and runs nothing on the operator (no marker file);
the extra-vars file keeps every JSON type under its one ``!unsafe`` tag; and every module that runs
ansible-runner writes its extra vars through that one place."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capi_gpu.provisioning import addons, ansible, ansible_data

PROJECT = Path(__file__).parent / "ansible_project"
REBOOT_ROLE = ansible.default_playbook_dir() / "roles" / "reboot_request"
# A kubeconfig whose API refuses at once: the chart task's arguments are rendered before helm is called.
REFUSING_KUBECONFIG = yaml.safe_dump(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
)


def payloads(marker: Path) -> list[str]:
    """Each would create ``marker`` if Ansible rendered it as a template."""
    return [
        f"{{{{ lookup('pipe', 'touch {marker}') }}}}",
        f"{{% set _ = lookup('pipe', 'touch {marker}') %}}x",
        f"x{{{{ query('pipe', 'touch {marker}') }}}}",
    ]


def test_the_file_is_json_under_one_unsafe_tag() -> None:
    text = ansible_data.extravars_text({"b": "580", "t": "true", "n": 5, "x": None, "l": ["a\nb: c"]})
    assert text.startswith("!unsafe {")
    assert yaml.safe_load(text.removeprefix("!unsafe ")) == {
        "b": "580",
        "t": "true",
        "n": 5,
        "x": None,
        "l": ["a\nb: c"],
    }
    with pytest.raises(ValueError):
        ansible_data.extravars_text({"nan": float("nan")})


def test_the_chart_ref_runs_nothing_in_the_real_addons_playbook(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    installer = addons.AnsibleAddons(tmp_path / "runs", helm_binary=str(tmp_path / "no-helm"), timeout_s=120)
    for payload in payloads(marker):
        request = addons.AddonsRequest(chart_ref=payload, chart_version="0.4.1", claim_namespaces=("default",))
        result = installer.run_blocking("c1", REFUSING_KUBECONFIG, request)
        assert not marker.exists(), f"{payload!r} ran on the operator"
        assert not result.ok  # no helm and no API: the run fails at the chart task, after rendering its args


def test_a_payload_reaches_the_play_as_the_literal_string(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    shutil.copytree(REBOOT_ROLE, project / "roles" / "reboot_request")
    runner = ansible.AnsibleRunner(
        artifacts_root=tmp_path / "artifacts",
        playbook_dir=project,
        connection="local",
        python_interpreter=sys.executable,
        timeout_s=120,
    )
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    target = ansible.SSHTarget(name="gex131-a", address="127.0.0.1", host_key=public.decode(), private_key=private)
    (tmp_path / "work").mkdir()
    marker = tmp_path / "pwned"
    payload = "\n".join(payloads(marker))
    result = runner.run_blocking(target, {"demo_dir": str(tmp_path / "work"), "demo_content": payload})
    assert result.ok, result.failed
    assert not marker.exists()
    assert (tmp_path / "work" / "marker").read_text() == payload + "\n"


def test_every_playbook_run_writes_its_extra_vars_through_ansible_data() -> None:
    """The one place: a module that runs ansible-runner never passes ``extravars=`` (ansible-runner would write
    them as plain, trusted JSON) and writes its variables with ``ansible_data.write_extravars``."""
    product = Path(ansible.__file__).resolve().parents[1]
    runners = [p for p in product.rglob("*.py") if "ansible_runner" in p.read_text() and p.name != "ansible_data.py"]
    assert {p.name for p in runners} == {"ansible.py", "addons.py"}
    for path in runners:
        text = path.read_text()
        assert "extravars=" not in text, path
        assert "ansible_data.write_extravars(" in text, path
