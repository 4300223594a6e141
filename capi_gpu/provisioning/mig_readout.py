"""What the host's own nvidia-smi says about its MIG instances after the layout was applied: the profiles
(``-L``) and each GPU instance with the placement NVML chose (``mig -lgi``) and its GPU's minor number
(``-q -x``), from which the NVIDIA DRA driver names its devices. Pure: the texts come from the caller."""

from __future__ import annotations

from capi_gpu.api.host import MigInstance
from capi_gpu.gpu import nvidia_smi, nvidia_smi_xml


def profiles(list_text: str) -> list[str]:
    """``nvidia-smi -L``: the MIG devices' profiles, sorted."""
    return sorted(m.profile for g in nvidia_smi.parse_list(list_text) for m in g.mig_devices)


def instances(xml_text: str, lgi_text: str, expected: list[str]) -> list[MigInstance]:
    """The GPU instances with their placements and minors; empty (names unknown) when a minor is missing or
    ``-lgi`` does not list exactly the profiles ``-L`` showed. Raises ValueError on unreadable output."""
    minors = [g.minor for g in nvidia_smi_xml.parse_query_xml(xml_text).gpus]
    found = [
        MigInstance(
            gpu=r.gpu,
            minor=minors[r.gpu] if r.gpu < len(minors) else None,
            profile=r.profile,
            profile_id=r.profile_id,
            instance_id=r.instance_id,
            placement_start=r.start,
            placement_size=r.size,
        )
        for r in nvidia_smi.parse_lgi(lgi_text)
    ]
    if any(i.minor is None for i in found) or sorted(i.profile for i in found) != expected:
        return []
    return found
