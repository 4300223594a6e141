"""The nvidia-mig-parted binary the operator ships to every host, and its checksum.

Why the operator carries it: NVIDIA publishes no checksum for its nvidia-mig-manager ``.deb`` and the
release may not even carry it (mig-parted #335), so the default node install downloads nothing. The image
builds ``nvidia-mig-parted`` from the pinned, vendored source (the Dockerfile's ``mig-parted`` stage, the
same tag and flags as ``hack/build-upstream.sh mp``), and the mig_layout role copies that file to the host
and checks its SHA-256 there before running it, and again at every boot (the boot unit's ExecStartPre).

The checksum the host checks is computed here from the file the operator will copy, once at start-up: the
operator is the trust root for what it ships. Where the build left ``<binary>.sha256`` beside it (the image
and ``build-upstream.sh`` do), a file that no longer matches it stops the operator before any host sees it.
``--mig-parted`` (or ``$CAPI_GPU_MIG_PARTED``) names the file; the default is where the Dockerfile puts it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

DEFAULT_PATH: Final = Path("/opt/capi-gpu/libexec/nvidia-mig-parted")
"""Where the Dockerfile installs it (a test holds the two equal)."""
ENV: Final = "CAPI_GPU_MIG_PARTED"
DEB_ROUTE_KEY: Final = "mig_manager_deb"
"""The PlaybookVars field of the optional .deb route: when the operator's --playbook-vars name a .deb,
no binary is shipped."""


class ShippedBinaryError(RuntimeError):
    """The binary to ship is not the one its build recorded: the operator refuses to start."""


class ShippedBinaryMissing(ShippedBinaryError):
    """There is no binary to ship. The operator still starts (its webhook and gate need none), and a host's
    Configure stops in the role's first step, before any package is installed, with this message's advice."""


def default_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[ENV]) if env.get(ENV) else DEFAULT_PATH


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def overrides(path: Path) -> dict[str, str]:
    """The PlaybookVars fields that make the role copy ``path`` and check it on the host."""
    if not path.is_file():
        raise ShippedBinaryMissing(
            f"nvidia-mig-parted not found at {path}: set --mig-parted (or ${ENV}) to the binary "
            "hack/build-upstream.sh mp builds, or name an nvidia-mig-manager .deb and its sha256 in --playbook-vars"
        )
    actual = sha256_of(path)
    recorded_file = path.with_name(path.name + ".sha256")
    if recorded_file.is_file():
        recorded = recorded_file.read_text().split()[0] if recorded_file.read_text().split() else ""
        if recorded != actual:
            raise ShippedBinaryError(f"{path} has sha256 {actual}, but its build recorded {recorded or 'nothing'}")
    return {"mig_parted": str(path), "mig_parted_sha256": actual}


def with_shipped_binary(playbook_overrides: dict[str, Any], path: Path) -> dict[str, Any]:
    """The operator's --playbook-vars plus the shipped binary, unless they choose the .deb route (or name a
    binary themselves): what they say wins."""
    if playbook_overrides.get(DEB_ROUTE_KEY) or playbook_overrides.get("mig_parted"):
        return dict(playbook_overrides)
    return {**overrides(path), **playbook_overrides}
