"""The audit reader keeps successful ResponseComplete writes, with the subresource, and skips the rest."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import yaml

from capi_gpu import domain
from capi_gpu_sim import audit


def _event(stage: str, code: int, sub: str = "", name: str = "gex131-1") -> str:
    ref = {"resource": "hetznergpuhosts", "namespace": "default", "name": name, "apiGroup": domain.GROUP}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "stage": stage,
            "verb": "patch",
            "user": {"username": "system:serviceaccount:capi-gpu-system:capi-gpu-controller-manager"},
            "userAgent": "kopf/1.45",
            "objectRef": ref,
            "responseStatus": {"code": code},
            "stageTimestamp": "2026-12-04T15:00:01.250000Z",
        }
    )


def test_writes_are_successful_completions_with_their_subresource(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    read = json.loads(_event("ResponseComplete", 200, name="read"))
    read["verb"] = "get"  # the policy keeps the operator's reads too: never a write
    lines = [
        json.dumps(read),
        _event("ResponseComplete", 200, "status"),
        _event("ResponseComplete", 409, name="conflicted"),
        _event("Panic", 500, name="panicked"),
        _event("ResponseComplete", 201, name="created"),
        '{"stage": "ResponseComp',  # a line still being written
    ]
    log.write_text("\n".join(lines))
    got = audit.writes(log)
    assert [(w.resource, w.name, w.code) for w in got] == [
        ("hetznergpuhosts/status", "gex131-1", 200),
        ("hetznergpuhosts", "created", 201),
    ]
    assert got[0].at == 1796396401.25 and got[0].agent == "kopf/1.45"
    assert audit.writes(tmp_path / "absent.log") == []


def test_the_policy_records_our_and_capi_cores_writes_and_the_operators_requests_at_metadata_level(
    tmp_path: Path,
) -> None:
    flags = audit.flags(tmp_path)
    policy = yaml.safe_load((tmp_path / "audit-policy.yaml").read_text())
    first, operator, last = policy["rules"]
    # CAPI core's group too: the move e2e attributes clusterctl's writes to paused Machines to clusterctl.
    assert first["level"] == "Metadata"
    assert first["resources"] == [{"group": domain.GROUP}, {"group": domain.CAPI_GROUP}]
    assert "get" not in first["verbs"] and last == {"level": "None"}
    # Every request of the release's ServiceAccount, whatever its outcome: a Forbidden is a missing rule.
    assert operator == {"level": "Metadata", "users": [audit.OPERATOR_USER]}
    assert f"--audit-log-path={tmp_path / 'audit.log'}" in flags


def test_responses_keep_every_outcome(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    event = {
        "stage": "ResponseComplete",
        "verb": "list",
        "user": {"username": audit.OPERATOR_USER},
        "objectRef": {"resource": "machinesets", "apiGroup": "cluster.x-k8s.io"},
        "responseStatus": {"code": 403, "message": "forbidden"},
    }
    log.write_text(json.dumps(event) + "\n" + json.dumps({**event, "stage": "RequestReceived"}))
    (got,) = audit.responses(log)
    assert (got.user, got.verb, got.resource, got.code) == (audit.OPERATOR_USER, "list", "machinesets", 403)


def test_a_request_cut_by_its_clients_death_is_told_from_a_refusal(tmp_path: Path) -> None:
    """Stop 35's CI: the leader the whole-flow test SIGKILLs had a patch in flight; the apiserver logged it
    as 504 "context canceled", and the audit counted it as a refused write."""
    cut = {"code": 504, "message": "Timeout: request did not complete within requested timeout - context canceled"}
    lines = []
    for received, answered, status in [
        ("2026-12-04T15:00:00.900000Z", "2026-12-04T15:00:01.300000Z", cut),  # in flight at the kill
        ("2026-12-04T15:00:10.000000Z", "2026-12-04T15:00:11.000000Z", cut),  # long after: a real timeout
        ("2026-12-04T15:00:00.900000Z", "2026-12-04T15:00:01.300000Z", {"code": 504, "message": "deadline"}),
    ]:
        event = json.loads(_event("ResponseComplete", 504))
        event.update(requestReceivedTimestamp=received, stageTimestamp=answered, responseStatus=status)
        lines.append(json.dumps(event))
    log = tmp_path / "audit.log"
    log.write_text("\n".join(lines))
    got = audit.responses(log)
    assert got[0].received == "2026-12-04T15:00:00.900000Z" and got[0].answered == "2026-12-04T15:00:01.300000Z"
    killed = dt.datetime(2026, 12, 4, 15, 0, 1, tzinfo=dt.UTC)
    assert [audit.cut_by_client(r, killed) for r in got] == [True, False, False]
