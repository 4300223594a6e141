"""Folding ansible-runner events: task phases, helper roles attributed to their caller, failure messages
(plain, loop items, unreachable, host-key mismatch), stats totals, the reboot-needed contract, runner
errors, and sanitizing (colour, key blocks, secrets, length)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capi_gpu.provisioning import ansible_events as ev

ART = Path("/tmp/artifacts")


def task_start(role: str, task: str) -> dict[str, Any]:
    return {"event": "playbook_on_task_start", "event_data": {"role": role, "task": task}}


def on(kind: str, role: str, task: str, **res: Any) -> dict[str, Any]:
    return {"event": kind, "event_data": {"role": role, "task": task, "host": "h1", "res": res}}


def stats(changed: int = 0, failures: int = 0, dark: int = 0, **artifact: Any) -> dict[str, Any]:
    return {
        "event": "playbook_on_stats",
        "event_data": {
            "ok": {"h1": 7},
            "changed": {"h1": changed} if changed else {},
            "failures": {"h1": failures} if failures else {},
            "dark": {"h1": dark} if dark else {},
            "skipped": {"h1": 2},
            "artifact_data": artifact,
        },
    }


def fold_all(events: list[dict[str, Any]], secrets: tuple[str, ...] = ()) -> tuple[ev.EventFolder, list[ev.TaskEvent]]:
    folder = ev.EventFolder(secrets=secrets)
    steps = [s for s in (folder.fold(e) for e in events) if s is not None]
    return folder, steps


def test_task_phases_follow_the_event_kinds() -> None:
    _, steps = fold_all(
        [
            task_start("kubelet", "Install"),
            on("runner_on_ok", "kubelet", "Install", changed=True),
            on("runner_on_ok", "kubelet", "Hold", changed=False),
            on("runner_on_skipped", "kubelet", "Swap"),
            {"event": "verbose", "event_data": {}},
        ]
    )
    assert [s.phase for s in steps] == [
        ev.TaskPhase.STARTED,
        ev.TaskPhase.CHANGED,
        ev.TaskPhase.OK,
        ev.TaskPhase.SKIPPED,
    ]
    assert steps[1].label == "kubelet: Install"


def test_a_helper_role_failure_is_reported_under_the_calling_role() -> None:
    folder, _ = fold_all(
        [
            task_start("nvidia_driver", "Add NVIDIA's driver repository"),
            task_start("apt_source", "Fetch the signing key"),
            on("runner_on_failed", "apt_source", "Fetch the signing key", msg="Request failed: 404"),
            stats(failures=1),
        ]
    )
    result = folder.result("failed", ART, 1.0)
    assert result.status is ev.RunStatus.FAILED
    assert result.failed == ev.FailedTask("nvidia_driver", "apt_source / Fetch the signing key", "Request failed: 404")


def test_the_first_unignored_failure_wins_and_ignored_ones_are_only_events() -> None:
    ignored = on("runner_on_failed", "mig_layout", "Probe", msg="meh")
    ignored["event_data"]["ignore_errors"] = True
    folder, steps = fold_all(
        [
            ignored,
            on(
                "runner_on_failed",
                "mig_layout",
                "Verify the MIG mode",
                msg="current=Disabled pending=Enabled",
            ),
            on("runner_on_failed", "mig_layout", "Later", msg="second"),
            stats(failures=2),
        ]
    )
    assert steps[0].ignored
    failed = folder.result("failed", ART, 1.0).failed
    assert failed is not None and failed.task == "Verify the MIG mode"


def test_a_command_failure_message_carries_stderr() -> None:
    res = {"msg": "non-zero return code", "rc": 3, "stderr": "nvidia-smi: GPU is lost\n", "stdout": ""}
    assert ev.failure_message(res) == "non-zero return code: nvidia-smi: GPU is lost"


def test_a_loop_failure_message_names_the_failed_items() -> None:
    res = {
        "msg": "One or more items failed",
        "results": [{"failed": False, "msg": "fine"}, {"failed": True, "msg": "bad item", "stderr": "oops"}],
    }
    assert ev.failure_message(res) == "bad item: oops"


def test_unreachable_and_host_key_mismatch_are_told_apart() -> None:
    folder, _ = fold_all([on("runner_on_unreachable", "", "Gathering Facts", msg="ssh: connect to host: No route")])
    assert folder.result("failed", ART, 1.0).status is ev.RunStatus.UNREACHABLE
    folder, _ = fold_all(
        [
            on(
                "runner_on_unreachable",
                "",
                "Gathering Facts",
                msg="Failed to connect: Host key verification failed.",
            )
        ]
    )
    result = folder.result("failed", ART, 1.0)
    assert result.status is ev.RunStatus.HOST_KEY_MISMATCH
    assert result.failed is not None and result.failed.unreachable


def test_stats_are_totalled_over_hosts() -> None:
    folder, _ = fold_all([stats(changed=3)])
    result = folder.result("successful", ART, 2.5)
    assert result.ok and result.changed == 3
    assert result.stats == ev.HostStats(ok=7, changed=3, skipped=2)
    assert result.duration_s == 2.5


def test_the_reboot_stats_key_means_reboot_needed_with_its_reason() -> None:
    folder, _ = fold_all([stats(**{ev.REBOOT_STATS_KEY: True, ev.REBOOT_REASON_KEY: "mig-mode-pending"})])
    result = folder.result("successful", ART, 1.0)
    assert result.status is ev.RunStatus.REBOOT_NEEDED
    assert result.reboot_needed and not result.ok
    assert result.reboot_reason == "mig-mode-pending"


def test_a_failure_outranks_a_reboot_request() -> None:
    folder, _ = fold_all(
        [
            on("runner_on_failed", "kubelet", "Install", msg="x"),
            stats(failures=1, **{ev.REBOOT_STATS_KEY: True}),
        ]
    )
    assert folder.result("failed", ART, 1.0).status is ev.RunStatus.FAILED


def test_a_run_without_stats_or_with_a_bad_status_is_an_error() -> None:
    folder, _ = fold_all([])
    result = folder.result("failed", ART, 0.1, tail="ERROR! the role 'nvidia_driver' was not found")
    assert result.status is ev.RunStatus.ERROR
    assert result.failed is not None and "was not found" in result.failed.message
    assert fold_all([])[0].result("successful", ART, 0.1).status is ev.RunStatus.ERROR


def test_timeout_and_cancel_come_from_the_runner_status() -> None:
    assert fold_all([])[0].result("timeout", ART, 9.0).status is ev.RunStatus.TIMED_OUT
    assert fold_all([])[0].result("canceled", ART, 9.0).status is ev.RunStatus.CANCELED


def test_failure_messages_are_sanitized_before_they_leave() -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
    msg = f"\x1b[31mfailed\x1b[0m with {key} and token s3cr3t-token " + "x" * 2000
    _, steps = fold_all([on("runner_on_failed", "kubelet", "T", msg=msg)], secrets=("s3cr3t-token",))
    text = steps[0].message
    assert "\x1b" not in text and "PRIVATE KEY" not in text and "b3BlbnNzaC1" not in text
    assert "s3cr3t-token" not in text and "[redacted]" in text
    assert len(text) <= ev.MESSAGE_LIMIT and "\n" not in text


def test_sanitize_removes_an_unterminated_key_block() -> None:
    assert "AAAA" not in ev.sanitize("key: -----BEGIN RSA PRIVATE KEY-----\nAAAA")
