"""`capi-gpu cost --measured` against the real kube-apiserver: GPU nodes from gpu.nvidia.com ResourceSlices
(the driver field selector), slices held by allocated ResourceClaims (status written through the status
subresource, allocationTimestamp kept), the --node filter, exit 1 when there is nothing to measure, and --plot
marking the measured utilization."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import cli, domain
from capi_gpu.kube import RESOURCECLAIMS, RESOURCESLICES, Kube
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration


def nvidia_slice(node: str, driver: str = domain.NVIDIA_DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": n} for n in ("gpu-0-mig-1g24gb-14-0", "gpu-0-mig-1g24gb-14-3", "gpu-0-mig-2g48gb-5-6")
            ],
        },
    }


def allocate(kube: Kube, namespace: str, name: str, node: str, device: str, hours_ago: float) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": domain.NVIDIA_DRIVER}}]}},
    }
    kube.create(RESOURCECLAIMS, claim, namespace)
    stamp = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=hours_ago)
    allocation = {
        "devices": {"results": [{"request": "gpu", "driver": domain.NVIDIA_DRIVER, "pool": node, "device": device}]},
        "allocationTimestamp": stamp.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
    }
    kube.patch(RESOURCECLAIMS, name, {"status": {"allocation": allocation}}, namespace, sub="status")


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, str, str]]:
    tag = uuid.uuid4().hex[:6]
    a, b, gate_only = f"cost-{tag}-a", f"cost-{tag}-b", f"cost-{tag}-c"
    slices = [nvidia_slice(a), nvidia_slice(b), nvidia_slice(gate_only, domain.GATE_DRIVER)]
    for s in slices:
        kube.create(RESOURCESLICES, s)
    yield a, b, gate_only
    for s in slices:
        kube.delete(RESOURCESLICES, s["metadata"]["name"])


def measured(control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    capsys.readouterr()
    rc = cli.main(["cost", "--measured", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json", *argv])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if rc == 0 else None, err


def test_measured_utilization_from_claims(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    nodes: tuple[str, str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    a, b, gate_only = nodes
    allocate(kube, namespace, "train", a, "gpu-0-mig-2g48gb-5-6", hours_ago=6)  # 2 slices x 6 h
    allocate(kube, namespace, "serve", b, "gpu-0-mig-1g24gb-14-0", hours_ago=30)  # 1 slice, the whole window
    stored = kube.get(RESOURCECLAIMS, "train", namespace)
    assert stored["status"]["allocation"]["allocationTimestamp"]  # the apiserver keeps it

    rc, d, err = measured(control_plane, capsys, "--window", "24h", "--node", a, "--node", b, "--node", gate_only)
    assert rc == 0, err
    m = d["measured"]
    assert (m["nodes"], m["slices_total"], m["slices_held_now"], m["claims"]) == (2, 8, 3, 2)
    assert m["slice_hours_held"] == pytest.approx(2 * 6 + 24, abs=0.05)
    assert m["utilization"] == pytest.approx(36 / (8 * 24), abs=1e-3)
    assert d["utilization_source"] == "measured"
    (scenario,) = d["scenarios"]
    assert scenario["utilization"] == pytest.approx(m["utilization"], abs=1e-4)
    assert {h["claim"] for h in m["held"]} == {f"{namespace}/train", f"{namespace}/serve"}

    chart = tmp_path / "measured.svg"  # --plot marks the measured utilization on the chart
    rc, d, err = measured(control_plane, capsys, "--window", "24h", "--node", a, "--node", b, "--plot", str(chart))
    assert rc == 0, err
    svg = chart.read_text()
    assert f"measured utilization {d['measured']['utilization']:.1%}" in svg and "break-even" in svg

    rc, d, err = measured(control_plane, capsys, "--window", "1h", "--node", a)
    assert rc == 0, err
    assert d["measured"]["slice_hours_held"] == pytest.approx(2.0, abs=0.05)
    assert d["measured"]["utilization"] == pytest.approx(0.5, abs=1e-3)


def test_nothing_to_measure_is_exit_1(
    control_plane: ControlPlane, nodes: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = measured(control_plane, capsys, "--node", nodes[2])  # only the gate driver publishes there
    assert rc == 1 and "no GPU nodes" in err
