"""Which ``spec.addons.draDriver.chartRef`` the operator will fetch: the allow-list both admission and the
cluster controller apply.

Why a list and not "any string": helm fetches the chart as the operator, from wherever the reference
points (a file path inside the operator's container, an HTTP URL to 169.254.169.254, a registry the
tenant runs), and installs what it gets into the workload cluster with cluster-admin. So a tenant may
only choose among what the operator already trusts: an ``oci://`` repository on a registry named by the
operator's ``--addons-chart-registry`` flags, or exactly the operator's own chart (``--addons-chart``,
e.g. the archive bundled in its image). Unset always means the operator's chart.

Pure: the webhook and ``controllers.cluster_addons`` pass the policy built from the operator's settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

DEFAULT_REGISTRIES: Final = ("registry.k8s.io",)
"""Where NVIDIA's dra-driver-nvidia-gpu chart is published."""
# OCI distribution's repository name grammar (lowercase components separated by / with ._- inside).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_OCI = re.compile(rf"^oci://(?P<registry>[a-z0-9.-]+(?::[0-9]{{1,5}})?)/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)$")
_SHOWN = 120


@dataclass(frozen=True)
class Policy:
    """What the operator's flags allow: registries (host or host:port) and its own chart reference."""

    registries: tuple[str, ...] = DEFAULT_REGISTRIES
    bundled: str | None = None
    """The operator's ``--addons-chart`` (an archive path or a mirror's reference); accepted as is."""


def refusal(ref: str | None, policy: Policy) -> str | None:
    """Why ``ref`` may not be fetched, or None when it may (unset, the operator's chart, an allowed OCI
    repository). The message names what is allowed, so the user can fix the spec from it alone."""
    if ref is None or ref == "" or (policy.bundled is not None and ref == policy.bundled):
        return None
    found = _OCI.match(ref)
    if found is not None and found["registry"] in policy.registries:
        return None
    shown = ref if len(ref) <= _SHOWN else ref[:_SHOWN] + "…"
    why = (
        f"registry {found['registry']} is not one the operator allows"
        if found is not None
        else "not an oci://<registry>/<repository> reference"
    )
    allowed = ", ".join(policy.registries) or "none"
    own = f" or exactly the operator's chart {policy.bundled!r}" if policy.bundled else ""
    return (
        f"chartRef {shown!r}: {why}; allowed: oci:// on {allowed} (the operator's --addons-chart-registry){own}, "
        "or leave chartRef unset for the operator's chart"
    )


DEFAULT_POLICY: Final = Policy()
"""No operator flags: NVIDIA's registry only."""
