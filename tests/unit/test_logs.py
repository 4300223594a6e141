"""Operator logs: secrets redacted from every record (text and JSON), tracebacks included in both formats,
JSON lines parse."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from capi_gpu import logs

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``logs.configure`` sets process-wide state (root handlers, quiet httpx/paramiko loggers); a later test
    in the same process (an xdist worker runs many files) must not inherit it: the Robot redaction test
    needs httpx's DEBUG records."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    noisy = {n: logging.getLogger(n).level for n in ("paramiko.transport", "httpx", "kubernetes.client.rest")}
    yield
    root.handlers[:], root.level = handlers, level
    for name, was in noisy.items():
        logging.getLogger(name).setLevel(was)


def _capture(fmt: str, message: str, *args: object) -> str:
    logs.configure(fmt=fmt)
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    logging.getLogger("capi_gpu.test").info(message, *args)
    return stream.getvalue()


def test_private_keys_and_passwords_never_reach_the_log() -> None:
    out = _capture("text", "ssh failed with %s and password=%s", KEY, "hunter2hunter2")
    assert "b3BlbnNzaC1rZXk" not in out and "hunter2hunter2" not in out
    assert "[redacted private key]" in out and "password=[redacted]" in out


def test_json_lines_carry_level_logger_and_the_redacted_message() -> None:
    doc = json.loads(_capture("json", "token: %s", "abcdef0123456789"))
    assert doc["level"] == "info" and doc["logger"] == "capi_gpu.test"
    assert "abcdef0123456789" not in doc["msg"]


def _capture_traceback(fmt: str) -> str:
    logs.configure(fmt=fmt)
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        raise RuntimeError(f"installimage said password=hunter2hunter2 and {KEY}")
    except RuntimeError:
        logging.getLogger("capi_gpu.test").exception("step failed")
    return stream.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_tracebacks_are_redacted_in_both_formats(fmt: str) -> None:
    out = _capture_traceback(fmt)
    assert "RuntimeError" in out  # the traceback itself is kept
    assert "hunter2hunter2" not in out and "b3BlbnNzaC1rZXk" not in out
