"""The ``mig_mode`` / ``mig_devices`` part of ``nvidia-smi -q -x``, read even from damaged documents.

``-q -x`` is the one nvidia-smi output that reports MIG mode and the MIG devices in one place, per
GPU. Copies of it travel through logs, support tickets and tool docstrings, and the published sample
we test against is not well-formed (a ``</mig_devices>`` is missing). So there are two modes:

* ``strict=True``: any XML error raises :class:`~capi_gpu.gpu.nvidia_smi.NvidiaSmiParseError` naming
  the position, for callers that must not guess;
* default: a well-formed document is parsed as is; otherwise the tag structure is repaired the way
  HTML parsers recover (a closing tag closes the unclosed elements inside it; ``mig_devices`` holds
  only ``mig_device`` elements), the result says ``repaired=True`` with the original error, and only
  then does parsing fail, with both errors in the message.

Text in, values out.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from capi_gpu.gpu import nvidia_smi

# A container that may only hold one kind of child: another start tag inside it closes it first.
_ONLY_CHILD = {"mig_devices": "mig_device"}
_TAG = re.compile(r"<(/?)([A-Za-z_][\w.:-]*)((?:\s+[^<>]*?)?)(/?)>")


@dataclass(frozen=True, slots=True)
class XmlMigDevice:
    index: int
    gpu_instance_id: int
    compute_instance_id: int
    multiprocessors: int | None
    copy_engines: int | None
    encoders: int | None
    decoders: int | None
    ofa: int | None
    jpeg: int | None
    memory_total_mib: int | None


@dataclass(frozen=True, slots=True)
class XmlGpu:
    bus_id: str | None
    product_name: str | None
    uuid: str | None
    pci_device_id: int | None
    minor: int | None  # <minor_number>: /dev/nvidia<minor>, what the DRA driver names devices after
    mig_current: nvidia_smi.MigMode | None
    mig_pending: nvidia_smi.MigMode | None
    mig_devices: tuple[XmlMigDevice, ...]


@dataclass(frozen=True, slots=True)
class XmlReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[XmlGpu, ...]
    repaired: bool = False
    repair_reason: str | None = None


def _repair(text: str) -> str:
    out: list[str] = []
    stack: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        out.append(text[pos : m.start()])
        pos = m.end()
        closing, name, _attrs, selfclosing = m[1], m[2], m[3], m[4]
        if closing:
            if name not in stack:
                continue  # a stray close tag: drop it
            while stack[-1] != name:
                out.append(f"</{stack.pop()}>")
            stack.pop()
            out.append(m[0])
            continue
        if stack and stack[-1] in _ONLY_CHILD and name != _ONLY_CHILD[stack[-1]]:
            out.append(f"</{stack.pop()}>")
        out.append(m[0])
        if not selfclosing:
            stack.append(name)
    out.append(text[pos:])
    out.extend(f"</{name}>" for name in reversed(stack))
    return "".join(out)


def parse_query_xml(text: str, *, strict: bool = False) -> XmlReport:
    """Parse ``nvidia-smi -q -x``; see the module docstring for ``strict``."""
    try:
        root = ET.fromstring(text)
        repaired, reason = False, None
    except ET.ParseError as exc:
        message = f"nvidia-smi -q -x output is not well-formed XML ({exc})"
        if strict:
            raise nvidia_smi.NvidiaSmiParseError(message) from exc
        try:
            root = ET.fromstring(_repair(text))
        except ET.ParseError as again:
            raise nvidia_smi.NvidiaSmiParseError(f"{message}; repairing the tags failed too ({again})") from exc
        repaired, reason = True, message
    if root.tag != "nvidia_smi_log":
        raise nvidia_smi.NvidiaSmiParseError(f"nvidia-smi -q -x: root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus = tuple(_gpu(g) for g in root.findall("gpu"))
    return XmlReport(_text(root, "driver_version"), _text(root, "cuda_version"), gpus, repaired, reason)


def _text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ("", "N/A") else value


def _int(node: ET.Element, path: str) -> int | None:
    value = _text(node, path)
    if value is None:
        return None
    m = re.match(r"\d+", value)
    if m is None:
        raise nvidia_smi.NvidiaSmiParseError(f"nvidia-smi -q -x: <{path}> is {value!r}, not a number")
    return int(m[0])


def _mode(node: ET.Element, path: str) -> nvidia_smi.MigMode | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    return nvidia_smi.parse_mig_mode(found.text)


def _gpu(node: ET.Element) -> XmlGpu:
    dev_id = _text(node, "pci/pci_device_id")
    devices = node.find("mig_devices")
    entries = [] if devices is None else devices.findall("mig_device")
    return XmlGpu(
        bus_id=node.get("id"),
        product_name=_text(node, "product_name"),
        uuid=_text(node, "uuid"),
        pci_device_id=None if dev_id is None else int(dev_id, 16) >> 16,
        minor=_int(node, "minor_number"),
        mig_current=_mode(node, "mig_mode/current_mig"),
        mig_pending=_mode(node, "mig_mode/pending_mig"),
        mig_devices=tuple(_mig_device(d) for d in entries),
    )


def _mig_device(node: ET.Element) -> XmlMigDevice:
    index, gi, ci = _int(node, "index"), _int(node, "gpu_instance_id"), _int(node, "compute_instance_id")
    if index is None or gi is None or ci is None:
        raise nvidia_smi.NvidiaSmiParseError(
            "nvidia-smi -q -x: a <mig_device> lacks <index>, <gpu_instance_id> or <compute_instance_id>"
        )
    shared = "device_attributes/shared/"
    return XmlMigDevice(
        index=index,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        multiprocessors=_int(node, shared + "multiprocessor_count"),
        copy_engines=_int(node, shared + "copy_engine_count"),
        encoders=_int(node, shared + "encoder_count"),
        decoders=_int(node, shared + "decoder_count"),
        ofa=_int(node, shared + "ofa_count"),
        jpeg=_int(node, shared + "jpg_count"),
        memory_total_mib=_int(node, "fb_memory_usage/total"),
    )
