"""The GPU shim: stand-in NVIDIA tools for simulated hosts that have no GPU.

Each module here is a standalone script (Python 3.11 stdlib, no ``capi_gpu`` imports) meant to be
installed under its real name inside a simulated host's root filesystem; :data:`SCRIPTS` maps the
installed path to the module. They share state only through files under ``$GPU_SHIM_ROOT`` (default
``/``): knobs and the persistent MIG mode under ``/var/lib/gpu-shim/``, GPU and compute instances
under ``/run/gpu-shim/`` (so they vanish with the host's per-boot ``/run``). ``nvidia-mig-parted``
reaches the GPU only by running ``nvidia-smi``. See each script's docstring for its CLI surface.

``nvidia-ctk`` and ``nvidia-persistenced`` stand-ins live in :mod:`capi_gpu_sim.apt_standins`.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

SCRIPTS = {
    "/usr/bin/nvidia-smi": "nvidia_smi",
    "/usr/bin/nvidia-mig-parted": "nvidia_mig_parted",
}


def script(module: str) -> Traversable:
    """The script file for ``module`` (e.g. ``nvidia_smi``), for packaging or running in tests."""
    node = resources.files(__package__).joinpath(f"{module}.py")
    if not node.is_file():
        raise FileNotFoundError(f"{__package__}/{module}.py is missing")
    return node
