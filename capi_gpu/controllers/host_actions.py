"""The one action a host decision asks for, performed against Robot, SSH or Ansible, as an ActionResult.

Every external error is translated here, once, into the closed set of outcomes the state machine
understands: OK, FAILED (typed, maybe permanent) or DEFERRED (nothing was sent). A Robot reset whose
fate is unknown (transport error after sending) counts as sent: the reboot ladder, never a resend,
recovers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from capi_gpu.api.host import (
    DiskInfo,
    ErrorType,
    GPUInfo,
    HardwareDetails,
    HetznerGPUHost,
    MigInstance,
    RescueHostKey,
)
from capi_gpu.api.specs import InstallImageSpec
from capi_gpu.controllers import host_handover
from capi_gpu.controllers.host_context import HostEnv, hostname, plan_for
from capi_gpu.controllers.host_probes import open_shell, os_pin, rescue_pin
from capi_gpu.gpu import catalog, gpuplan
from capi_gpu.hetzner import errors as robot_errors
from capi_gpu.hetzner import models as robot_models
from capi_gpu.provisioning import (
    ansible,
    handover,
    installimage,
    mig_readout,
    node_image,
    playbook_vars,
    ssh,
    steps,
)
from capi_gpu.provisioning.ansible_events import PlaybookResult, RunStatus, TaskEvent
from capi_gpu.provisioning.model import Action, ActionKind, ActionResult
from capi_gpu.runtime.deps import Deps

log = logging.getLogger(__name__)
T = TypeVar("T")
ROBOT_KEY_NAME = "capi-gpu"


async def _robot(call: Awaitable[T], unknown_is_sent: bool = False) -> T | ActionResult:
    try:
        return await call
    except robot_errors.RobotRequeue as exc:
        return ActionResult.deferred(exc.retry_after or 30.0, f"Robot: {exc}")
    except robot_errors.RobotAuthError as exc:
        return ActionResult.deferred(60.0, f"Robot credentials rejected; all Robot calls stopped: {exc}")
    except robot_errors.RobotTransientError as exc:
        if unknown_is_sent:
            return ActionResult.ok(message=f"outcome unknown ({exc}); the ladder will tell")
        return ActionResult.deferred(30.0, f"Robot unavailable: {exc}")
    except robot_errors.RobotTerminalError as exc:
        return ActionResult.failed(ErrorType.ROBOT, f"Robot refused: {exc}")


async def activate_rescue(host: HetznerGPUHost, env: HostEnv) -> ActionResult:
    fp = await _robot(env.robot.ensure_key(ROBOT_KEY_NAME, env.ssh_public))
    if isinstance(fp, ActionResult):
        return fp
    rescue = await _robot(env.robot.enable_rescue(host.spec.server_number, [fp]))
    if isinstance(rescue, ActionResult):
        return rescue
    keys = tuple(RescueHostKey(type=k.key.type or "", fingerprint=k.key.fingerprint.lower()) for k in rescue.host_key)
    if not keys:
        return ActionResult.failed(ErrorType.ROBOT, "Robot reported no rescue host keys; refusing to connect unpinned")
    return ActionResult.ok(rescue_keys=keys, message="rescue activated")


async def robot_reset(host: HetznerGPUHost, env: HostEnv, kind: robot_models.ResetType) -> ActionResult:
    res = await _robot(env.robot.reset(host.spec.server_number, kind), unknown_is_sent=True)
    return res if isinstance(res, ActionResult) else ActionResult.ok(message=f"Robot reset {kind.value} sent")


def _ssh(
    deps: Deps,
    host: HetznerGPUHost,
    env: HostEnv,
    pin: ssh.HostKeyPin | None,
    fn: Callable[[ssh.HostShell], ActionResult],
    error: ErrorType,
) -> ActionResult:
    if pin is None or not host.status.ipv4:
        return ActionResult.failed(error, "no pinned host key or address for this host yet")
    shell = open_shell(deps, host, env, pin)
    try:
        return fn(shell)
    except ssh.HostKeyMismatch as exc:
        return ActionResult.failed(ErrorType.HOST_KEY_MISMATCH, f"refused to connect: {exc}", permanent=True)
    except ssh.CommandFailed as exc:
        return ActionResult.failed(error, f"{exc.operation} exited {exc.exit_status}: {exc.stderr_tail[-500:]}")
    except ssh.SSHError as exc:
        return ActionResult.failed(error, f"ssh: {exc}")
    except installimage.NoInstallDisk as exc:
        return ActionResult.failed(ErrorType.INSTALL_FAILED, str(exc), permanent=True)
    finally:
        with contextlib.suppress(Exception):
            shell.close()


def _inspect(shell: ssh.HostShell) -> ActionResult:
    disks = shell.disks()
    cpus, mem = shell.cpu_memory()
    gpus = []
    cat = catalog.builtin_catalog()
    for dev in shell.gpus():
        model = cat.for_device_id(dev.device_id)
        gpus.append(
            GPUInfo(
                vendor_id=f"{dev.vendor_id:04x}",
                device_id=f"{dev.device_id:04x}",
                model=model.key if model else "",
                mig_capable=bool(model and model.profiles),
                pci_address=dev.address,
            )
        )
    hw = HardwareDetails(
        cpu_threads=cpus,
        memory_mib=mem,
        gpus=gpus,
        disks=[
            DiskInfo(
                wwn=d.wwn, size_bytes=d.size_bytes, model=d.model or "", serial=d.serial or "", rotational=d.rotational
            )
            for d in disks
            if d.wwn
        ],
    )
    gpu_text = ", ".join(f"{g.model or g.device_id}" for g in gpus) or "no NVIDIA GPU"
    return ActionResult.ok(hardware=hw, message=f"{len(hw.disks)} disks, {gpu_text}, {cpus} CPUs, {mem // 1024} GiB")


async def execute(deps: Deps, host: HetznerGPUHost, env: HostEnv, action: Action, wipe: list[str]) -> ActionResult:
    """Perform ``action``; never raises for an external failure."""
    kind = action.kind
    rescue, os_ = rescue_pin(host), os_pin(env.os_key.public) if env.os_key.public else None
    match kind:
        case ActionKind.ACTIVATE_RESCUE:
            return await activate_rescue(host, env)
        case ActionKind.RESET_SW:
            return await robot_reset(host, env, robot_models.ResetType.SOFTWARE)
        case ActionKind.RESET_HW:
            return await robot_reset(host, env, robot_models.ResetType.HARDWARE)
        case ActionKind.SSH_REBOOT | ActionKind.MIG_REBOOT:
            step = host.status.step
            pin = rescue if step is not None and steps.TABLE[step].reboots_rescue else os_
            return await asyncio.to_thread(_ssh, deps, host, env, pin, _reboot, ErrorType.REBOOT_TIMEOUT)
        case ActionKind.INSPECT:
            return await asyncio.to_thread(_ssh, deps, host, env, rescue, _inspect, ErrorType.INSPECTION)
        case ActionKind.CHECK_DISKS:
            return await asyncio.to_thread(
                _ssh,
                deps,
                host,
                env,
                rescue,
                lambda sh: _check_disks(host, sh, bool(wipe)),
                ErrorType.DISK_CHECK_FAILED,
            )
        case ActionKind.WIPE:
            return await asyncio.to_thread(
                _ssh, deps, host, env, rescue, lambda sh: _wipe(host, sh, wipe), ErrorType.PROVISIONING
            )
        case ActionKind.START_INSTALL:
            return await asyncio.to_thread(
                _ssh, deps, host, env, rescue, lambda sh: _install(host, env, sh), ErrorType.INSTALL_FAILED
            )
        case ActionKind.CONFIGURE:
            return await configure(deps, host, env)
        case ActionKind.BOOTSTRAP:
            return await asyncio.to_thread(
                _ssh, deps, host, env, os_, lambda sh: _bootstrap(host, env, sh), ErrorType.BOOTSTRAP_FAILED
            )
        case ActionKind.KUBEADM_RESET:
            return await asyncio.to_thread(_ssh, deps, host, env, os_, _kubeadm_reset, ErrorType.DEPROVISIONING)


def _reboot(shell: ssh.HostShell) -> ActionResult:
    shell.reboot()
    return ActionResult.ok(message="reboot over SSH")


def _kubeadm_reset(shell: ssh.HostShell) -> ActionResult:
    shell.kubeadm_reset()
    return ActionResult.ok(message="kubeadm reset -f")


def _root_wwns(host: HetznerGPUHost) -> list[str]:
    disks = host.status.hardware.disks if host.status.hardware else []
    return installimage.root_disks(disks, host.spec.root_device_hints, _image(host))


def _image(host: HetznerGPUHost) -> InstallImageSpec:
    return host.spec.standby.install_image if host.spec.standby else InstallImageSpec()


def _check_disks(host: HetznerGPUHost, shell: ssh.HostShell, wiping: bool) -> ActionResult:
    wwns = _root_wwns(host)
    if not shell.smart_ok(wwns):
        return ActionResult.failed(ErrorType.DISK_CHECK_FAILED, f"SMART health check failed on {wwns}", permanent=True)
    if not wiping:
        others = shell.other_linux_present(wwns)
        if others:
            return ActionResult.failed(
                ErrorType.OTHER_LINUX_FOUND,
                f"another OS on {others}: it could boot instead of ours; set the wipe-disk annotation to clear it",
                permanent=True,
            )
    return ActionResult.ok(message=f"disks {wwns} healthy")


def _wipe(host: HetznerGPUHost, shell: ssh.HostShell, wipe: list[str]) -> ActionResult:
    disks = [d.wwn for d in (host.status.hardware.disks if host.status.hardware else [])]
    unknown = [w for w in wipe if w != "all" and w not in disks]
    if unknown:
        # A typo must not shrink the wipe to the disks that happen to match: say so, and wipe nothing.
        return ActionResult.failed(
            ErrorType.PROVISIONING,
            f"the wipe-disk annotation names {unknown}, which match no disk of this host ({disks}); nothing wiped",
        )
    targets = disks if "all" in wipe else wipe
    shell.wipe(targets)
    return ActionResult.ok(message=f"wiped {targets}")


def _node_image(env: HostEnv, shell: ssh.HostShell) -> node_image.Plan | ActionResult | None:
    """With ``spec.image``: stage and check it in rescue, before anything is written (``node_image``)."""
    consumer = env.consumer
    if consumer is None or consumer.standby or consumer.machine.spec.image is None:
        return None
    image = consumer.machine.spec.image
    dest = node_image.staged_path(image)
    sha = shell.stage_image(image.url, dest)
    manifest = shell.image_manifest(dest) if sha == image.sha256 else None  # a wrong archive is not read
    return node_image.decide(
        image, sha, manifest, consumer.machine.spec, catalog.builtin_catalog(), consumer.kubernetes_version
    )


def _install(host: HetznerGPUHost, env: HostEnv, shell: ssh.HostShell) -> ActionResult:
    consumer = env.consumer
    image = consumer.install_image if consumer else _image(host)
    plan = _node_image(env, shell)
    if isinstance(plan, ActionResult):
        return plan
    if plan is not None and plan.image_path is not None:
        image = image.model_copy(update={"image_path": plan.image_path})
    wwns = installimage.root_disks(
        host.status.hardware.disks if host.status.hardware else [], host.spec.root_device_hints, image
    )
    name = hostname(host)
    user_data = consumer.bootstrap.text if consumer and consumer.bootstrap else None
    script = installimage.post_install(
        name,
        env.os_key.private,
        env.os_key.public,
        env.ssh_public,
        instance_id=f"{name}-{host.spec.server_number}",
        user_data=user_data,
        extra=image.post_install_script,
        server_number=host.spec.server_number,
    )
    shell.start_installimage(installimage.autosetup(image, name, wwns, uefi=shell.uefi()), script)
    return ActionResult.ok(message=f"installimage started: {plan.message}" if plan else "installimage started")


def _bootstrap(host: HetznerGPUHost, env: HostEnv, shell: ssh.HostShell) -> ActionResult:
    consumer = env.consumer
    if consumer is None or consumer.bootstrap is None:
        return ActionResult.deferred(10.0, "bootstrap data not ready")
    name = hostname(host)
    uid = consumer.machine.metadata.get("uid", name)
    # server_number lets CABPK templates say provider-id: hrobot://{{ ds.meta_data.server_number }}.
    meta = installimage.meta_data(str(uid), name, host.spec.server_number)
    shell.start_bootstrap(consumer.bootstrap.text, meta)
    return ActionResult.ok(message="bootstrap started")


def configure_vars(
    kubernetes_version: str, plan: gpuplan.GPUPlan, driver_branch: str, overrides: dict[str, Any]
) -> playbook_vars.PlaybookVars | ActionResult:
    """The run's variables, or a permanent failure that says why: a refusal here is a condition and an Event
    on the host, never an exception out of Configure, and no host is touched."""
    try:
        return playbook_vars.node_vars(kubernetes_version, plan, driver_branch, overrides)
    except gpuplan.PlanError as exc:
        return ActionResult.failed(ErrorType.CONFIGURATION_REFUSED, f"{exc.reason}: {exc}", permanent=True)
    except ValidationError as exc:
        # The operator's --playbook-vars the roles would not take: a retry cannot fix it, a human fixes the flag.
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'vars'}: {e['msg']}" for e in exc.errors())
        return ActionResult.failed(ErrorType.CONFIGURATION_REFUSED, f"playbook variables refused: {why}", True)


def _with_private_network(
    variables: playbook_vars.PlaybookVars, interface: dict[str, Any]
) -> playbook_vars.PlaybookVars | ActionResult:
    """The cluster's VLAN interface and node IP added to the run's variables (``host_vswitch`` set them)."""
    try:
        return playbook_vars.with_private_network(variables, interface)
    except ValidationError as exc:
        return ActionResult.failed(ErrorType.CONFIGURATION_REFUSED, f"private network variables refused: {exc}", True)


async def configure(deps: Deps, host: HetznerGPUHost, env: HostEnv) -> ActionResult:
    consumer = env.consumer
    if consumer is None:
        return ActionResult.deferred(10.0, "no consumer or standby spec to configure for")
    try:
        plan = plan_for(host, consumer)
    except gpuplan.PlanError as exc:
        return ActionResult.failed(ErrorType.CONFIGURATION_REFUSED, f"{exc.reason}: {exc}", permanent=True)
    if plan is None:
        return ActionResult.ok(message="no GPU stack requested", layout="none", prepared=consumer.prepared)
    gpu = consumer.gpu
    assert gpu is not None
    variables = configure_vars(consumer.kubernetes_version, plan, gpu.driver_branch, deps.settings.playbook_overrides)
    if env.private_network is not None and not isinstance(variables, ActionResult):
        variables = _with_private_network(variables, env.private_network.playbook_vars())
    if isinstance(variables, ActionResult):
        return variables
    target = ansible.SSHTarget(
        name=hostname(host),
        address=host.status.ipv4 or "",
        host_key=" ".join(env.os_key.public.split()[:2]),
        private_key=env.ssh_private,
    )
    roles: list[str] = []

    def on_event(ev: TaskEvent) -> None:
        if ev.role and (not roles or roles[-1] != ev.role):
            roles.append(ev.role)

    task = await _start_or_join(deps, host, env, plan.key, consumer.prepared, target, variables, on_event)
    if isinstance(task, ActionResult):
        return task
    result = await asyncio.shield(task)
    if result.status is RunStatus.REBOOT_NEEDED:
        return ActionResult.ok(reboot_needed=True, message=result.reboot_reason or "MIG mode needs a reboot")
    if result.status is RunStatus.HOST_KEY_MISMATCH:
        return ActionResult.failed(ErrorType.HOST_KEY_MISMATCH, "ansible: host key is not the pinned one", True)
    if not result.ok:
        where = f"{result.failed.label}: {result.failed.message}" if result.failed else result.status.value
        return ActionResult.failed(ErrorType.ANSIBLE_FAILED, f"ansible {result.status.value} at {where}")
    summary = f"{len(roles)} roles in {result.duration_s:.0f}s, changed={result.changed}"
    return await _configured(deps, host, env, plan.key, consumer.prepared, summary)


_RUNS: dict[str, asyncio.Future[PlaybookResult]] = {}  # host uid -> its shielded run, kept from the GC


async def _start_or_join(
    deps: Deps,
    host: HetznerGPUHost,
    env: HostEnv,
    layout: str,
    prepared: str | None,
    target: ansible.SSHTarget,
    variables: playbook_vars.PlaybookVars,
    on_event: Callable[[TaskEvent], None],
) -> asyncio.Future[PlaybookResult] | ActionResult:
    """The run to wait for: one this process already has going for the host, else a new one after the
    hand-over check (which may wait or adopt instead: an ActionResult)."""
    uid = str(host.metadata.get("uid", ""))
    running = _RUNS.get(uid)
    if running is not None and not running.done():
        # The server's marker names our own uid, which reads as a run that died with a controller; but this
        # process still has it going (its pass was cancelled, e.g. leadership lost and won back): join it,
        # never a second Ansible run beside it.
        return running
    handed = await _handover(deps, host, env, layout, prepared)
    if isinstance(handed, ActionResult):
        return handed
    # Shielded by the caller: a host object deleted mid-run (clusterctl move deletes the source's) cancels its
    # loop 10 s later, but the run goes on in its thread regardless; its outcome must still reach the server's
    # marker, or the moved host would wait out the runner's timeout instead of adopting it.
    task = asyncio.ensure_future(_run_marked(deps, host, env, target, variables, handed, on_event))
    _RUNS[uid] = task

    def forget(done: asyncio.Future[PlaybookResult]) -> None:
        if _RUNS.get(uid) is done:
            del _RUNS[uid]

    task.add_done_callback(forget)
    return task


async def _run_marked(
    deps: Deps,
    host: HetznerGPUHost,
    env: HostEnv,
    target: ansible.SSHTarget,
    variables: playbook_vars.PlaybookVars,
    started: handover.Marker,
    on_event: Callable[[TaskEvent], None],
) -> PlaybookResult:
    """The run, then its outcome in the server's marker."""
    result = await deps.runner.prepare_node(target, variables, on_event)
    if (ended := _run_state(result.status, result.ok)) is not None:
        done = dataclasses.replace(started, state=ended, message=result.status.value)
        await asyncio.to_thread(host_handover.mark, deps, host, env, done)
    return result


