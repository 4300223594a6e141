"""The property over every field: each string of every spec kind (map keys and list items too) takes each
payload class (Jinja expressions and statements, shell metacharacters and ``$( )``, a newline and YAML,
``../`` paths, URLs to 127.0.0.1 and 169.254.169.254); what admission lets through is driven through every
builder (site.yml and addons.yml extra vars, installimage config, post-install script, cloud-init meta-data,
SSH command lines) and each output must be data; the real add-ons playbook then runs with every payload in
every variable. Pass: no sink rule broken, no marker file, no connection to the loopback listener the URL
payloads name. The table of fields against sinks (docs/security-fields.md) is this sweep's output."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostile
import hostile_sinks as sinks
import pytest
from test_data_is_never_code import REFUSING_KUBECONFIG

from capi_gpu.api import kinds
from capi_gpu.provisioning import addons


class Listener:
    """A loopback port the URL payloads point at; any connection to it is a failure."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lis = Listener()
    yield lis
    lis.close()


@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.kind)
def test_every_string_of_the_model_is_in_a_sample(kind: kinds.Kind) -> None:
    """No field is skipped: a new string field fails here until the samples hold it."""
    missing = [
        leaf
        for leaf in hostile.spec_leaves(kind)
        if not any(hostile.slots(s, leaf) for s in hostile.samples(kind.kind))
    ]
    assert missing == []


@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.kind)
def test_every_sample_is_admitted_and_lands_as_data(kind: kinds.Kind) -> None:
    for sample in hostile.samples(kind.kind):
        out = sinks.drive(kind, sample)
        assert out.refused is None
        assert sinks.problems(out) == []


def test_every_payload_in_every_field_lands_only_as_data(tmp_path: Path, listener: Listener) -> None:
    marker = Path(hostile.MARKER_DIR) / hostile.MARK
    marker.parent.mkdir(exist_ok=True)
    marker.unlink(missing_ok=True)
    rows, addons_outcomes = sinks.sweep(listener.port)
    problems = [p for row in rows.values() for p in row.problems]
    assert problems == []
    # The real add-ons playbook, with every payload in every string variable it takes (admitted or not:
    # this is the line behind admission), and with each admitted object that reached it.
    installer = addons.AnsibleAddons(tmp_path / "runs", helm_binary=str(tmp_path / "no-helm"), timeout_s=120)
    hostile_values = list(hostile.payloads(listener.port).values())
    worst = addons.AddonsRequest(
        chart_ref="\n".join(hostile_values),
        chart_version=hostile_values[0],
        extra_values={v: v for v in hostile_values},
        claim_namespaces=tuple(hostile_values),
        gate_plugin_image=hostile_values[1],
    )
    for request in [worst, *(_request(o) for o in addons_outcomes)]:
        installer.run_blocking("c1", REFUSING_KUBECONFIG, request)
    assert not marker.exists()
    assert listener.connections == 0
    assert sinks.table(rows) == sinks.DOC.read_text(), "run python tests/unit/provisioning/hostile_sinks.py"


def _request(out: Any) -> addons.AddonsRequest:
    raise AssertionError(f"no admitted field reaches addons.yml any more; run it for real here: {out}")


def test_each_sink_rule_catches_a_break() -> None:
    """The checks are not vacuous: the form each sink had before (or could take) is reported."""
    mark = hostile.MARK
    broken = {
        sinks.SITE: json.dumps({"nvidia_driver_branch": "{{ x }}"}),  # the old plain-JSON extravars file
        sinks.ADDONS: json.dumps({"dra_driver_chart_ref": ["{% if 1 %}x{% endif %}"]}),
        sinks.AUTOSETUP: f"IMAGE /x.tar\nDRIVE9 /dev/sda\n{mark} 1\n",
        sinks.POST: f"echo {mark}\n",
        sinks.META: f"instance-id: u-9\nlocal-hostname: gex131-a\nserver_number: 1234567\n{mark}: 1\n",
        sinks.SSH: f"wipefs -a /dev/{mark}",
    }
    for sink, text in broken.items():
        assert len(sinks.problems(sinks.Outcome(outputs={sink: text}))) == 1, sink
