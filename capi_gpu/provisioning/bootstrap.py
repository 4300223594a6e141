"""CAPI bootstrap data: checked before anything is touched, delivered as a NoCloud seed, run on demand.

The contract only guarantees the Secret key ``value``; CABPK writes cloud-config (``format``). We accept
cloud-config (``#cloud-config`` YAML mapping) and shell scripts (``#!``), and refuse anything else with
a reason a user can act on, before a host is claimed, so malformed data never resets or wipes a server.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from enum import StrEnum

import yaml

from capi_gpu.provisioning.installimage import CLOUD_INIT_DISABLED, SEED_DIR

START = (
    f"rm -f {CLOUD_INIT_DISABLED}; "
    "(cloud-init init && cloud-init modules --mode=config && cloud-init modules --mode=final) "
    ">/var/log/capi-gpu-bootstrap.log 2>&1 </dev/null &"
)


JINJA_HEADER = "## template: jinja"
_JINJA_EXPR = re.compile(r"\{\{.*?\}\}|\{%.*?%\}")


class Problem(StrEnum):
    MISSING = "BootstrapDataMissing"
    EMPTY = "BootstrapDataEmpty"
    NOT_UTF8 = "BootstrapDataNotText"
    UNSUPPORTED_FORMAT = "BootstrapFormatUnsupported"
    MALFORMED = "BootstrapDataMalformed"


@dataclass(frozen=True)
class BootstrapData:
    text: str
    format: str


class BootstrapError(ValueError):
    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def decode_secret(data: dict[str, str] | None) -> BootstrapData:
    """From a Secret's base64 ``data``. The message never quotes the content."""
    if not data or "value" not in data:
        raise BootstrapError(Problem.MISSING, "bootstrap Secret has no key 'value'")
    try:
        raw = base64.b64decode(data["value"], validate=True)
        fmt = base64.b64decode(data.get("format", ""), validate=True).decode() or "cloud-config"
    except (binascii.Error, ValueError) as exc:
        raise BootstrapError(Problem.MALFORMED, "bootstrap Secret 'value' is not valid base64") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BootstrapError(Problem.NOT_UTF8, "bootstrap data is not UTF-8 text") from exc
    return validate(text, fmt)


def validate(text: str, fmt: str = "cloud-config") -> BootstrapData:
    if not text.strip():
        raise BootstrapError(Problem.EMPTY, "bootstrap data is empty")
    if fmt not in ("cloud-config", ""):
        raise BootstrapError(
            Problem.UNSUPPORTED_FORMAT, f"bootstrap format {fmt!r} is not supported (cloud-config only)"
        )
    body = text.split("\n", 1)[1] if text.startswith(JINJA_HEADER) else text  # CABPK's jinja templates
    if body.startswith("#!"):
        return BootstrapData(text, "script")
    if not body.startswith("#cloud-config"):
        raise BootstrapError(Problem.MALFORMED, "bootstrap data is neither '#cloud-config' nor a '#!' script")
    try:
        doc = yaml.safe_load(_JINJA_EXPR.sub("x", body))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BootstrapError(Problem.MALFORMED, f"bootstrap cloud-config is not valid YAML{where}") from None
    if doc is not None and not isinstance(doc, dict):
        raise BootstrapError(Problem.MALFORMED, "bootstrap cloud-config is not a mapping")
    for key, kind in (("runcmd", list), ("write_files", list)):
        if doc and key in doc and not isinstance(doc[key], kind):
            raise BootstrapError(Problem.MALFORMED, f"bootstrap cloud-config '{key}' must be a list")
    return BootstrapData(text, "cloud-config")


def seed_paths() -> tuple[str, str]:
    return f"{SEED_DIR}/user-data", f"{SEED_DIR}/meta-data"
