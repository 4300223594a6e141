"""clusterctl-style variable substitution (drone/envsubst's ``${VAR}``, ``${VAR:=default}``,
``${VAR:-default}``), so dev and e2e apply the very templates users get, not copies of them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from capi_gpu_sim import binaries

VAR = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::([=-])([^}]*))?\}")
TEMPLATES = binaries.REPO / "config" / "clusterctl"


class MissingVariable(KeyError):
    pass


def substitute(text: str, values: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3)
        if name in values and values[name] != "":
            return values[name]
        if op is not None:
            return default or ""
        raise MissingVariable(name)

    return VAR.sub(sub, text)


def variables(text: str) -> set[str]:
    return {m.group(1) for m in VAR.finditer(text)}


def render(path: Path, values: Mapping[str, str]) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(substitute(path.read_text(), values)) if d]
