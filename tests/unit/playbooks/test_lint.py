"""The node playbooks pass ansible-lint's production profile and ansible-playbook --syntax-check
(what CI runs), with the tools from this venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_ansible_lint_production_profile_passes() -> None:
    proc = run([str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", "playbooks/"], REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_site_yml_passes_the_syntax_check() -> None:
    proc = run(
        [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,", "site.yml"],
        REPO / "playbooks",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
