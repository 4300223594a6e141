"""No credential goes where a user points it: no CRD of ours carries a URL or an API endpoint (Robot's and
hcloud's come from the operator's flags only), the Robot client of an account is built on the operator's
URL whatever the objects say, and ``capi-gpu run`` takes plain http only with the explicit test flag."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from capi_gpu import cli
from capi_gpu.api import crdgen
from capi_gpu.runtime.deps import RobotClients
from capi_gpu.runtime.settings import Settings

ENDPOINTISH = ("url", "endpoint")
# Fields that are URLs by design, each with why no credential can go there.
RESCUE_FETCHED = (".spec.image.url", ".spec.template.spec.image.url")
"""A baked node image: fetched by the rescue system (curl -q, no config file, no redirect followed), never
by the controller, and with nothing to send: the schema admits no userinfo, no query and no IP literal."""


def _properties(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            yield f"{path}.{name}", sub
            yield from _properties(sub, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from _properties(node[key], f"{path}[]")


def test_no_crd_field_names_a_url_or_an_api_endpoint() -> None:
    found = []
    for name, text in crdgen.render_all().items():
        schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, sub in _properties(schema):
            leaf = path.rsplit(".", 1)[-1].lower()
            # controlPlaneEndpoint is the workload apiserver's host and port, which CAPI reads, not a client target.
            if path in RESCUE_FETCHED:
                continue
            if any(w in leaf for w in ENDPOINTISH) and leaf != "controlplaneendpoint":
                found.append(f"{name}: {path}")
            elif sub.get("type") == "string" and "http" in str(sub.get("pattern", "")):
                found.append(f"{name}: {path} (a URL by its pattern)")
    assert not found, found


class FakeKube:
    async def get_or_none(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "uid": "u", "resourceVersion": "1"},
            "data": {"robot-user": "dXNlcg==", "robot-password": "cGFzc3dvcmQ="},
        }

    async def list(self, res: Any, namespace: str | None = None, **_: Any) -> list[dict[str, Any]]:
        return []


async def test_the_robot_client_uses_the_operators_url_only() -> None:
    assert "url" not in inspect.signature(RobotClients.get).parameters  # nothing an object could pass
    clients = RobotClients(Settings(robot_url="https://robot.mirror.example"))
    client = await clients.get(FakeKube(), "gpu", "robot-credentials")  # type: ignore[arg-type]
    try:
        assert "https://robot.mirror.example" in repr(client)
    finally:
        await clients.close()


@pytest.mark.parametrize(
    ("url", "allow", "ok"),
    [
        ("https://robot-ws.your-server.de", False, True),
        ("http://127.0.0.1:8080", False, False),
        ("http://127.0.0.1:8080", True, True),
        ("ftp://robot", True, False),
        ("robot-ws.your-server.de", False, False),
    ],
)
def test_plain_http_only_with_the_test_flag(url: str, allow: bool, ok: bool) -> None:
    assert (Settings.endpoint_problem(url, allow) is None) is ok


@pytest.mark.parametrize("flag", ["--robot-url", "--hcloud-endpoint"])
def test_run_refuses_an_http_endpoint_without_the_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", flag, "http://127.0.0.1:9", "--metrics-port", "0", "--liveness", ""]) == cli.EXIT_USAGE
    assert "--allow-plain-http" in capsys.readouterr().err
