"""The host's conditions and labels, derived in one place from its status (pure, as CAPI core does).

Never read back to decide anything: the state machine decides from status fields and observations;
conditions and labels only tell users and selectors what status already says.
"""

from __future__ import annotations

import re
from datetime import datetime

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HetznerGPUHostStatus, HostState

READY_STATES = {
    HostState.AVAILABLE: c.Reason.AVAILABLE,
    HostState.STANDBY: c.Reason.STANDBY,
    HostState.PROVISIONED: c.Reason.PROVISIONED,
}


def derive(
    host: HetznerGPUHost,
    status: HetznerGPUHostStatus,
    now: datetime,
    access_error: tuple[str, str] | None,
    circuit: str | None,
) -> HetznerGPUHostStatus:
    out = status.model_copy(deep=True)
    gen = host.metadata.get("generation")
    generation = int(gen) if isinstance(gen, int) else None
    conds = out.conditions
    if access_error is not None:
        conds = c.set_condition(conds, c.Type.READY, False, access_error[0], access_error[1], now, generation)
    elif status.state in READY_STATES:
        conds = c.set_condition(
            conds, c.Type.READY, True, READY_STATES[status.state], f"{status.state.value}", now, generation
        )
    elif status.state is HostState.ERROR:
        msg = f"{status.error_type.value if status.error_type else 'Error'}: {status.error_message or ''}"
        if status.error_permanent:
            msg += " (permanent: remove the permanent-error annotation once fixed)"
        conds = c.set_condition(conds, c.Type.READY, False, c.Reason.HOST_ERROR, msg, now, generation)
    elif status.state is HostState.MAINTENANCE:
        conds = c.set_condition(
            conds, c.Type.READY, False, c.Reason.MAINTENANCE, "maintenanceMode is on", now, generation
        )
    else:
        step = f" ({status.step.value})" if status.step else ""
        reason = c.Reason.INSPECTING if status.state is HostState.INSPECTING else c.Reason.PROVISIONING
        conds = c.set_condition(conds, c.Type.READY, False, reason, f"{status.state.value}{step}", now, generation)
    conds = c.set_condition(
        conds,
        c.Type.INSPECTED,
        status.hardware is not None,
        c.Reason.READY if status.hardware else c.Reason.INSPECTING,
        "hardware inspected" if status.hardware else "not inspected yet",
        now,
        generation,
    )
    conds = c.set_condition(
        conds,
        c.Type.ROBOT_REACHABLE,
        circuit is None,
        c.Reason.READY if circuit is None else c.Reason.CREDENTIALS_REJECTED,
        circuit or "Robot answers",
        now,
        generation,
    )
    out.conditions = conds
    return out


def robot_reachable(status: HetznerGPUHostStatus) -> bool:
    """What the host last said about Robot (True until it said otherwise)."""
    return c.get(status.conditions, c.Type.ROBOT_REACHABLE) is None or c.is_true(
        status.conditions, c.Type.ROBOT_REACHABLE
    )


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("-._")
    return value


def labels(status: HetznerGPUHostStatus) -> dict[str, str | None]:
    """Labels hostSelector can match; None removes a label."""
    out: dict[str, str | None] = {}
    hw = status.hardware
    if hw is not None:
        gpu = hw.gpus[0] if hw.gpus else None
        out[domain.LABEL_GPU_PRESENT] = "true" if gpu else "false"
        out[domain.LABEL_GPU_MODEL] = _label_value(gpu.model) if gpu and gpu.model else None
        out[domain.LABEL_GPU_DEVICE_ID] = gpu.device_id if gpu else None
        out[domain.LABEL_MIG_CAPABLE] = "true" if gpu and gpu.mig_capable else "false"
    out[domain.LABEL_PRODUCT] = _label_value(status.product) if status.product else None
    out[domain.LABEL_DATACENTER] = _label_value(status.datacenter.lower()) if status.datacenter else None
    out[domain.LABEL_LAYOUT] = _label_value(status.layout) if status.layout else None
    out[domain.LABEL_STANDBY] = "true" if status.state is HostState.STANDBY else None
    return out
