"""Rewrite hack/test-durations.json (seconds per test file, which conftest.py runs heaviest first) from a
JUnit report of a full run: ``PYTEST_ADDOPTS=--junitxml=/tmp/run.xml make test``, then
``python hack/test-durations.py /tmp/run.xml``. A test's time in the report is its setup, call and
teardown together (pytest's junit_duration_report default)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "hack" / "test-durations.json"


def file_of(classname: str) -> str | None:
    """``e2e.flow.test_x`` or ``tests.unit.test_y.TestZ`` -> the test file's path, relative to the root."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (ROOT / path).is_file():
            return path.as_posix()
    return None


def main(report: str) -> None:
    totals: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = file_of(case.get("classname", ""))
        if path is not None:
            totals[path] = totals.get(path, 0.0) + float(case.get("time", "0"))
    ordered = dict(sorted(((p, round(s, 1)) for p, s in totals.items()), key=lambda kv: (-kv[1], kv[0])))
    OUT.write_text(json.dumps(ordered, indent=0) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(ordered)} files, {sum(ordered.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1])
