"""Deleting a HetznerGPUHost is refused while it is in use (consumerRef) or holds a private network record
(``status.privateNetwork``: released but still leaving the vSwitch, or joined): the record is the only memory
that the server sits on the vSwitch with that address, and the allocator would hand the address to another
host. A clusterctl move's delete (delete-for-move) always goes: the host lives on in the target cluster."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from capi_gpu import domain
from capi_gpu.controllers import handlers
from capi_gpu.runtime.settings import Settings


def _delete_handler() -> Any:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, Settings(), lambda: None)  # type: ignore[arg-type,return-value]
    return next(h.fn for h in registry._changing.get_all_handlers() if h.id == "host-delete")


def _body(consumer: bool = False, membership: str | None = None, moving: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"serverNumber": 101}
    if consumer:
        spec["consumerRef"] = {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUMachine", "name": "m1"}
    status: dict[str, Any] = {"state": "Deprovisioning"}
    if membership is not None:
        status["privateNetwork"] = {"vswitchID": 7, "address": "10.0.1.9", "membership": membership}
    annotations = {domain.DELETE_FOR_MOVE_ANNOTATION: ""} if moving else {}
    return {
        "metadata": {"name": "h1", "namespace": "default", "annotations": annotations},
        "spec": spec,
        "status": status,
    }


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (_body(), None),
        (_body(consumer=True), "delete the Machine first"),
        (_body(membership="Leaving"), "the record is dropped once Robot shows the server off the vSwitch"),
        (_body(membership="Ready"), "wait for Deprovisioning"),
        (_body(membership="Joining"), "10.0.1.9 on vSwitch 7"),
        (_body(consumer=True, membership="Ready", moving=True), None),  # clusterctl move: nothing refused
        (_body(membership="Leaving", moving=True), None),
    ],
)
async def test_a_host_holding_its_private_network_record_is_not_deleted(
    body: dict[str, Any], refused: str | None
) -> None:
    delete = _delete_handler()
    if refused is None:
        await delete(body=body)
        return
    with pytest.raises(kopf.TemporaryError, match=refused):
        await delete(body=body)


def _moved(snapshot: str | None) -> dict[str, Any]:
    """A host that arrived by a move, its status not restored yet: what it holds is in its status snapshot."""
    body = _body()
    del body["status"]
    if snapshot is not None:
        body["metadata"]["annotations"][domain.ANNOTATION_STATUS] = snapshot
    return body


RECORDED = '{"privateNetwork":{"address":"10.0.1.9","membership":"Ready","vswitchID":7},"state":"Provisioned"}'


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (_moved(RECORDED), "10.0.1.9 on vSwitch 7"),
        (_moved('{"state":"Available"}'), None),
        (_moved("not json"), None),  # records nothing: the host loop says so on a host that stays
        (_moved(None), None),
    ],
)
async def test_a_moved_host_not_restored_yet_keeps_the_record_of_its_snapshot(
    body: dict[str, Any], refused: str | None
) -> None:
    delete = _delete_handler()
    if refused is None:
        await delete(body=body)
        return
    with pytest.raises(kopf.TemporaryError, match=refused):
        await delete(body=body)
