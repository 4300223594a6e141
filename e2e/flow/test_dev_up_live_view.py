"""`capi-gpu dev up` on a real terminal (tmux): the host table is drawn once and updated in place while hosts
change state (one table header in the whole scroll-back, line count bounded), the bar and GPUReady reach the
end, the summary follows; the pane is saved as a PNG (docs/images/dev-up-live.png when CAPI_GPU_SCREENSHOTS
names a folder)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from term_kit import Tmux, pane_png

REPO = Path(__file__).resolve().parents[2]
HEADER = re.compile(r"┃ HOST\s+┃ STATE\s+┃")
ROW = re.compile(r"^│ (\S+)\s+│ (\w+)\s+│ (\S+)\s+│")
DEADLINE_S = 600
COLS, ROWS = 150, 45


def _lines(capture: str) -> list[str]:
    return capture.rstrip("\n").rstrip().split("\n")


def test_dev_up_redraws_one_table_in_place(tmp_path: Path) -> None:
    tmux = Tmux(tmp_path / "tmux.sock", COLS, ROWS)
    state = tmp_path / "dev"
    cmd = f"{sys.executable} -m capi_gpu.cli dev up --exit --hosts 2 --replicas 1 --state-dir {state}"
    started = time.monotonic()
    tmux.start(cmd, REPO, {"PYTHONUNBUFFERED": "1", "COLUMNS": str(COLS)})
    seen: dict[tuple[tuple[str, str, str], ...], int] = {}  # host (name, state, step) rows -> line count then
    shot = ""
    try:
        while time.monotonic() - started < DEADLINE_S and tmux.exit_status() is None:
            capture = tmux.capture()
            if "claim bound after" not in capture and HEADER.search(capture):
                rows = tuple(m.groups() for line in _lines(capture) if (m := ROW.match(line)))
                assert len(HEADER.findall(capture)) == 1, capture  # redrawn, never reprinted
                if rows and rows not in seen:
                    seen[rows] = len(_lines(capture))
                    if any(s == "Provisioning" for _, s, _ in rows):
                        shot = tmux.capture(escapes=True)
            time.sleep(1.0)
        status, final = tmux.exit_status(), tmux.capture()
        took = time.monotonic() - started
    finally:
        tmux.interrupt()  # only if still running (a failed assertion, the deadline): dev up tears down
        tmux.kill()
    assert status == 0, final
    print(f"dev up on a terminal: {took:.0f}s, {len(seen)} distinct tables captured")
    # The acceptance: captures taken while the hosts changed state, each with one table in the whole
    # scroll-back, and the screen's line count stays bounded (the old output grew ~5 lines per change).
    assert len(seen) >= 3, seen
    counts = list(seen.values())
    assert max(counts) <= min(counts) + 8, seen  # only the Events block under the table may grow (6 lines)
    assert max(counts) < ROWS, seen
    states = {s for rows in seen for _, s, _ in rows}
    assert {"Available", "Provisioning"} <= states, states
    steps = {step for rows in seen for _, s, step in rows if s == "Provisioning"}
    assert len(steps) >= 3, steps  # Rescue ... Bootstrap went by in the same table
    # After the flow: the last frame (Provisioned, 8/8, GPUReady True) stays, the summary follows it.
    assert len(HEADER.findall(final)) == 1
    assert re.search(r"│ \S+\s+│ Provisioned\s+│.*8/8.*│ True", final), final
    assert "claim bound after" in final and "time per step:" in final
    assert final.index("claim bound after") > final.index("last events:")
    assert shot
    png = tmp_path / "dev-up-live.png"
    pane_png("\n".join(_lines(shot)), png, COLS, "capi-gpu dev up --hosts 2 --replicas 1 (tmux)")
    assert png.read_bytes()[:4] == b"\x89PNG"
    if folder := os.environ.get("CAPI_GPU_SCREENSHOTS"):
        Path(folder, png.name).write_bytes(png.read_bytes())
