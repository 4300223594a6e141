"""Operator settings, from flags and environment: one validated object instead of globals."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from capi_gpu.provisioning import chartref
from capi_gpu.provisioning.model import Timing


class PodPolicy(StrEnum):
    """Which pending pods the claim-aware scaler counts as demand."""

    ALL = "all"  # no cluster-autoscaler in this cluster: every pending pod
    CA_DECLINED = "ca-declined"  # only pods cluster-autoscaler declined (NotTriggerScaleUp)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str | None = None
    """Watch only this namespace (clusterctl always installs cluster-wide)."""
    watch_filter: str | None = None
    """Only objects labelled cluster.x-k8s.io/watch-filter=<value>."""
    robot_url: str | None = None
    """Robot webservice URL (--robot-url) for every account; https://robot-ws.your-server.de when unset.
    Endpoints come from the operator's flags only: no object can point credentials elsewhere."""
    hcloud_endpoint: str | None = None
    """hcloud API endpoint (--hcloud-endpoint); https://api.hetzner.cloud/v1 when unset."""
    robot_share: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Share of the Robot account's hourly budget this deployment may use."""
    timing_scale: Annotated[float, Field(gt=0)] = 1.0
    """Divide every provisioning timeout by this (only for time-compressed simulations)."""
    provisioning_limit: Annotated[int, Field(ge=1)] = 20
    """Hosts inspecting/provisioning at once (Metal3's PROVISIONING_LIMIT)."""
    ansible_parallel: Annotated[int, Field(ge=1)] = 10
    """ansible-playbook runs at once; a host beyond it waits in Configure, keeping its provisioning slot.
    Each run is a process of ~100 MiB at peak, mostly waiting on its host; where the hosts' work shares
    the operator's CPUs (the simulator), more runs than CPUs only make every run finish later."""
    ansible_timeout_s: Annotated[int, Field(ge=60)] = 3600
    """The longest one ansible-playbook run may last: the runner kills it then. A host moved mid-run waits
    at most this long for the run its old management cluster started (``provisioning.handover``)."""
    artifacts_dir: Path = Path("/var/lib/capi-gpu/artifacts")
    """Ansible artifacts, kept per host and run."""
    playbook_dir: Path | None = None
    """playbooks/ location; the packaged one when unset."""
    playbook_overrides: dict[str, Any] = {}
    """Extra PlaybookVars fields (apt repositories of a mirror or the simulator)."""
    ssh_connect_timeout: float = 5.0
    gate: bool = True
    """Run the node/machine/claim readiness gate."""
    claim_scaler: bool = False
    """Run the claim-aware scaler for MachineDeployments it owns."""
    claim_scaler_pods: PodPolicy = PodPolicy.ALL
    """Which pending pods the claim scaler takes: all, or (next to cluster-autoscaler) only those CA declined."""
    claim_scaler_ca_grace: Annotated[float, Field(ge=0)] = 0.0
    """Seconds a CA decline must stand before the claim scaler takes the pod (CA declines while its group's
    node is under a minute old, then scales from it)."""
    template_sync_annotations: bool = False
    """Keep cluster-autoscaler capacity annotations on MachineDeployments in sync with templates."""
    addons: bool = True
    """Install each workload cluster's DRA add-ons (NVIDIA's chart, the gate driver, claim templates)."""
    addons_chart: str | None = None
    """Default location of the dra-driver-nvidia-gpu chart (a mirror, or an archive path); its registry if unset."""
    addons_chart_registries: tuple[str, ...] = chartref.DEFAULT_REGISTRIES
    """Registries (host or host:port) a cluster's chartRef may name as oci://; anything else is refused."""
    helm: str = "helm"
    """The helm binary the add-ons playbook runs."""
    gate_plugin_image: str = ""
    """Image of the gate driver's kubelet plugin; the manifest's when empty."""

    @property
    def chart_policy(self) -> chartref.Policy:
        """Which chartRef a cluster may ask for (``provisioning.chartref``), from the add-ons flags."""
        return chartref.Policy(self.addons_chart_registries, self.addons_chart)

    webhook_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Port of the validating webhook (HTTPS); 0: no webhook server (config/webhook points at 9443)."""
    webhook_address: str = "0.0.0.0"
    """Address the webhook listens on."""
    webhook_cert_dir: Path = Path("/tmp/k8s-webhook-server/serving-certs")
    """tls.crt and tls.key of the webhook's serving certificate (cert-manager's Secret, mounted)."""

    @staticmethod
    def endpoint_problem(url: str, allow_plain_http: bool) -> str | None:
        """Why ``url`` may not receive credentials, or None: https always, http only with the explicit test
        flag (``--allow-plain-http``, for the simulators on loopback)."""
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme == "https" or (scheme == "http" and allow_plain_http):
            return None
        if scheme == "http":
            return f"{url}: plain http would send credentials in clear (--allow-plain-http is for tests only)"
        return f"{url}: not an https URL"

    @property
    def timing(self) -> Timing:
        return Timing().scaled(self.timing_scale) if self.timing_scale != 1.0 else Timing()

    @classmethod
    def load_overrides(cls, path: Path | None) -> dict[str, Any]:
        if path is None:
            return {}
        doc = yaml.safe_load(path.read_text()) or {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: playbook overrides must be a mapping")
        return doc
