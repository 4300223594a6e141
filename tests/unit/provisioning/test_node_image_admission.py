"""spec.image (a baked node image, docs/node-images.md): the URL and sha256 shapes the schema admits, and
the shipped webhook admitting a spec that sets it (the Install step installs from it; what the image fits
is checked in rescue from its manifest, which admission cannot see)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from capi_gpu.api.machine import HetznerGPUMachineTemplate
from capi_gpu.api.specs import ImageFallback, NodeImageSpec
from capi_gpu.controllers import webhook
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import admission

CAT = catalog.builtin_catalog()
API = "infrastructure.cluster.x-k8s.io/v1alpha1"
SHA = "ab" * 32
URL = "https://images.example.com/gpu/rtx-pro-6000-580-v1.36.tar.zst"


def template(image: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpu": {"model": "rtx-pro-6000"}} | ({"image": image} if image else {})
    return {
        "apiVersion": API,
        "kind": "HetznerGPUMachineTemplate",
        "metadata": {"name": "t"},
        "spec": {"template": {"spec": spec}},
    }


@pytest.mark.parametrize(
    "url",
    [
        URL,
        "https://images.example.com:8443/a/b/node.tgz",
        "/srv/images/node-580.tar.zst",  # a path in the rescue system (the simulator, an NFS share)
        "/root/.oldroot/nfs/images/node.tar",  # Hetzner's rescue NFS share
    ],
)
def test_an_https_url_on_a_dns_name_or_an_absolute_path_is_admitted(url: str) -> None:
    assert NodeImageSpec(url=url, sha256=SHA).fallback is ImageFallback.FAIL


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://images.example.com/node.tar.zst", "plain http: the archive could be swapped in transit"),
        ("https://user:secret@images.example.com/node.tar.zst", "credentials in the URL"),
        ("https://images.example.com/node.tar.zst?X-Amz-Signature=abc", "a signed token in the query"),
        ("https://127.0.0.1/node.tar.zst", "an IP literal (loopback)"),
        ("https://169.254.169.254/latest/node.tar.zst", "an IP literal (metadata)"),
        ("https://localhost/node.tar.zst", "a name without a domain"),
        ("/srv/images/../../etc/node.tar.zst", "a .. segment"),
        ("/srv/images/./node.tar.zst", "a . segment"),
        ("/srv/images/.../node.tar.zst", "a segment of dots"),
        ("images/node.tar.zst", "a relative path"),
        ("https://images.example.com/node.iso", "not an archive installimage takes"),
        ("/srv/images/node.tar.zst\nIMAGE /x.tar", "a newline"),
        ("/srv/images/node $(id).tar.zst", "whitespace and shell"),
        ("file:///srv/images/node.tar.zst", "another scheme"),
    ],
)
def test_the_schema_refuses_urls_that_could_leak_or_escape(url: str, why: str) -> None:
    with pytest.raises(ValidationError):
        NodeImageSpec(url=url, sha256=SHA)


@pytest.mark.parametrize("sha", ["", "AB" * 32, "ab" * 31, "ab" * 33, "g" * 64, "sha256:" + "ab" * 32])
def test_sha256_is_64_lower_case_hex(sha: str) -> None:
    with pytest.raises(ValidationError):
        NodeImageSpec(url=URL, sha256=sha)


def test_fallback_is_a_closed_set_defaulting_to_fail() -> None:
    assert NodeImageSpec(url=URL, sha256=SHA, fallback="FullInstall").fallback is ImageFallback.FULL_INSTALL  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        NodeImageSpec(url=URL, sha256=SHA, fallback="Ignore")  # type: ignore[arg-type]


def test_the_template_carries_the_image_into_its_machine_spec() -> None:
    t = HetznerGPUMachineTemplate.model_validate(template({"url": URL, "sha256": SHA}))
    assert t.spec.template.spec.image == NodeImageSpec(url=URL, sha256=SHA)


def test_a_template_or_machine_with_an_image_is_admitted() -> None:
    assert admission.refusals("HetznerGPUMachineTemplate", template({"url": URL, "sha256": SHA}), [], CAT) == []
    body = {"apiVersion": API, "kind": "HetznerGPUMachine", "metadata": {"name": "m"}}
    body["spec"] = {"image": {"url": "/srv/images/node.tar.zst", "sha256": SHA, "fallback": "FullInstall"}}
    assert admission.refusals("HetznerGPUMachine", body, [], CAT) == []


async def test_the_shipped_webhook_admits_it_at_apply() -> None:
    class NoKube:
        async def list(self, *_: Any) -> list[dict[str, Any]]:
            raise AssertionError("a template check lists nothing")

    obj = template({"url": URL, "sha256": SHA})
    review = {"apiVersion": "admission.k8s.io/v1", "request": {"uid": "1", "operation": "CREATE", "object": obj}}
    out = await webhook.answer(review, "validate-hetznergpumachinetemplate", NoKube())  # type: ignore[arg-type]
    assert out["response"]["allowed"] is True
    bad = template({"url": "https://127.0.0.1/node.tar.zst", "sha256": SHA})
    review["request"]["object"] = bad  # type: ignore[index]
    out = await webhook.answer(review, "validate-hetznergpumachinetemplate", NoKube())  # type: ignore[arg-type]
    assert out["response"]["allowed"] is False, "the schema's URL rules hold at the webhook too"
