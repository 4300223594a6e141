"""The simulators' subcommands of ``capi-gpu`` (``sim``, ``dev``): found by ``capi_gpu.cli`` in a source
checkout, absent from the wheel and the image, like the rest of ``capi_gpu_sim``.
"""

from __future__ import annotations

import argparse

from capi_gpu_sim.cli import dev, sim


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim.register(sub)
    dev.register(sub)
