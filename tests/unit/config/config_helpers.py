"""Helpers of the manifest tests: the kustomize and clusterctl binaries, rendered components, template text.

kustomize and clusterctl are the pinned upstream builds (``capi_gpu_sim.binaries``); a missing one is
built, never skipped. They only read files of this repository and never reach the network
(clusterctl's version check is switched off and its config directory is a temporary one).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from capi_gpu_sim import binaries

REPO = binaries.REPO
CONFIG = REPO / "config"
CLUSTERCTL_DIR = CONFIG / "clusterctl"
TEMPLATES = {
    "default": CLUSTERCTL_DIR / "cluster-template.yaml",
    "dev": CLUSTERCTL_DIR / "cluster-template-dev.yaml",
    "gpu-workers": CLUSTERCTL_DIR / "cluster-template-gpu-workers.yaml",
}
DOCS = REPO / "docs" / "clusterctl.md"

# drone/envsubst, as clusterctl uses it: ${VAR} and ${VAR<op>default}; a bare $VAR is a variable too.
VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[=-])([^}]*))?\}")
BARE_VAR_RE = re.compile(r"\$[A-Za-z_]")


def kustomize() -> Path:
    path = binaries.locate().kustomize
    return path if path.exists() else binaries.ensure_built().kustomize


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(kustomize()), "build", "--load-restrictor", "LoadRestrictionsNone", str(directory)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def clusterctl_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "CLUSTERCTL_"))}
    env.update(
        {
            "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
            "XDG_CONFIG_HOME": str(tmp / "xdg"),
            "HOME": str(tmp / "home"),
        }
    )
    env.update(extra or {})
    return env


def clusterctl(args: list[str], tmp: Path, env: Mapping[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(binaries.ensure_clusterctl()), *args],
        capture_output=True,
        text=True,
        env=clusterctl_env(tmp, env),
        check=False,
    )
    assert proc.returncode == 0, f"clusterctl {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def template_variables(text: str) -> dict[str, set[str | None]]:
    """Variable -> the defaults it is given (None: no default) across all its occurrences."""
    found: dict[str, set[str | None]] = {}
    for m in VAR_RE.finditer(text):
        found.setdefault(m.group(1), set()).add(m.group(3) if m.group(2) else None)
    return found


def header_variables(text: str) -> dict[str, str]:
    """The template's own comment block: ``#   NAME   default   meaning`` -> {NAME: default}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^#   ([A-Z][A-Z0-9_]+)\s{2,}(\S+)\s", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def docs_variables(heading: str) -> dict[str, str]:
    """The table under ``heading`` in docs/clusterctl.md: ``| `NAME` | default | meaning |``."""
    section = DOCS.read_text().split(heading, 1)[1].split("\n#", 1)[0]
    out = {}
    for m in re.finditer(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]+?) \|", section, re.M):
        out[m.group(1)] = m.group(2).strip().strip("`")
    return out


def substitute(text: str, values: Mapping[str, str]) -> str:
    return VAR_RE.sub(lambda m: values[m.group(1)], text)