def _run_state(status: RunStatus, ok: bool) -> handover.RunState | None:
    """What the server's marker says of a finished run; None: write nothing (the server isn't ours)."""
    if status is RunStatus.HOST_KEY_MISMATCH:
        return None
    if status is RunStatus.REBOOT_NEEDED:
        return handover.RunState.REBOOT_NEEDED
    return handover.RunState.DONE if ok else handover.RunState.FAILED


async def _handover(
    deps: Deps, host: HetznerGPUHost, env: HostEnv, layout: str, prepared: str | None
) -> handover.Marker | ActionResult:
    """Before a run, the server's run marker (``provisioning.handover``): wait for a run the management
    cluster this host moved from still has going, adopt the outcome of one it finished, or mark this run as
    started and return the marker."""
    run, recorded = host_handover.current_run(host, deps.clock())
    try:
        verdict = await asyncio.to_thread(host_handover.check, deps, host, env, run, recorded)
    except ssh.SSHError as exc:
        return ActionResult.failed(ErrorType.ANSIBLE_FAILED, f"ssh: reading the Configure run marker: {exc}")
    match verdict:
        case handover.Wait(until=until, message=message):
            return ActionResult.deferred(min(60.0, max(5.0, (until - deps.clock()).total_seconds())), message)
        case handover.Adopt(reboot_needed=True, message=message):
            return ActionResult.ok(reboot_needed=True, message=message)
        case handover.Adopt(message=message):
            return await _configured(deps, host, env, layout, prepared, message)
    marker = host_handover.starting(deps, host, run)
    await asyncio.to_thread(host_handover.mark, deps, host, env, marker)
    return marker


