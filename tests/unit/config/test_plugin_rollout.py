"""A chart upgrade restarts the NVIDIA kubelet plugin one GPU node at a time: the pinned chart rendered by
helm with the shipped values (a hand install) and with the values the operator adds from
``spec.addons.draDriver.pluginMaxUnavailable`` (default, a count, a percentage) gives the kubelet-plugin
DaemonSet that rolling update, where the chart alone says 100%; a value that is neither is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from capi_gpu.api.cluster import DRADriverAddon
from capi_gpu.controllers import cluster_addons
from capi_gpu_sim import binaries

CHART = binaries.REPO.parent / "shared" / "upstream" / "dra-driver-nvidia-gpu-0.4.1.tgz"
VALUES = binaries.REPO / "config" / "dra-driver" / "values.yaml"
PLUGIN = "dra-driver-nvidia-gpu-kubelet-plugin"


def _rendered_strategy(tmp_path: Path, *values: Path) -> dict[str, Any]:
    """The kubelet-plugin DaemonSet's updateStrategy as helm renders the chart; later -f files win,
    merged key by key as the add-ons playbook's ``combine(recursive=true)`` does."""
    helm = binaries.helm_path()
    if not helm.exists():
        helm = binaries.ensure_helm()
    args = [str(helm), "template", "nvidia-dra-driver-gpu", str(CHART), "--namespace", "nvidia-dra-driver-gpu"]
    args += ["--kube-version", binaries.versions()["KUBERNETES_VERSION"]]
    for v in values:
        args += ["-f", str(v)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path).stdout
    ds = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == PLUGIN)
    return dict(ds["spec"]["updateStrategy"])


def _extra(tmp_path: Path, spec: DRADriverAddon) -> Path:
    path = tmp_path / "extra.yaml"
    path.write_text(yaml.safe_dump(cluster_addons.plugin_rollout(spec.plugin_max_unavailable)))
    return path


def test_the_chart_alone_restarts_every_node_at_once(tmp_path: Path) -> None:
    guard = tmp_path / "guard.yaml"  # the one value the chart refuses to render without
    guard.write_text(yaml.safe_dump({"gpuResourcesEnabledOverride": True}))
    assert _rendered_strategy(tmp_path, guard)["rollingUpdate"]["maxUnavailable"] == "100%"  # why we override it


def test_the_shipped_values_roll_one_node_at_a_time(tmp_path: Path) -> None:
    assert _rendered_strategy(tmp_path, VALUES) == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [({}, 1), ({"pluginMaxUnavailable": "2"}, 2), ({"pluginMaxUnavailable": "25%"}, "25%")],
    ids=["default", "count", "percentage"],
)
def test_the_operators_values_set_the_rollout(tmp_path: Path, spec: dict[str, str], expected: int | str) -> None:
    addon = DRADriverAddon.model_validate(spec)
    strategy = _rendered_strategy(tmp_path, VALUES, _extra(tmp_path, addon))
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": expected}}


@pytest.mark.parametrize("bad", ["0", "0%", "101%", "-1", "one", "1.5", "25 %", ""])
def test_a_value_that_is_no_count_or_percentage_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match=r"pluginMaxUnavailable|plugin_max_unavailable"):
        DRADriverAddon.model_validate({"pluginMaxUnavailable": bad})
