"""Where the real nvidia-smi / lspci / mig-parted outputs live, and how tests read them."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()
