"""A scale-up whose MachineDeployment changed since the pass read it (CAPI writes its status often) is not
sent, not announced, and voids the pass: the next pass decides, raises and reports again, so a
ClaimScaleBlocked warning never precedes the ClaimScaleUp it belongs with (seen under CI load)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

from capi_gpu.autoscaler import decide
from capi_gpu.autoscaler.scaler import ClaimScaler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controllers"))
from fake_kube import NS, FakeKube

UP = decide.ScaleUp(group="gpu-claims", current=0, target=1, serves=(("2g.48gb", 1),))


def _scaler(kube: FakeKube, said: list[tuple[str, str]]) -> ClaimScaler:
    deps = cast(Any, type("D", (), {"kube": kube})())
    return ClaimScaler(
        deps, NS, "c1", cast(Any, None), emit=lambda obj, reason, msg, *_a, **_k: said.append((reason, msg))
    )


def _md(rv: str) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-claims", "resourceVersion": rv}, "spec": {"replicas": 0}}


def _stored(kube: FakeKube) -> dict[str, Any]:
    return kube.objs[("machinedeployments", NS, "gpu-claims")]


async def test_a_stale_machinedeployment_is_not_raised_nor_announced() -> None:
    kube = FakeKube(("machinedeployments", _md("0")))
    said: list[tuple[str, str]] = []
    stale = _md(str(int(_stored(kube)["metadata"]["resourceVersion"]) - 1))
    assert await _scaler(kube, said)._raise(stale, UP) is False
    assert said == [] and kube.objs[("machinedeployments", NS, "gpu-claims")]["spec"]["replicas"] == 0


async def test_a_current_machinedeployment_is_raised_and_announced() -> None:
    kube = FakeKube(("machinedeployments", _md("0")))
    said: list[tuple[str, str]] = []
    assert await _scaler(kube, said)._raise(_md(_stored(kube)["metadata"]["resourceVersion"]), UP) is True
    assert said == [("ClaimScaleUp", "0->1 for 1x 2g.48gb pending")]
    assert kube.objs[("machinedeployments", NS, "gpu-claims")]["spec"]["replicas"] == 1
