"""The runbooks' `bash` blocks run, top to bottom, against the real apiserver with the real `capi-gpu` and
`kubectl` binaries, so a runbook that drifts from the CLI fails CI; their `sh` blocks (which need the
controller, Robot or a workload cluster) are at least parsed by the CLI's own argument parser, and in the
fleet runbooks each one is either run on the simulated fleet (``<!-- e2e: STEP -->`` above it, see
e2e/flow/test_runbooks_on_world.py) or says, right there, why it is not run in CI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from capi_gpu import cli
from capi_gpu_sim import binaries
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The runbooks written against `capi-gpu hosts`, `cost` and `autoscaler`; add others as they gain bash blocks.
DOCS = (
    "docs/runbooks/register-and-inspect-hosts.md",
    "docs/runbooks/maintenance-and-retire.md",
    "docs/cost.md",
    "docs/autoscaling.md",
    "docs/runbooks/relayout-a-gpu.md",
    "docs/runbooks/reserve-devices-for-a-tenant.md",
    "docs/runbooks/rotate-credentials.md",
    "docs/runbooks/host-stuck-in-reboot.md",
    "docs/runbooks/upgrade-the-driver.md",
)
# Runbooks whose every command needs a live GPU node: no bash block; their sh blocks run on the world.
PARSED_ONLY = ("docs/runbooks/node-never-gpu-ready.md",)
# Runbooks written against the simulated fleet: each sh block is run there or says why not.
FLEET_RUNBOOKS = (
    "docs/runbooks/relayout-a-gpu.md",
    "docs/runbooks/reserve-devices-for-a-tenant.md",
    "docs/runbooks/rotate-credentials.md",
    "docs/runbooks/host-stuck-in-reboot.md",
    "docs/runbooks/upgrade-the-driver.md",
    *PARSED_ONLY,
)
_E2E_MARK = re.compile(r"<!-- e2e: [a-z0-9-]+ -->\n$")
_SAYS_WHY = re.compile(r"not run in CI", re.IGNORECASE)
# "${FLAGS[@]}": an array of optional flags (empty or e.g. --playbook-vars FILE), not a positional argument.
_ARRAY_EXPANSION = re.compile(r"^\$\{\w+\[@\]\}$")
_BLOCK = re.compile(r"^```(?P<lang>bash|sh)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(doc: str, lang: str) -> list[str]:
    return [m["body"] for m in _BLOCK.finditer((REPO / doc).read_text()) if m["lang"] == lang]


def capi_gpu_commands(script: str) -> list[list[str]]:
    """Each `capi-gpu ...` command line of a block (continuations joined, comments and redirections cut)."""
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        if "capi-gpu" not in line:  # other lines may be parts of multi-line strings (heredocs, JSON)
            continue
        words = shlex.split(line, comments=True)
        starts = (i for i, w in enumerate(words) if w == "capi-gpu" and (i == 0 or _ends_command(words[i - 1])))
        for start in starts:
            argv = []
            for w in words[start + 1 :]:
                if w in {"|", "||", "&&", ";", ">", "<"} or w.startswith((">", "<")):
                    break
                argv.append(w)
            commands.append(argv)
    return commands


def _ends_command(word: str) -> bool:
    return word in {"|", "||", "&&", "then", "do"} or word.endswith(";")


@pytest.mark.parametrize("doc", DOCS)
def test_bash_blocks_run_against_the_apiserver(
    doc: str, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    script = blocks(doc, "bash")
    assert script, f"{doc} has no bash block"
    path = os.pathsep.join([str(Path(sys.executable).parent), str(binaries.ensure_built().kubectl.parent),
                            os.environ.get("PATH", "")])  # fmt: skip
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(control_plane.kubeconfig), "NS": namespace,
           "WORK": str(tmp_path), "REPO": str(REPO)}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail -x\n" + "\n".join(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{doc}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("doc", DOCS + PARSED_ONLY)
def test_every_capi_gpu_command_parses(doc: str) -> None:
    parser = cli.build_parser()
    commands = [argv for lang in ("bash", "sh") for b in blocks(doc, lang) for argv in capi_gpu_commands(b)]
    assert commands, f"{doc} shows no capi-gpu command"
    for argv in commands:
        words = [a for a in argv if not _ARRAY_EXPANSION.match(a)]
        try:
            parser.parse_args([re.sub(r"\$\{?(\w+)\}?", r"\1", a) for a in words])
        except SystemExit as exc:  # argparse's way of saying no
            pytest.fail(f"{doc}: `capi-gpu {shlex.join(argv)}` does not parse (exit {exc.code})")


@pytest.mark.parametrize("doc", FLEET_RUNBOOKS)
def test_sh_blocks_run_on_the_world_or_say_why(doc: str) -> None:
    text = (REPO / doc).read_text()
    previous_end = 0
    for m in _BLOCK.finditer(text):
        before = text[previous_end : m.start()]
        previous_end = m.end()
        if m["lang"] != "sh" or _E2E_MARK.search(before):
            continue
        line = text.count("\n", 0, m.start()) + 1
        assert _SAYS_WHY.search(before), (
            f"{doc}:{line}: an sh block neither marked <!-- e2e: STEP --> nor saying why it is not run in CI"
        )
