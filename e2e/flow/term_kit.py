"""A real terminal for tests: a private tmux server, pane captures, and a PNG of what the pane showed.

tmux gives the command a pty (so rich sees a terminal and draws in place) and keeps the screen and its
scroll-back, which is what the live-view test counts. The server runs on a socket under the test's own
directory and is killed by that socket only, never by name. ``pane_png`` draws a captured pane
(with its colours, ``capture-pane -e``) with matplotlib, so the docs' screenshot is made by the same
tools the test uses.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from matplotlib.figure import Figure
from rich.color import Color
from rich.style import Style
from rich.text import Text

FONT = "DejaVu Sans Mono"
BACKGROUND = (0.08, 0.09, 0.11)
FOREGROUND = (0.86, 0.87, 0.88)


class Tmux:
    def __init__(self, socket: Path, cols: int = 150, rows: int = 45) -> None:
        tmux = shutil.which("tmux")
        assert tmux, "tmux is missing: hack/install-system-deps.sh installs it"
        self.cmd, self.socket, self.cols, self.rows = tmux, socket, cols, rows
        self.session = "live"
        self.rc_file = socket.with_suffix(".rc")

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [self.cmd, "-S", str(self.socket), *args], check=False, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def start(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        # The exit status goes to a file: tmux 3.3 sometimes marks the pane dead without one.
        command = f"{command}; echo $? > {self.rc_file}"
        self._run("-f", "/dev/null", "new-session", "-d", "-s", self.session, "-x", str(self.cols), "-y",
                  str(self.rows), "-c", str(cwd), *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
                  command)  # fmt: skip
        self._run("set-option", "-t", self.session, "remain-on-exit", "on")
        self._run("set-option", "-t", self.session, "history-limit", "5000")

    def capture(self, *, history: bool = True, escapes: bool = False) -> str:
        args = ["capture-pane", "-p", "-t", self.session]
        if history:
            args += ["-S", "-", "-E", "-"]
        if escapes:
            args.append("-e")
        return self._run(*args)

    def exit_status(self) -> int | None:
        """None while the command runs, then its exit status."""
        if self.rc_file.exists() and (text := self.rc_file.read_text().strip()):
            return int(text)
        return None

    def interrupt(self, within: float = 90) -> None:
        """Ctrl-C, then wait for the command to end: killing the server would SIGHUP it, and a program
        that dies without its ``finally`` (dev up) leaves its processes behind."""
        if self._pane_dead():
            return
        self._run("send-keys", "-t", self.session, "C-c")
        deadline = time.monotonic() + within
        while not self._pane_dead() and time.monotonic() < deadline:
            time.sleep(1)

    def _pane_dead(self) -> bool:
        # The pty closes when the last process holding it (the program, not only its shell) is gone.
        return self._run("display-message", "-p", "-t", self.session, "#{pane_dead}").strip() == "1"

    def kill(self) -> None:
        subprocess.run([self.cmd, "-S", str(self.socket), "kill-server"], check=False, capture_output=True, timeout=30)


def _rgb(color: Color | None, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if color is None or color.is_default:
        return default
    t = color.get_truecolor()
    return (t.red / 255, t.green / 255, t.blue / 255)


def pane_png(ansi: str, path: Path, cols: int, title: str = "") -> None:
    """Draw a captured pane (ANSI colours kept) as a terminal screenshot."""
    lines = ansi.rstrip("\n").split("\n")
    size = 11.0  # points; DejaVu Sans Mono advances 0.602 em per cell
    cell_w, cell_h = 0.602 * size / 72, 1.32 * size / 72
    pad = 0.25
    width, height = cols * cell_w + 2 * pad, len(lines) * cell_h + 2 * pad
    fig = Figure(figsize=(width, height), facecolor=BACKGROUND)
    for row, line in enumerate(lines):
        text = Text.from_ansi(line)
        plain = text.plain
        styles: list[Style] = [Style()] * len(plain)
        for span in text.spans:
            style = span.style if isinstance(span.style, Style) else Style.parse(str(span.style))
            for i in range(span.start, min(span.end, len(plain))):
                styles[i] = styles[i] + style
        # One text object per cell: a run drawn as one string drifts off the grid (glyph advances are
        # rounded), and box-drawing borders then no longer line up between rows.
        for col, char in enumerate(plain):
            if char.strip():
                style = styles[col]
                fig.text((pad + col * cell_w) / width, 1 - (pad + row * cell_h) / height, char, fontsize=size,
                         family=FONT, va="top", ha="left", color=_rgb(style.color, FOREGROUND),
                         weight="bold" if style.bold else "normal")  # fmt: skip
    if title:
        fig.suptitle(title, color=FOREGROUND, fontsize=9, x=0.99, y=0.995, ha="right", va="top", family=FONT)
    fig.savefig(path, format="png", dpi=100, facecolor=BACKGROUND)
