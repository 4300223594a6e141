"""What action results do to host status: outcomes recorded on the operation, next steps, deferrals
that leave the operation 'not sent', failures typed and backed off."""

from __future__ import annotations

from datetime import timedelta

import pytest
from states_helpers import T0, context, decide, host, with_keys

from capi_gpu.api.host import ErrorType, HardwareDetails, HostState, Operation, RescueHostKey, Step
from capi_gpu.provisioning import outcomes
from capi_gpu.provisioning.model import Action, ActionKind, ActionResult, Observations, Timing

A = ActionKind
P, INS = HostState.PROVISIONING, HostState.INSPECTING


def act_then(h, result, obs=None, **ctx):  # type: ignore[no-untyped-def]
    d = decide(h, obs or Observations(claimed=True), **ctx)
    assert d.action is not None
    after = h.model_copy(update={"status": d.status})
    return d.action, outcomes.apply_result(
        context(after, obs or Observations(claimed=True), now=T0 + timedelta(seconds=3), **ctx), d.action, result
    )


def test_rescue_activation_records_keys_and_sent() -> None:
    key = RescueHostKey(type="ED25519", fingerprint="bb:" * 15 + "bb")
    action, d = act_then(host(INS, Step.RESCUE), ActionResult.ok(rescue_keys=(key,)), Observations())
    assert action.kind is A.ACTIVATE_RESCUE
    assert d.status.host_keys.rescue == [key]
    assert d.status.operations[-1].outcome == "Sent" and d.status.operations[-1].completed_at is not None


def test_deferred_marks_not_sent_and_the_next_decision_retries() -> None:
    h = host(INS, Step.RESCUE)
    _, d = act_then(h, ActionResult.deferred(42.0, "robot budget"), Observations())
    assert d.status.operations[-1].outcome == "Deferred" and d.requeue_after == 42.0
    again = decide(h.model_copy(update={"status": d.status}), Observations(), now=T0 + timedelta(seconds=60))
    assert again.action is not None and again.action.kind is A.ACTIVATE_RESCUE


def test_inspect_result_makes_the_host_available_with_hardware() -> None:
    hw = HardwareDetails(cpu_threads=48, memory_mib=262144)
    _, d = act_then(with_keys(host(INS, Step.INSPECT)), ActionResult.ok(hardware=hw), Observations())
    assert (d.status.state, d.status.step, d.status.hardware) == (HostState.AVAILABLE, None, hw)


@pytest.mark.parametrize(("wipe", "nxt"), [(False, Step.INSTALL), (True, Step.WIPE)])
def test_disk_check_ok_goes_to_wipe_only_when_asked(wipe: bool, nxt: Step) -> None:
    _, d = act_then(with_keys(host(P, Step.CHECK_DISKS)), ActionResult.ok(), wipe_requested=wipe)
    assert d.status.step is nxt


@pytest.mark.parametrize("error", [ErrorType.DISK_CHECK_FAILED, ErrorType.OTHER_LINUX_FOUND])
def test_disk_check_failures_are_permanent_and_nothing_is_wiped(error: ErrorType) -> None:
    _, d = act_then(
        with_keys(host(P, Step.CHECK_DISKS)), ActionResult.failed(error, "sda: SMART FAILED"), wipe_requested=True
    )
    assert d.status.state is HostState.ERROR and d.status.error_permanent and d.action is None


def test_configure_records_layout_and_goes_to_bootstrap() -> None:
    res = ActionResult.ok(
        mig_devices=("2g.48gb", "1g.24gb", "1g.24gb"), layout="1g.24gb-2.2g.48gb-1", prepared="img/gpu"
    )
    _, d = act_then(host(P, Step.CONFIGURE), res)
    assert d.status.step is Step.BOOTSTRAP and d.status.mig_devices == ["1g.24gb", "1g.24gb", "2g.48gb"]
    assert (d.status.layout, d.status.prepared) == ("1g.24gb-2.2g.48gb-1", "img/gpu")


def test_configure_reboot_needed_goes_to_mig_reboot_counted() -> None:
    _, d = act_then(host(P, Step.CONFIGURE), ActionResult.ok(reboot_needed=True))
    assert d.status.step is Step.MIG_REBOOT
    nxt = decide(
        host(P).model_copy(update={"status": d.status}), Observations(claimed=True), now=T0 + timedelta(seconds=5)
    )
    assert nxt.action is not None and nxt.action.kind is A.MIG_REBOOT and nxt.status.reboot_attempts == 1


def test_ansible_failure_is_retryable_and_names_the_task() -> None:
    msg = "mig_layout : Verify MIG instances match the layout: expected 1g.24gb x2"
    _, d = act_then(host(P, Step.CONFIGURE), ActionResult.failed(ErrorType.ANSIBLE_FAILED, msg))
    assert d.status.state is HostState.ERROR and not d.status.error_permanent
    assert d.status.resume_step is Step.CONFIGURE and "mig_layout" in (d.status.error_message or "")
    assert d.requeue_after == Timing().error_backoff_base


def test_kubeadm_reset_failure_is_best_effort() -> None:
    h = host(HostState.DEPROVISIONING, Step.DONE)
    _, d = act_then(h, ActionResult.failed(ErrorType.DEPROVISIONING, "unreachable"), Observations())
    assert d.status.state is HostState.DEPROVISIONING and d.status.operations[-1].outcome.startswith("Failed")
    nxt = decide(h.model_copy(update={"status": d.status}), Observations(), now=T0 + timedelta(seconds=5))
    assert nxt.status.state is HostState.AVAILABLE


def test_every_action_kind_has_an_outcome_path() -> None:
    for kind in ActionKind:
        h = with_keys(host(P, Step.CONFIGURE))
        d = outcomes.apply_result(context(h, Observations(claimed=True)), Action(kind), ActionResult.ok())
        assert d.status is not None


def test_scaled_timing_compresses_waits_not_the_hosts_work() -> None:
    base, fast = Timing(), Timing().scaled(60)
    assert (fast.ssh_reboot, fast.reset_hw, fast.poll, fast.error_backoff_base) == (8.0, 10.0, base.poll / 60, 1.0)
    # installimage and cloud-init run at this machine's speed in the simulator: a busy host is not a failed one.
    assert (fast.install, fast.bootstrap) == (base.install, base.bootstrap)
    assert (fast.max_retries, fast.max_mig_reboots) == (base.max_retries, base.max_mig_reboots)
    with pytest.raises(ValueError):
        base.scaled(0)


def test_a_host_waiting_out_a_moved_run_keeps_the_source_run_it_will_adopt() -> None:
    """On a move's target, Configure defers every minute while the source's run goes on (the server's marker);
    40 deferrals must not push the source's recorded run, which the target then adopts, out of the 32."""
    h = host(P, Step.CONFIGURE)
    source = Operation(name="configure", requested_at=T0 - timedelta(minutes=5))  # from the move's snapshot
    h.status.operations = [source]
    for i in range(40):
        now = T0 + timedelta(minutes=i)
        d = decide(h, Observations(claimed=True), now=now)
        assert d.action is not None and d.action.kind is A.CONFIGURE
        after = h.model_copy(update={"status": d.status})
        ctx = context(after, Observations(claimed=True), now=now + timedelta(seconds=1))
        d = outcomes.apply_result(ctx, d.action, ActionResult.deferred(60.0, "the source still runs it"))
        h = h.model_copy(update={"status": d.status})
    ops = h.status.operations
    assert len(ops) == 32 and ops[0].requested_at == source.requested_at and ops[0].outcome is None
    assert all(op.outcome == "Deferred" for op in ops[1:])
