"""Autoscaler registration: the claim-aware scaler and the annotation sync are registered only when their
settings are on; the sync is a daemon on our template kind plus an event handler on MachineDeployments,
so no kopf daemon (and so no kopf finalizer) ever lands on CAPI's objects."""

from __future__ import annotations

import kopf
import pytest

from capi_gpu.controllers import handlers
from capi_gpu.runtime.deps import Deps
from capi_gpu.runtime.settings import Settings


def registered(settings: Settings) -> tuple[dict[str, str], dict[str, str]]:
    registry = kopf.OperatorRegistry()

    def no_deps() -> Deps:
        raise AssertionError("not started")

    handlers.register(registry, settings, no_deps)
    daemons = {h.id: str(h.selector.any_name) for h in registry._spawning.get_all_handlers()}
    watchers = {h.id: str(h.selector.any_name) for h in registry._watching.get_all_handlers()}
    return daemons, watchers


@pytest.mark.parametrize(("claim_scaler", "sync"), [(False, False), (True, False), (False, True), (True, True)])
def test_registered_only_when_enabled(claim_scaler: bool, sync: bool) -> None:
    daemons, watchers = registered(Settings(claim_scaler=claim_scaler, template_sync_annotations=sync))
    assert ("claim-scaler" in daemons) is claim_scaler
    assert ("ca-annotations" in daemons) is sync
    assert ("md-event" in watchers) is sync
    if claim_scaler:
        assert daemons["claim-scaler"] == "hetznergpuclusters"
    if sync:
        assert daemons["ca-annotations"] == "hetznergpumachinetemplates"
        assert watchers["md-event"] == "machinedeployments"


def test_no_daemon_on_capi_kinds() -> None:
    daemons, _ = registered(Settings(claim_scaler=True, template_sync_annotations=True))
    assert not {kind for kind in daemons.values() if not kind.startswith("hetznergpu")}
