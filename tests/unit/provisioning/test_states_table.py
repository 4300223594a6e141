"""Host state machine, as a table: every transition and failure edge, from (state, observations, now)
to (next state, step, action). Plus the restart property: re-deciding from a status that recorded a
destructive action never sends that action again."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from states_helpers import RESCUE_KEY, SERVER, T0, TIMING, decide, host, ssh, with_keys

from capi_gpu.api.host import ErrorType, HostState, Step
from capi_gpu.provisioning.model import (
    RECORDED,
    ActionKind,
    CloudInitState,
    InstallProgress,
    Observations,
    PresentedKey,
    SSHOutcome,
)

M = timedelta(minutes=1)
S = timedelta(seconds=1)
R, INS, P, SP = HostState.REGISTERING, HostState.INSPECTING, HostState.PROVISIONING, HostState.STANDBY_PREPARING
A = ActionKind


def in_rescue(h: Any) -> Any:
    return with_keys(h, rescue=True)


# (id, host, observations, extra ctx, expected state, expected step, expected action or None)
ROWS: list[tuple[str, Any, Observations, dict[str, Any], HostState, Step | None, ActionKind | None]] = [
    # Registering
    ("reg-missing-server", host(R), Observations(server_missing=True), {}, HostState.ERROR, None, None),
    ("reg-not-probed-yet", host(R), Observations(), {}, R, None, None),
    (
        "reg-in-process",
        host(R),
        Observations(server=SERVER.__class__(**{**SERVER.__dict__, "status": "in process"})),
        {},
        R,
        None,
        None,
    ),
    ("reg-ready-inspects", host(R), Observations(server=SERVER), {}, INS, Step.RESCUE, None),
    (
        "reg-maintenance",
        host(R, spec={"maintenance_mode": True}),
        Observations(server=SERVER),
        {},
        HostState.MAINTENANCE,
        None,
        None,
    ),
    ("reg-limit-delays", host(R), Observations(server=SERVER), {"slot_free": False}, R, None, None),
    (
        "reg-adopt-after-move",
        with_keys(host(R), rescue=False, os=True),
        Observations(server=SERVER, claimed=True, ssh=ssh(hostname="bm-gpu-0")),
        {},
        HostState.PROVISIONED,
        None,
        None,
    ),
    (  # status lost, OS silent: a claimed server is never inspected (rescue + reset would cut a live node)
        "reg-claimed-os-silent-waits",
        with_keys(host(R), rescue=False, os=True),
        Observations(server=SERVER, claimed=True, ssh=ssh(SSHOutcome.TIMEOUT)),
        {},
        R,
        None,
        None,
    ),
    (
        "reg-claimed-other-hostname-waits",
        with_keys(host(R), rescue=False, os=True),
        Observations(server=SERVER, claimed=True, ssh=ssh(hostname="someone-else")),
        {},
        R,
        None,
        None,
    ),
    # Inspecting / rescue
    ("rescue-activate-first", host(INS, Step.RESCUE), Observations(), {}, INS, Step.RESCUE, A.ACTIVATE_RESCUE),
    (
        "rescue-then-sw-reset",
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", S, "Sent")])),
        Observations(ssh=ssh(SSHOutcome.TIMEOUT)),
        {},
        INS,
        Step.RESCUE,
        A.RESET_SW,
    ),
    (
        "rescue-os-up-ssh-reboot",
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", S, "Sent")])),
        Observations(ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.OS)),
        {},
        INS,
        Step.RESCUE,
        A.SSH_REBOOT,
    ),
    (
        "rescue-waits-in-window",
        in_rescue(
            host(INS, Step.RESCUE, started=5 * M, ops=[("activate-rescue", 5 * M, "Sent"), ("reset-sw", 4 * M, "Sent")])
        ),
        Observations(ssh=ssh(SSHOutcome.TIMEOUT)),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-escalates-to-hw",
        in_rescue(
            host(
                INS,
                Step.RESCUE,
                started=12 * M,
                ops=[("activate-rescue", 12 * M, "Sent"), ("reset-sw", 11 * M, "Sent")],
            )
        ),
        Observations(ssh=ssh(SSHOutcome.TIMEOUT), rescue_active=True),
        {},
        INS,
        Step.RESCUE,
        A.RESET_HW,
    ),
    (
        "rescue-reactivates-before-hw",
        in_rescue(
            host(
                INS,
                Step.RESCUE,
                started=12 * M,
                ops=[("activate-rescue", 12 * M, "Sent"), ("reset-sw", 11 * M, "Sent")],
            )
        ),
        Observations(ssh=ssh(SSHOutcome.TIMEOUT), rescue_active=False),
        {},
        INS,
        Step.RESCUE,
        A.ACTIVATE_RESCUE,
    ),
    (
        "rescue-ladder-exhausted",
        in_rescue(
            host(
                INS,
                Step.RESCUE,
                started=30 * M,
                ops=[("activate-rescue", 30 * M, "Sent"), ("reset-sw", 25 * M, "Sent"), ("reset-hw", 11 * M, "Sent")],
            )
        ),
        Observations(ssh=ssh(SSHOutcome.TIMEOUT), rescue_active=True),
        {},
        HostState.ERROR,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-arrived-inspect",
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * M, "Sent"), ("reset-sw", M, "Sent")])),
        Observations(ssh=ssh()),
        {},
        INS,
        Step.INSPECT,
        None,
    ),
    (
        "rescue-key-swapped",
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * M, "Sent"), ("reset-sw", M, "Sent")])),
        Observations(ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN), rescue_active=False),
        {},
        HostState.ERROR,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-old-os-unknown-key-waits",
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * M, "Sent"), ("reset-sw", M, "Sent")])),
        Observations(ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN)),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-same-boot-waits",
        in_rescue(
            host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * M, "Sent"), ("reset-sw", M, "Sent")], boot_id="b1")
        ),
        Observations(ssh=ssh(boot_id="b1")),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-crash-before-keys",
        host(INS, Step.RESCUE, ops=[("activate-rescue", S, None)]),
        Observations(),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-crash-activation-never-left",
        host(INS, Step.RESCUE, ops=[("activate-rescue", S, None)]),
        Observations(rescue_active=False),
        {},
        INS,
        Step.RESCUE,
        A.ACTIVATE_RESCUE,
    ),
    (
        "rescue-crash-activation-never-left-old-keys",
        in_rescue(host(P, Step.RESCUE, ops=[("activate-rescue", S, None)])),
        Observations(
            claimed=True, rescue_active=False, ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN)
        ),
        {},
        P,
        Step.RESCUE,
        A.ACTIVATE_RESCUE,
    ),
    (
        "rescue-crash-activation-consumed-after-reset-waits",
        host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * S, None), ("reset-sw", S, None)]),
        Observations(rescue_active=False),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "rescue-crash-keys-read-back",
        host(INS, Step.RESCUE, ops=[("activate-rescue", S, None)]),
        Observations(rescue_active=True, rescue_keys=(RESCUE_KEY,)),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    ("inspect-acts", in_rescue(host(INS, Step.INSPECT)), Observations(), {}, INS, Step.INSPECT, A.INSPECT),
    # Available / standby
    ("avail-idle", host(HostState.AVAILABLE), Observations(), {}, HostState.AVAILABLE, None, None),
    ("avail-claimed", host(HostState.AVAILABLE), Observations(claimed=True), {}, P, Step.RESCUE, None),
    (
        "avail-claimed-limit",
        host(HostState.AVAILABLE),
        Observations(claimed=True),
        {"slot_free": False},
        HostState.AVAILABLE,
        None,
        None,
    ),
    ("avail-standby", host(HostState.AVAILABLE, spec={"standby": {}}), Observations(), {}, SP, Step.RESCUE, None),
    (
        "avail-maintenance",
        host(HostState.AVAILABLE, spec={"maintenance_mode": True}),
        Observations(),
        {},
        HostState.MAINTENANCE,
        None,
        None,
    ),
    (
        "standby-claim-match",
        host(HostState.STANDBY, spec={"standby": {}}, prepared="img/gpu"),
        Observations(claimed=True, consumer_prepared="img/gpu"),
        {},
        P,
        Step.BOOTSTRAP,
        None,
    ),
    (
        "standby-claim-gpu-differs",
        host(HostState.STANDBY, spec={"standby": {}}, prepared="img/gpu"),
        Observations(claimed=True, consumer_prepared="img/other", consumer_image_key="img"),
        {},
        P,
        Step.CONFIGURE,
        None,
    ),
    (
        "standby-claim-image-differs",
        host(HostState.STANDBY, spec={"standby": {}}, prepared="img/gpu"),
        Observations(claimed=True, consumer_prepared="x/y", consumer_image_key="x"),
        {},
        P,
        Step.RESCUE,
        None,
    ),
    (
        "standby-dropped",
        host(HostState.STANDBY, prepared="img/gpu"),
        Observations(),
        {},
        HostState.AVAILABLE,
        None,
        None,
    ),
    # Provisioning pipeline
    (
        "prov-in-rescue-skips-robot",
        in_rescue(host(P, Step.RESCUE)),
        Observations(claimed=True, ssh=ssh()),
        {},
        P,
        Step.CHECK_DISKS,
        None,
    ),
    (
        "prov-released",
        in_rescue(host(P, Step.INSTALL)),
        Observations(claimed=False),
        {},
        HostState.DEPROVISIONING,
        Step.DONE,
        None,
    ),
    (
        "check-disks",
        in_rescue(host(P, Step.CHECK_DISKS)),
        Observations(claimed=True),
        {},
        P,
        Step.CHECK_DISKS,
        A.CHECK_DISKS,
    ),
    ("wipe", in_rescue(host(P, Step.WIPE)), Observations(claimed=True), {}, P, Step.WIPE, A.WIPE),
    (
        "wipe-done-moves-on",
        in_rescue(host(P, Step.WIPE, ops=[("wipe", S, "Sent")])),
        Observations(claimed=True),
        {},
        P,
        Step.INSTALL,
        None,
    ),
    (
        # A crash between recording the wipe and its result: wipe again (idempotent), never skip to Install.
        "wipe-recorded-without-outcome-runs-again",
        in_rescue(host(P, Step.WIPE, ops=[("wipe", S, None)])),
        Observations(claimed=True),
        {},
        P,
        Step.WIPE,
        A.WIPE,
    ),
    (
        "install-start",
        in_rescue(host(P, Step.INSTALL)),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.NOT_STARTED),
        {},
        P,
        Step.INSTALL,
        A.START_INSTALL,
    ),
    (
        "install-running",
        in_rescue(host(P, Step.INSTALL)),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.RUNNING),
        {},
        P,
        Step.INSTALL,
        None,
    ),
    (
        "install-too-long",
        in_rescue(host(P, Step.INSTALL, started=41 * M)),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.RUNNING),
        {},
        HostState.ERROR,
        Step.INSTALL,
        None,
    ),
    (
        "install-done",
        in_rescue(host(P, Step.INSTALL, ops=[("installimage", S, "Sent")])),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.SUCCEEDED),
        {},
        P,
        Step.REBOOT_OS,
        None,
    ),
    (
        "install-failed",
        in_rescue(host(P, Step.INSTALL, ops=[("installimage", S, "Sent")])),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.FAILED, install_log="PART: bad"),
        {},
        HostState.ERROR,
        Step.INSTALL,
        None,
    ),
    (
        "install-ssh-dropped-waits",
        in_rescue(host(P, Step.INSTALL)),
        Observations(claimed=True, ssh=ssh(SSHOutcome.TIMEOUT)),
        {},
        P,
        Step.INSTALL,
        None,
    ),
    (
        "reboot-os-first-ssh",
        in_rescue(host(P, Step.REBOOT_OS)),
        Observations(claimed=True, ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.RESCUE)),
        {},
        P,
        Step.REBOOT_OS,
        A.SSH_REBOOT,
    ),
    (
        "reboot-os-still-rescue",
        in_rescue(host(P, Step.REBOOT_OS, ops=[("reset-ssh", M, "Sent")])),
        Observations(claimed=True, ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.RESCUE)),
        {},
        P,
        Step.REBOOT_OS,
        None,
    ),
    (
        "reboot-os-escalates-sw",
        in_rescue(host(P, Step.REBOOT_OS, started=9 * M, ops=[("reset-ssh", 9 * M, "Sent")])),
        Observations(claimed=True, ssh=ssh(SSHOutcome.TIMEOUT)),
        {},
        P,
        Step.REBOOT_OS,
        A.RESET_SW,
    ),
    (
        "reboot-os-arrived",
        in_rescue(host(P, Step.REBOOT_OS, ops=[("reset-ssh", M, "Sent")])),
        Observations(claimed=True, ssh=ssh(hostname="bm-gpu-0")),
        {},
        P,
        Step.CONFIGURE,
        None,
    ),
    (
        "reboot-os-wrong-key",
        in_rescue(host(P, Step.REBOOT_OS, ops=[("reset-ssh", M, "Sent")])),
        Observations(claimed=True, ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN)),
        {},
        HostState.ERROR,
        Step.REBOOT_OS,
        None,
    ),
    (
        "reboot-os-wrong-hostname",
        in_rescue(host(P, Step.REBOOT_OS, ops=[("reset-ssh", M, "Sent")])),
        Observations(claimed=True, ssh=ssh(hostname="someone-else")),
        {},
        HostState.ERROR,
        Step.REBOOT_OS,
        None,
    ),
    ("configure", host(P, Step.CONFIGURE), Observations(claimed=True), {}, P, Step.CONFIGURE, A.CONFIGURE),
    ("mig-reboot-first", host(P, Step.MIG_REBOOT), Observations(claimed=True), {}, P, Step.MIG_REBOOT, A.MIG_REBOOT),
    (
        "mig-reboot-limit",
        host(P, Step.MIG_REBOOT, reboot_attempts=1),
        Observations(claimed=True),
        {},
        HostState.ERROR,
        Step.MIG_REBOOT,
        None,
    ),
    (
        "mig-reboot-back",
        host(P, Step.MIG_REBOOT, ops=[("mig-reboot", M, "Sent")], reboot_attempts=1),
        Observations(claimed=True, ssh=ssh(hostname="bm-gpu-0")),
        {},
        P,
        Step.CONFIGURE,
        None,
    ),
    (
        "bootstrap-waits-data",
        host(P, Step.BOOTSTRAP),
        Observations(claimed=True, ssh=ssh(hostname="bm-gpu-0")),
        {},
        P,
        Step.BOOTSTRAP,
        None,
    ),
    (
        "bootstrap-runs",
        host(P, Step.BOOTSTRAP),
        Observations(claimed=True, bootstrap_ready=True),
        {},
        P,
        Step.BOOTSTRAP,
        A.BOOTSTRAP,
    ),
    (
        "bootstrap-crash-before-start-sends-it",
        host(P, Step.BOOTSTRAP, ops=[("bootstrap", S, None)]),
        Observations(claimed=True, bootstrap_ready=True, sentinel=False, cloud_init=CloudInitState.DISABLED),
        {},
        P,
        Step.BOOTSTRAP,
        A.BOOTSTRAP,
    ),
    (
        "bootstrap-crash-after-start-waits",
        host(P, Step.BOOTSTRAP, ops=[("bootstrap", S, None)]),
        Observations(claimed=True, bootstrap_ready=True, sentinel=False, cloud_init=CloudInitState.NOT_STARTED),
        {},
        P,
        Step.BOOTSTRAP,
        None,
    ),
    (
        "bootstrap-sentinel",
        host(P, Step.BOOTSTRAP, ops=[("bootstrap", M, "Sent")]),
        Observations(claimed=True, sentinel=True),
        {},
        HostState.PROVISIONED,
        None,
        None,
    ),
    (
        "bootstrap-cloud-init-error",
        host(P, Step.BOOTSTRAP, ops=[("bootstrap", M, "Sent")]),
        Observations(claimed=True, sentinel=False, cloud_init=CloudInitState.ERROR),
        {},
        HostState.ERROR,
        Step.BOOTSTRAP,
        None,
    ),
    (
        "bootstrap-timeout",
        host(P, Step.BOOTSTRAP, started=21 * M, ops=[("bootstrap", 21 * M, "Sent")]),
        Observations(claimed=True, sentinel=False, cloud_init=CloudInitState.RUNNING),
        {},
        HostState.ERROR,
        Step.BOOTSTRAP,
        None,
    ),
    (
        "standby-prep-ends-at-standby",
        host(SP, Step.BOOTSTRAP, spec={"standby": {}}),
        Observations(),
        {},
        HostState.STANDBY,
        None,
        None,
    ),
    (
        "standby-prep-configure",
        host(SP, Step.CONFIGURE, spec={"standby": {}}),
        Observations(),
        {},
        SP,
        Step.CONFIGURE,
        A.CONFIGURE,
    ),
    # Provisioned / deprovisioning
    (
        "provisioned-steady",
        host(HostState.PROVISIONED),
        Observations(claimed=True),
        {},
        HostState.PROVISIONED,
        None,
        None,
    ),
    (
        "provisioned-released",
        host(HostState.PROVISIONED),
        Observations(claimed=False),
        {},
        HostState.DEPROVISIONING,
        Step.DONE,
        None,
    ),
    (
        "deprov-reset",
        host(HostState.DEPROVISIONING, Step.DONE),
        Observations(),
        {},
        HostState.DEPROVISIONING,
        Step.DONE,
        A.KUBEADM_RESET,
    ),
    (
        "deprov-to-available",
        host(HostState.DEPROVISIONING, Step.DONE, ops=[("kubeadm-reset", S, "Sent")]),
        Observations(),
        {},
        HostState.AVAILABLE,
        None,
        None,
    ),
    (
        "deprov-to-standby",
        host(
            HostState.DEPROVISIONING,
            Step.DONE,
            ops=[("kubeadm-reset", S, "Sent")],
            spec={"standby": {}},
            prepared="img/gpu",
        ),
        Observations(),
        {},
        HostState.STANDBY,
        None,
        None,
    ),
    (
        "deprov-to-maintenance",
        host(
            HostState.DEPROVISIONING,
            Step.DONE,
            ops=[("kubeadm-reset", S, "Failed: x")],
            spec={"maintenance_mode": True},
        ),
        Observations(),
        {},
        HostState.MAINTENANCE,
        None,
        None,
    ),
    # Error / maintenance
    (
        "error-permanent-stays",
        host(
            HostState.ERROR,
            error_permanent=True,
            error_type=ErrorType.HOST_KEY_MISMATCH,
            error_count=1,
            last_error_at=T0 - 600 * M,
        ),
        Observations(),
        {},
        HostState.ERROR,
        None,
        None,
    ),
    (
        "error-permanent-cleared",
        host(HostState.ERROR, error_permanent=True, error_count=1),
        Observations(),
        {"permanent_cleared": True},
        R,
        None,
        None,
    ),
    (
        "error-backoff-waits",
        host(
            HostState.ERROR,
            Step.INSTALL,
            error_count=1,
            last_error_at=T0 - 30 * S,
            resume_state=P,
            resume_step=Step.RESCUE,
        ),
        Observations(claimed=True),
        {},
        HostState.ERROR,
        Step.INSTALL,
        None,
    ),
    (
        "error-resumes",
        host(
            HostState.ERROR,
            Step.INSTALL,
            error_count=1,
            last_error_at=T0 - 2 * M,
            resume_state=P,
            resume_step=Step.RESCUE,
        ),
        Observations(claimed=True),
        {},
        P,
        Step.RESCUE,
        None,
    ),
    (
        "error-resume-unclaimed",
        host(
            HostState.ERROR,
            Step.INSTALL,
            error_count=1,
            last_error_at=T0 - 2 * M,
            resume_state=P,
            resume_step=Step.RESCUE,
        ),
        Observations(),
        {},
        HostState.AVAILABLE,
        None,
        None,
    ),
    (
        "error-resume-inspect",
        host(
            HostState.ERROR,
            Step.INSPECT,
            error_count=1,
            last_error_at=T0 - 2 * M,
            resume_state=INS,
            resume_step=Step.RESCUE,
        ),
        Observations(),
        {},
        INS,
        Step.RESCUE,
        None,
    ),
    (
        "maintenance-stays",
        host(HostState.MAINTENANCE, spec={"maintenance_mode": True}),
        Observations(),
        {},
        HostState.MAINTENANCE,
        None,
        None,
    ),
    ("maintenance-ends", host(HostState.MAINTENANCE), Observations(), {}, R, None, None),
]


@pytest.mark.parametrize(
    ("h", "obs", "ctx", "state", "step", "action"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_transition(
    h: Any, obs: Observations, ctx: dict[str, Any], state: HostState, step: Step | None, action: ActionKind | None
) -> None:
    d = decide(h, obs, **ctx)
    assert (d.status.state, d.status.step, d.action.kind if d.action else None) == (state, step, action)
    assert d.requeue_after is None or d.requeue_after > 0
    if d.status.state is HostState.ERROR and h.status.state is not HostState.ERROR:
        assert d.status.error_type is not None and d.status.error_message
        assert d.notes and d.notes[0].warning, "an error is announced as a Warning Event"


def test_every_state_and_step_has_a_row() -> None:
    states_seen = {r[1].status.state for r in ROWS}
    assert states_seen >= set(HostState) - {HostState.DELETING}
    steps_seen = {r[1].status.step for r in ROWS} - {None}
    assert steps_seen == set(Step)


def test_permanent_errors_never_requeue_and_retryable_ones_back_off() -> None:
    perm = decide(
        in_rescue(host(INS, Step.RESCUE, ops=[("activate-rescue", 2 * M, "Sent"), ("reset-sw", M, "Sent")])),
        Observations(ssh=ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN), rescue_active=False),
    )
    assert perm.status.error_permanent and perm.requeue_after is None
    assert perm.status.error_type is ErrorType.HOST_KEY_MISMATCH
    retry = decide(
        in_rescue(host(P, Step.INSTALL, ops=[("installimage", S, "Sent")])),
        Observations(claimed=True, ssh=ssh(), install=InstallProgress.FAILED),
    )
    assert not retry.status.error_permanent
    assert retry.requeue_after == TIMING.error_backoff_base
    assert (retry.status.resume_state, retry.status.resume_step) == (P, Step.RESCUE)


def test_retryable_error_becomes_permanent_after_max_retries() -> None:
    h = in_rescue(host(P, Step.INSTALL, ops=[("installimage", S, "Sent")], error_count=TIMING.max_retries))
    d = decide(h, Observations(claimed=True, ssh=ssh(), install=InstallProgress.FAILED))
    assert d.status.error_permanent and "gave up" in (d.status.error_message or "")


# installimage is the one recorded action whose effect the server itself reports: see the test below. The rows
# whose observations prove a recorded operation never left (Robot has no activation pending, cloud-init still
# disabled) re-send by design; their own tests check it happens once.
PROVEN_NOT_SENT = {
    "rescue-crash-activation-never-left",
    "rescue-crash-activation-never-left-old-keys",
    "bootstrap-crash-before-start-sends-it",
}
# A wipe is repeated by design after a crash that left it without an outcome (wipefs is idempotent; skipping it
# would install beside the OS it was asked to clear): test_interrupted_wipe_runs_again checks it.
# Configure too: recorded only to name its Ansible run in the server's marker (provisioning.handover); after a
# crash the run died with the controller, and the playbook is idempotent. test_handover covers a move mid-run.
REPEATABLE = {A.WIPE, A.CONFIGURE}
RESTART_ROWS = [
    r
    for r in ROWS
    if r[6] in RECORDED and r[6] is not A.START_INSTALL and r[6] not in REPEATABLE and r[0] not in PROVEN_NOT_SENT
]


@pytest.mark.parametrize(("h", "obs", "ctx"), [r[1:4] for r in RESTART_ROWS], ids=[r[0] for r in RESTART_ROWS])
def test_restart_never_resends_a_recorded_action(h: Any, obs: Observations, ctx: dict[str, Any]) -> None:
    """Crash after the status write, before the outcome: the next decision must not send it again."""
    first = decide(h, obs, **ctx)
    assert first.action is not None and first.status.operations[-1].name == first.action.kind.value
    assert first.status.operations[-1].outcome is None
    again = decide(h.model_copy(update={"status": first.status}), obs, now=T0 + timedelta(seconds=1), **ctx)
    assert again.action is None or again.action.kind is not first.action.kind


def test_interrupted_wipe_runs_again_and_then_moves_on() -> None:
    """Crash after recording the wipe, before its outcome: the next pass wipes again (the open record marked
    Interrupted, a new attempt recorded), and once that attempt has its outcome the host goes on to Install."""
    first = decide(in_rescue(host(P, Step.WIPE)), Observations(claimed=True))
    assert first.action is not None and first.action.kind is A.WIPE
    crashed = in_rescue(host(P, Step.WIPE)).model_copy(update={"status": first.status})
    again = decide(crashed, Observations(claimed=True), now=T0 + timedelta(seconds=1))
    assert again.action is not None and again.action.kind is A.WIPE
    wipes = [(op.attempt, op.outcome) for op in again.status.operations if op.name == "wipe"]
    assert wipes == [(1, "Interrupted"), (2, None)]
    assert any(n.reason == "WipeRepeated" for n in again.notes)


@pytest.mark.parametrize("stale", [InstallProgress.FAILED, InstallProgress.SUCCEEDED])
def test_a_retry_does_not_reread_an_earlier_installimage_exit_record(stale: InstallProgress) -> None:
    """After a failed installimage the retry resumes in the same rescue session, where the old exit record
    still lies: with no start recorded in this Install step, it is not ours, so installimage runs afresh
    (the start clears the record) instead of failing again with the old error until the retries run out."""
    h = in_rescue(host(P, Step.INSTALL, error_count=1))
    d = decide(h, Observations(claimed=True, ssh=ssh(), install=stale, install_log="ERROR: old failure"))
    assert d.action is not None and d.action.kind is A.START_INSTALL
    assert d.status.state is P and d.status.error_count == 1
    assert any(n.reason == "InstallRestarted" for n in d.notes)


def test_recorded_installimage_is_restarted_only_when_the_server_proves_it_never_ran() -> None:
    """The start writes its pid file in the same SSH exec that launches it, so NOT_STARTED on the server
    means the recorded attempt never reached it; RUNNING/SUCCEEDED/FAILED mean it did."""
    first = decide(
        in_rescue(host(P, Step.INSTALL)), Observations(claimed=True, ssh=ssh(), install=InstallProgress.NOT_STARTED)
    )
    assert first.action is not None and first.action.kind is A.START_INSTALL
    recorded = in_rescue(host(P, Step.INSTALL)).model_copy(update={"status": first.status})
    for progress in (InstallProgress.RUNNING, InstallProgress.SUCCEEDED, InstallProgress.FAILED):
        again = decide(recorded, Observations(claimed=True, ssh=ssh(), install=progress), now=T0 + timedelta(seconds=5))
        assert again.action is None, progress
    retry = decide(recorded, Observations(claimed=True, ssh=ssh(), install=InstallProgress.NOT_STARTED))
    assert retry.action is not None and retry.status.operations[-1].attempt == 2


def test_an_activation_that_never_left_is_marked_not_sent_and_sent_once() -> None:
    crashed = host(INS, Step.RESCUE, ops=[("activate-rescue", S, None)])
    d = decide(crashed, Observations(rescue_active=False))
    assert [(o.name, o.outcome, o.attempt) for o in d.status.operations] == [
        ("activate-rescue", "NotSent", 1),
        ("activate-rescue", None, 2),
    ]
    assert d.action is not None and d.action.kind is A.ACTIVATE_RESCUE
    # Once the new one is recorded, Robot saying "not active" again (the reply not read back yet) is no reason
    # to send a third: only the newest, still open, activation counts, and it is the one just recorded.
    again = decide(crashed.model_copy(update={"status": d.status}), Observations(rescue_active=True))
    assert again.action is None


def test_a_bootstrap_that_never_started_is_marked_not_sent_and_started_once() -> None:
    crashed = host(P, Step.BOOTSTRAP, ops=[("bootstrap", S, None)])
    obs = Observations(claimed=True, bootstrap_ready=True, sentinel=False, cloud_init=CloudInitState.DISABLED)
    d = decide(crashed, obs)
    assert [(o.name, o.outcome) for o in d.status.operations] == [("bootstrap", "NotSent"), ("bootstrap", None)]
    running = Observations(claimed=True, bootstrap_ready=True, sentinel=False, cloud_init=CloudInitState.RUNNING)
    assert decide(crashed.model_copy(update={"status": d.status}), running).action is None


def test_a_crash_in_a_later_rescue_step_is_recovered_not_read_as_a_swapped_key() -> None:
    """Provisioning's Rescue step of a host inspected long ago: status still pins inspection's rescue keys.
    The previous OS answering with an unknown key must not be judged against those stale pins."""
    foreign = ssh(SSHOutcome.KEY_MISMATCH, presented=PresentedKey.UNKNOWN)
    never_left = in_rescue(host(P, Step.RESCUE, ops=[("activate-rescue", S, None)]))
    d = decide(never_left, Observations(claimed=True, rescue_active=False, ssh=foreign))
    assert d.status.state is P and d.action is not None and d.action.kind is A.ACTIVATE_RESCUE
    fresh = RESCUE_KEY.model_copy(update={"fingerprint": "bb:" * 15 + "bb"})
    unrecorded = decide(never_left, Observations(claimed=True, rescue_active=True, rescue_keys=(fresh,), ssh=foreign))
    assert unrecorded.action is None and unrecorded.status.host_keys.rescue == [fresh]
    assert unrecorded.status.operations[-1].outcome == "Sent"


def test_rescue_keys_read_back_after_a_crash_mark_the_activation_sent() -> None:
    d = decide(
        host(INS, Step.RESCUE, ops=[("activate-rescue", S, None)]),
        Observations(rescue_active=True, rescue_keys=(RESCUE_KEY,)),
    )
    assert d.status.host_keys.rescue == [RESCUE_KEY]
    assert d.status.operations[-1].outcome == "Sent" and d.action is None
