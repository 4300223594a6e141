"""Which chartRef the operator fetches, from a table: unset, its own chart and oci:// on an allowed registry
pass; paths, http(s) URLs, other registries, ports, credentials, ``..`` and templates are refused with a
message naming what is allowed; the webhook refuses them on clusters and cluster templates; the controller,
for one written while the webhook was off, sets AddonsReady False with an Event and runs nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.controllers import cluster_addons
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import addons, admission, chartref
from capi_gpu.runtime import events
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

API = "infrastructure.cluster.x-k8s.io/v1alpha1"
BUNDLED = "/opt/capi-gpu/charts/dra-driver-nvidia-gpu-0.4.1.tgz"
POLICY = chartref.Policy(("registry.k8s.io", "mirror.example:5000"), BUNDLED)

ALLOWED = [
    None,
    "",
    BUNDLED,
    addons.DEFAULT_CHART_REF,
    "oci://mirror.example:5000/nvidia/dra-driver-nvidia-gpu",
]
REFUSED = [
    "/etc/passwd",
    "/opt/capi-gpu/charts/../../../etc/shadow",
    "file:///var/run/secrets/kubernetes.io/serviceaccount/token",
    "https://registry.k8s.io/chart.tgz",
    "http://169.254.169.254/latest/meta-data/",
    "oci://127.0.0.1:5000/charts/evil",
    "oci://evil.example/dra-driver-nvidia/charts/dra-driver-nvidia-gpu",
    "oci://registry.k8s.io:443/dra-driver-nvidia/charts/x",  # a port the operator did not name
    "oci://registry.k8s.io.evil.example/charts/x",
    "oci://user:pw@registry.k8s.io/charts/x",
    "oci://registry.k8s.io/charts/../x",
    "oci://registry.k8s.io/charts/x?y=1",
    "oci://registry.k8s.io/charts/x\nfoo: bar",
    "oci://registry.k8s.io/{{ lookup('pipe', 'id') }}",
    "repo/dra-driver-nvidia-gpu",
]


@pytest.mark.parametrize("ref", ALLOWED)
def test_allowed(ref: str | None) -> None:
    assert chartref.refusal(ref, POLICY) is None


@pytest.mark.parametrize("ref", REFUSED)
def test_refused_with_what_is_allowed(ref: str) -> None:
    why = chartref.refusal(ref, POLICY)
    assert why is not None
    assert "registry.k8s.io, mirror.example:5000" in why and BUNDLED in why


def test_the_default_policy_allows_only_the_charts_registry() -> None:
    assert chartref.refusal(addons.DEFAULT_CHART_REF, chartref.Policy()) is None
    assert chartref.refusal(BUNDLED, chartref.Policy()) is not None


def cluster(chart_ref: str, template: bool = False) -> dict[str, Any]:
    spec = {
        "robotCredentials": {"name": "robot"},
        "sshKeys": {"rescue": {"name": "ssh"}},
        "addons": {"draDriver": {"chartRef": chart_ref}},
    }
    if template:
        return {
            "apiVersion": API,
            "kind": "HetznerGPUClusterTemplate",
            "metadata": {"name": "t"},
            "spec": {"template": {"spec": spec}},
        }
    return {"apiVersion": API, "kind": "HetznerGPUCluster", "metadata": {"name": "c"}, "spec": spec}


@pytest.mark.parametrize("template", [False, True])
def test_the_webhook_refuses_a_chart_ref_outside_the_list(template: bool) -> None:
    kind = "HetznerGPUClusterTemplate" if template else "HetznerGPUCluster"
    cat = catalog.builtin_catalog()
    [found] = admission.refusals(kind, cluster("oci://evil.example/x", template), [], cat, POLICY)
    assert found.reason == c.Reason.CHART_REF_NOT_ALLOWED
    assert found.field.endswith("addons.draDriver.chartRef")
    assert "registry evil.example is not one the operator allows" in found.message
    assert admission.refusals(kind, cluster(addons.DEFAULT_CHART_REF, template), [], cat, POLICY) == []


class Never:
    playbook_dir = addons.default_playbook_dir()

    async def install(self, cluster: str, kubeconfig: str, request: addons.AddonsRequest) -> addons.AddonsOutcome:
        raise AssertionError("a refused chartRef must run nothing")


async def test_the_controller_refuses_with_a_condition_and_one_event(monkeypatch: pytest.MonkeyPatch) -> None:
    emitted: list[tuple[str, str, bool]] = []
    monkeypatch.setattr(
        events, "emit", lambda _o, reason, msg, warning=False, **_: emitted.append((reason, msg, warning))
    )
    settings = Settings()
    deps = Deps(None, settings, None, RobotClients(settings))  # type: ignore[arg-type]
    deps.addons = Never()
    deps.clock = lambda: datetime(2026, 12, 5, tzinfo=UTC)
    obj = cluster("/var/run/secrets/kubernetes.io/serviceaccount/token") | {
        "metadata": {"name": "c", "namespace": "a", "generation": 2}
    }
    hgc = HetznerGPUCluster.model_validate(obj)
    phase = await cluster_addons.reconcile(deps, hgc, obj, "c")
    cond = c.get(phase.conditions, c.Type.ADDONS_READY)
    assert cond is not None and (cond.status, cond.reason) == ("False", c.Reason.CHART_REF_NOT_ALLOWED)
    assert phase.requeue is None and phase.status == hgc.status.addons
    assert [(r, w) for r, _m, w in emitted] == [("ChartRefNotAllowed", True)]
    # The next pass with the same spec says it once only.
    again = HetznerGPUCluster.model_validate(obj | {"status": {"conditions": [cond.model_dump(by_alias=True)]}})
    await cluster_addons.reconcile(deps, again, obj, "c")
    assert len(emitted) == 1