async def _configured(
    deps: Deps, host: HetznerGPUHost, env: HostEnv, layout: str, prepared: str | None, summary: str
) -> ActionResult:
    devices, instances = await asyncio.to_thread(_mig_devices, deps, host, env)
    return ActionResult.ok(
        mig_devices=tuple(devices),
        mig_instances=tuple(instances),
        layout=layout,
        prepared=prepared,
        message=f"{summary}; MIG: {', '.join(devices) or 'off'}",
    )


def _mig_devices(deps: Deps, host: HetznerGPUHost, env: HostEnv) -> tuple[list[str], list[MigInstance]]:
    """The host side of the readiness check: the MIG instances nvidia-smi reports, by profile, and the GPU
    instances with the placements NVML chose (which name the DRA devices); instances stay empty, so the gate
    counts by profile, when ``-lgi`` or the minor number can't be read."""
    shell = open_shell(deps, host, env, os_pin(env.os_key.public))
    try:
        try:
            found = mig_readout.profiles(shell.nvidia_smi(["-L"]))
        except (ssh.SSHError, ValueError) as exc:
            log.warning("host %s: nvidia-smi -L failed: %s", hostname(host), exc)
            return [], []
        if not found:
            return found, []
        try:
            placed = mig_readout.instances(shell.nvidia_smi(["-q", "-x"]), shell.nvidia_smi(["mig", "-lgi"]), found)
        except (ssh.SSHError, ValueError) as exc:
            log.warning("host %s: nvidia-smi mig -lgi / -q -x failed: %s", hostname(host), exc)
            return found, []
        if not placed:
            log.warning("host %s: -lgi or -q -x disagree with -L %s; device names unknown", hostname(host), found)
        return found, placed
    finally:
        with contextlib.suppress(Exception):
            shell.close()
