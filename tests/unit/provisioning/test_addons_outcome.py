"""The add-ons run's outcome: failure classes from the failed task (chart unavailable, values refused, cluster
unreachable, other), the request's digest moving with the shipped files and the request, and the extra vars
the playbook reads (its variable names, checked against playbooks/addons.yml)."""

from __future__ import annotations

from pathlib import Path

import yaml

from capi_gpu.provisioning import addons, ansible_events
from capi_gpu.provisioning.ansible import default_playbook_dir

STATS = ansible_events.HostStats(ok=3, changed=1)


def failed(task: str, message: str) -> ansible_events.PlaybookResult:
    return ansible_events.PlaybookResult(
        ansible_events.RunStatus.FAILED,
        STATS,
        Path("/nowhere"),
        1.0,
        ansible_events.FailedTask("", task, message),
    )


def test_success_counts_the_changes() -> None:
    ok = ansible_events.PlaybookResult(ansible_events.RunStatus.SUCCEEDED, STATS, Path("/nowhere"), 2.0)
    assert addons.classify(ok) == addons.AddonsOutcome(True, 1, 2.0)


def test_a_chart_that_cannot_be_fetched() -> None:
    out = addons.classify(failed(addons.CHART_TASK, 'Error: path "/x/chart.tgz" not found'))
    assert out.failure is addons.Failure.CHART_UNAVAILABLE
    oci = addons.classify(failed(addons.CHART_TASK, "Error: failed to download oci://registry.k8s.io/x"))
    assert oci.failure is addons.Failure.CHART_UNAVAILABLE


def test_values_the_chart_refuses() -> None:
    msg = "Error: execution error at (dra-driver-nvidia-gpu/templates/validation.yaml:21:4): Value 'namespace' set"
    assert addons.classify(failed(addons.CHART_TASK, msg)).failure is addons.Failure.VALUES_INVALID


def test_an_api_that_does_not_answer() -> None:
    msg = "Failed to get client due to HTTPSConnectionPool(host='10.0.0.1'): Connection refused"
    out = addons.classify(failed("Apply the gate DeviceClass", msg))
    assert out.failure is addons.Failure.CLUSTER_UNREACHABLE
    assert out.message.startswith("Apply the gate DeviceClass: ")


def test_other_failures_keep_the_task_name() -> None:
    out = addons.classify(failed("Apply the shipped ResourceClaimTemplates", "admission webhook denied"))
    assert out.failure is addons.Failure.FAILED
    assert "ResourceClaimTemplates" in out.message


def test_the_digest_follows_the_request_and_the_shipped_files(tmp_path: Path) -> None:
    playbooks = tmp_path / "playbooks"
    config = tmp_path / "config"
    for rel in ("dra-driver/values.yaml", "dra/gate-deviceclass.yaml", "dra/gate-plugin-daemonset.yaml"):
        (config / rel).parent.mkdir(parents=True, exist_ok=True)
        (config / rel).write_text("a: 1\n")
    (config / "dra" / "claims").mkdir()
    (config / "dra" / "claims" / "x.yaml").write_text("b: 1\n")
    playbooks.mkdir()
    (playbooks / addons.PLAYBOOK).write_text("- hosts: localhost\n")
    req = addons.AddonsRequest()
    first = req.digest(playbooks)
    assert req.digest(playbooks) == first
    assert addons.AddonsRequest(chart_version="0.4.2").digest(playbooks) != first
    (config / "dra-driver" / "values.yaml").write_text("a: 2\n")
    assert req.digest(playbooks) != first


def test_the_extra_vars_are_variables_the_playbook_declares() -> None:
    play = yaml.safe_load((default_playbook_dir() / addons.PLAYBOOK).read_text())[0]
    declared = set(play["vars"])
    sent = set(addons.AddonsRequest(gate_plugin_image="img:1").extra_vars())
    assert sent <= declared, sent - declared
    assert play["vars"]["dra_driver_chart_version"] == addons.DEFAULT_CHART_VERSION
    assert play["vars"]["dra_driver_chart_ref"] == addons.DEFAULT_CHART_REF
