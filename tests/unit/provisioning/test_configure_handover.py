"""Configure's hand-over across a move, from a table: the server's run marker decides who runs it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from capi_gpu.provisioning import handover
from capi_gpu.provisioning.handover import Adopt, Marker, Run, RunState, Wait

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
SOURCE_RUN = handover.run_id(NOW - timedelta(minutes=8))  # recorded on the source, carried by the snapshot
THIS_RUN = handover.run_id(NOW)
ME, SOURCE = "uid-target", "uid-source"
RECORDED = frozenset({SOURCE_RUN, THIS_RUN})


def marker(state: RunState, holder: str = SOURCE, run: str = SOURCE_RUN, left_s: float = 3000) -> Marker:
    return Marker(run, holder, NOW + timedelta(seconds=left_s), state)


CASES = [
    ("no marker: a fresh server", None, RECORDED, Run),
    ("our own run died with our controller (a restart)", marker(RunState.RUNNING, holder=ME), RECORDED, Run),
    ("the source still runs it", marker(RunState.RUNNING), RECORDED, Wait),
    ("the source's run outlived its deadline", marker(RunState.RUNNING, left_s=-1), RECORDED, Run),
    ("the source finished it: adopt", marker(RunState.DONE), RECORDED, Adopt),
    ("the source finished and asks for the MIG reboot: adopt", marker(RunState.REBOOT_NEEDED), RECORDED, Adopt),
    ("the source's run failed: run again", marker(RunState.FAILED), RECORDED, Run),
    ("a finished run this status never recorded: run", marker(RunState.DONE), frozenset({THIS_RUN}), Run),
    ("a run of ours marked by this very run id", marker(RunState.RUNNING, holder=SOURCE, run=THIS_RUN), RECORDED, Run),
    # The source's run began 8 min ago: with a 10 min runner timeout, a far "until" still ends in 2 min...
    ("a far deadline is capped at start + timeout", marker(RunState.RUNNING, left_s=10**7), RECORDED, Wait),
    # ...and one begun longer ago than the timeout is over, whatever its marker says.
    (
        "a run older than the timeout",
        marker(RunState.RUNNING, run=handover.run_id(NOW - timedelta(hours=2))),
        RECORDED,
        Run,
    ),
    ("a run id that is not a time", marker(RunState.RUNNING, run="yesterday"), RECORDED, Run),
]
TIMEOUT_S = 600.0


@pytest.mark.parametrize(("why", "found", "recorded", "want"), CASES, ids=[c[0] for c in CASES])
def test_verdict(why: str, found: Marker | None, recorded: frozenset[str], want: type) -> None:
    got = handover.verdict(found, ME, recorded, THIS_RUN, NOW, TIMEOUT_S)
    assert isinstance(got, want), (why, got)
    if isinstance(got, Adopt):
        assert got.reboot_needed is (found is not None and found.state is RunState.REBOOT_NEEDED)
    if isinstance(got, Wait):
        assert found is not None and "second time" in got.message
        started = datetime.fromisoformat(found.run)
        assert got.until == min(found.until, started + timedelta(seconds=TIMEOUT_S))


def test_marker_round_trip_and_garbage() -> None:
    m = handover.starting(THIS_RUN, ME, NOW, 3600)
    assert handover.parse(handover.render(m)) == m and m.state is RunState.RUNNING
    assert m.until == NOW + timedelta(hours=1)
    for junk in (None, "", "{", "[]", '{"run": 1}', '{"run":"a","holder":"b","until":"x","state":"running"}',
                 '{"run":"a","holder":"b","until":"2026-12-05T10:00:00+00:00","state":"sleeping"}'):  # fmt: skip
        assert handover.parse(junk) is None, junk
