"""What the Install step's image refusals do to the host: an error state, permanent (no backoff, so no
reset and no second installimage attempt), the Ready condition HostError naming the reason and the
checksum, and a warning Event of that reason; a FullInstall fallback's note reaches the Installing Event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from states_helpers import T0, context, host, with_keys

from capi_gpu.api import conditions as c
from capi_gpu.api.host import ErrorType, HostState, Step
from capi_gpu.provisioning import host_conditions, outcomes
from capi_gpu.provisioning.model import Action, ActionKind, ActionResult, Observations


def _installing() -> outcomes.transitions.Context:
    h = with_keys(host(HostState.PROVISIONING, Step.INSTALL, ops=[("installimage", timedelta(seconds=1), None)]))
    return context(h, Observations(claimed=True))


@pytest.mark.parametrize("error", [ErrorType.IMAGE_CHECKSUM_MISMATCH, ErrorType.IMAGE_MISMATCH])
def test_a_refused_image_is_a_permanent_error_with_its_reason(error: ErrorType) -> None:
    message = f"{error.value} detail: nothing was written to the disks"
    result = ActionResult.failed(error, message, permanent=True)
    d = outcomes.apply_result(_installing(), Action(ActionKind.START_INSTALL), result)
    st = d.status
    assert (st.state, st.error_type, st.error_permanent, d.requeue_after) == (HostState.ERROR, error, True, None)
    assert st.operations[-1].outcome is not None and st.operations[-1].outcome.startswith("Failed: ")
    assert [(n.reason, n.warning) for n in d.notes] == [(error.value, True)]
    ready = next(
        x for x in host_conditions.derive(_installing().host, st, T0, None, None).conditions if x.type == c.Type.READY
    )
    assert (ready.status, ready.reason) == ("False", c.Reason.HOST_ERROR)
    assert ready.message.startswith(f"{error.value}: {message}") and "permanent" in ready.message


def test_a_full_install_fallback_says_why_in_the_installing_event() -> None:
    result = ActionResult.ok(message="installimage started: the node image does not fit, fallback FullInstall ...")
    d = outcomes.apply_result(_installing(), Action(ActionKind.START_INSTALL), result)
    assert [(n.reason, n.message) for n in d.notes] == [("Installing", result.message)]
