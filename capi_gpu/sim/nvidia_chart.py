"""NVIDIA's DRA driver chart (dra-driver-nvidia-gpu 0.4.1) as the test worlds see it: rendered with the pinned
helm from the unmodified chart archive in ``../shared/upstream`` with capi-gpu's values.

Why render instead of writing the objects by hand: the worlds that bind pods to the shipped claim templates
must meet the chart's own DeviceClasses (their CEL, ``extendedResourceName``), or a template naming a class
the chart does not create, or selecting what its class excludes, would pass here and fail in a cluster.
Pods don't run in the simulated clusters, so only the cluster-scoped classes are taken; the full install
(DaemonSet, RBAC, admission policy) goes through playbooks/addons.yml (tests/integration/test_addons_playbook.py).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from capi_gpu.sim import binaries

CHART = binaries.REPO.parent / "shared" / "upstream" / "dra-driver-nvidia-gpu-0.4.1.tgz"
VALUES = binaries.REPO / "config" / "dra-driver" / "values.yaml"
NAMESPACE = "nvidia-dra-driver-gpu"


@functools.cache
def rendered(chart: Path = CHART) -> tuple[dict[str, Any], ...]:
    """``helm template`` of the chart, as the playbook installs it (release name, namespace, values)."""
    if not chart.exists():
        raise binaries.BinariesMissing(f"the chart archive is missing: {chart} (it comes with ../shared/upstream)")
    version = binaries.versions()["KUBERNETES_VERSION"]
    argv = [str(binaries.ensure_helm()), "template", "nvidia-dra-driver-gpu", str(chart), "-n", NAMESPACE]
    argv += ["-f", str(VALUES), "--kube-version", version]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def device_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses (gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com)."""
    return [d for d in rendered() if d.get("kind") == "DeviceClass"]
