"""AnsibleRunner end to end on a trivial play (ansible_connection=local, files in a tmp dir only):
changed counts and idempotence, failed role + task + message, reboot-needed, event delivery on the loop,
pinned-host-key ssh options, artifacts without the private key or inherited secrets, run pruning."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capi_gpu.provisioning import ansible, ansible_events

PROJECT = Path(__file__).parent / "ansible_project"
REBOOT_ROLE = ansible.default_playbook_dir() / "roles" / "reboot_request"


def keypair() -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    dest = tmp_path / "project"
    shutil.copytree(PROJECT, dest)
    shutil.copytree(REBOOT_ROLE, dest / "roles" / "reboot_request")
    return dest


@pytest.fixture
def runner(tmp_path: Path, project: Path) -> ansible.AnsibleRunner:
    return ansible.AnsibleRunner(
        artifacts_root=tmp_path / "artifacts",
        playbook_dir=project,
        connection="local",
        python_interpreter=sys.executable,
        keep_runs=2,
        timeout_s=120,
    )


@pytest.fixture
def target() -> ansible.SSHTarget:
    private, public = keypair()
    return ansible.SSHTarget(name="gex131-a", address="127.0.0.1", host_key=public, private_key=private)


def demo_vars(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    (tmp_path / "work").mkdir(exist_ok=True)
    return {"demo_dir": str(tmp_path / "work"), "demo_content": "hello", **extra}


def all_artifact_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


async def test_a_first_run_changes_and_a_second_run_changes_nothing(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    first = await runner.run_playbook(target, demo_vars(tmp_path))
    second = await runner.run_playbook(target, demo_vars(tmp_path))
    assert first.status is ansible_events.RunStatus.SUCCEEDED, first.failed
    assert first.ok and first.changed == 2 and first.failed is None
    assert second.ok and second.changed == 0
    assert (tmp_path / "work" / "marker").read_text() == "hello\n"


async def test_a_failed_task_names_its_role_and_task_and_keeps_the_message(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    result = await runner.run_playbook(target, demo_vars(tmp_path, demo_fail=True))
    assert result.status is ansible_events.RunStatus.FAILED
    assert result.failed is not None
    assert (result.failed.role, result.failed.task) == ("demo", "Fail when asked")
    assert "boom on stderr" in result.failed.message
    assert result.failed.label == "demo: Fail when asked"
    assert not (tmp_path / "work" / "after").exists()


async def test_a_failed_loop_item_is_what_the_message_reports(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    result = await runner.run_playbook(target, demo_vars(tmp_path, demo_fail_loop=True))
    assert result.failed is not None
    assert result.failed.task == "Loop with one failing item when asked"
    assert "item bad broke" in result.failed.message


async def test_reboot_request_stops_the_play_cleanly_and_says_why(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    result = await runner.run_playbook(target, demo_vars(tmp_path, demo_reboot=True))
    assert result.status is ansible_events.RunStatus.REBOOT_NEEDED
    assert result.reboot_needed and not result.ok and result.failed is None
    assert result.reboot_reason == "mig-mode-pending"
    assert not (tmp_path / "work" / "after").exists(), "the play must end at the reboot request"


async def test_events_arrive_on_the_loop_in_order(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    loop = asyncio.get_running_loop()
    seen: list[tuple[ansible_events.TaskPhase, str]] = []

    def on_event(event: ansible_events.TaskEvent) -> None:
        assert asyncio.get_running_loop() is loop
        seen.append((event.phase, event.label))

    await runner.run_playbook(target, demo_vars(tmp_path), on_event)
    marker = "demo: Write the marker file"
    assert seen.index((ansible_events.TaskPhase.STARTED, marker)) < seen.index(
        (ansible_events.TaskPhase.CHANGED, marker)
    )
    assert (ansible_events.TaskPhase.SKIPPED, "demo: Fail when asked") in seen


async def test_ssh_is_pinned_to_the_host_key_in_a_private_known_hosts(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    result = await runner.run_playbook(target, demo_vars(tmp_path))
    inventory = json.loads((result.artifacts / "inventory" / "hosts.json").read_text())
    host = inventory["all"]["hosts"]["gex131-a"]
    known_hosts = result.artifacts / "known_hosts"
    assert "-o StrictHostKeyChecking=yes" in host["ansible_ssh_common_args"]
    assert f"-o UserKnownHostsFile={known_hosts}" in host["ansible_ssh_common_args"]
    assert "-o GlobalKnownHostsFile=/dev/null" in host["ansible_ssh_common_args"]
    assert known_hosts.read_text() == f"127.0.0.1 {target.host_key}\n"
    assert known_hosts.stat().st_mode & 0o077 == 0


async def test_artifacts_hold_neither_the_private_key_nor_inherited_secrets(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPI_GPU_ROBOT_PASSWORD", "hunter2-never-on-disk")
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    result = await runner.run_playbook(target, demo_vars(tmp_path, demo_fail=True))
    text = all_artifact_text(result.artifacts)
    key_body = target.private_key.strip().splitlines()[1]
    assert result.status is ansible_events.RunStatus.FAILED
    assert "PRIVATE KEY" not in text and key_body not in text
    assert "hunter2-never-on-disk" not in text
    assert not list(result.artifacts.rglob("ssh_key_data")), "the key fifo must be gone"
    command = json.loads((result.artifacts / "artifacts" / "run" / "command").read_text())
    assert command["command"][0] == "ssh-agent", "the key must go through ssh-agent"
    env = command["env"]
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "CAPI_GPU_ROBOT_PASSWORD" not in env


async def test_only_the_newest_runs_of_a_host_are_kept(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    results = [await runner.run_playbook(target, demo_vars(tmp_path)) for _ in range(3)]
    kept = sorted(p for p in (tmp_path / "artifacts" / "gex131-a").iterdir())
    assert kept == sorted(r.artifacts for r in results[1:])


async def test_a_missing_playbook_is_an_error_not_a_success(
    runner: ansible.AnsibleRunner, target: ansible.SSHTarget, tmp_path: Path
) -> None:
    (runner.playbook_dir / "site.yml").write_text("- name: broken\n  hosts: all\n  tasks: [{nope: {}}]\n")
    result = await runner.run_playbook(target, demo_vars(tmp_path))
    assert result.status is ansible_events.RunStatus.ERROR
    assert result.failed is not None and result.failed.task == "ansible-playbook"


def test_long_runs_do_not_take_the_threads_ssh_steps_need(
    tmp_path: Path, target: ansible.SSHTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Playbook runs hold a thread for minutes; with them in the loop's default executor, every other
    host's SSH step (asyncio.to_thread) waited behind them. They have their own pool."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocking(*_: Any) -> ansible_events.PlaybookResult:
        started.release()
        release.wait(10)
        raise RuntimeError("released")

    runner = ansible.AnsibleRunner(artifacts_root=tmp_path, parallel=3)
    monkeypatch.setattr(ansible.AnsibleRunner, "run_blocking", lambda self, *a: blocking(*a))

    async def scenario() -> str:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        runs = [asyncio.ensure_future(runner.run_playbook(target, {})) for _ in range(3)]
        for _ in range(3):  # each run holds a thread of the runner's pool
            assert await asyncio.to_thread(started.acquire, True, 5), "a run never started"
        ssh_step = await asyncio.wait_for(asyncio.to_thread(lambda: "ssh step done"), 2)
        release.set()
        await asyncio.gather(*runs, return_exceptions=True)
        return ssh_step

    assert asyncio.run(scenario()) == "ssh step done"
