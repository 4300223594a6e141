"""Operator levers on a host: a permanent error keeps the host's loop alive (so removing the permanent-error
annotation is noticed), and a change of the permanent-error or reinspect annotation wakes that loop at once,
which needs kopf's progress bookkeeping kept out of our annotation domain (the latency itself is measured
on the real apiserver in tests/integration/test_host_lever_latency.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import kopf
import pytest

from capi_gpu import domain
from capi_gpu.api.host import ErrorType, HetznerGPUHost, HetznerGPUHostSpec, HetznerGPUHostStatus, HostState, Step
from capi_gpu.controllers import handlers, host_loop
from capi_gpu.provisioning import transitions
from capi_gpu.provisioning.model import Decision, Observations, Timing
from capi_gpu.runtime.deps import Deps
from capi_gpu.runtime.settings import Settings

T0 = datetime(2026, 10, 8, 9, 0, tzinfo=UTC)
TIMING = Timing()


def _no_deps() -> Deps:
    raise AssertionError("not started")


def test_a_permanent_error_still_gets_a_next_pass() -> None:
    host = HetznerGPUHost(
        metadata={"name": "gex-a"},
        spec=HetznerGPUHostSpec(server_number=1),
        status=HetznerGPUHostStatus(state=HostState.INSPECTING, step=Step.RESCUE),
    )
    ctx = transitions.Context(host, Observations(), T0, TIMING, "gex-a")
    permanent = transitions.fail(ctx, ErrorType.REBOOT_TIMEOUT, "no rescue after reset-hw")
    assert permanent.status.error_permanent and permanent.requeue_after is None  # nothing due: a human acts
    assert host_loop.next_pass(permanent, TIMING) == TIMING.poll * 30  # ... but the loop keeps looking
    assert host_loop.next_pass(Decision(permanent.status, requeue_after=2.5), TIMING) == 2.5


def test_lever_annotations_wake_the_host_loop() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, Settings(), _no_deps)
    fields = {h.id.split("/")[0]: (h.field, str(h.selector.any_name)) for h in registry._changing.get_all_handlers()}
    for handler_id, key in handlers.HOST_LEVERS.items():
        assert fields[handler_id] == (("metadata", "annotations", key), "hetznergpuhosts")
    assert set(handlers.HOST_LEVERS.values()) == {domain.ANNOTATION_PERMANENT_ERROR, domain.ANNOTATION_REINSPECT}


@pytest.mark.parametrize("marked", [False, True], ids=["new object", "marked kopf-managed by an older release"])
def test_kopfs_progress_bookkeeping_leaves_the_levers_in_the_diff(marked: bool) -> None:
    """kopf clears its progress prefix from every essence it diffs: that prefix must not be our domain. An
    older release's marker makes kopf strip our whole domain, but a handler's field is always put back."""
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    levers = {key: "true" for key in handlers.HOST_LEVERS.values()}
    marker = {f"{domain.DOMAIN}/kopf-managed": "yes"} if marked else {}
    body = kopf.Body({"metadata": {"uid": "u1", "name": "gex-a", "annotations": {**levers, **marker}}, "spec": {}})
    fields = [("metadata", "annotations", key) for key in levers]
    essence = settings.persistence.diffbase_storage.build(body=body, extra_fields=fields)
    cleared = settings.persistence.progress_storage.clear(essence=essence)
    assert cleared["metadata"]["annotations"] == levers
