"""The webhook in infrastructure-components: the configuration names the Service, the paths are the
operator's handler ids, it fails closed for our kinds only and skips metadata-only updates, cert-manager
injects the CA of the Certificate whose Secret the manager mounts where `capi-gpu run` reads it, and the
Service reaches the manager's webhook port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from capi_gpu import domain
from capi_gpu.cli import build_parser
from capi_gpu.controllers import webhook
from capi_gpu.runtime.settings import Settings


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_configuration_points_at_the_service_and_the_handler_ids(components: list[dict[str, Any]]) -> None:
    config = one(components, "ValidatingWebhookConfiguration")
    service = one(components, "Service")
    paths = set()
    for hook in config["webhooks"]:
        ref = hook["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (service["metadata"]["name"], service["metadata"]["namespace"])
        paths.add(ref["path"])
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == [domain.GROUP]
        assert rule["operations"] == ["CREATE", "UPDATE"]
        (plural,) = rule["resources"]  # the main resource only: status writes never reach it
        assert webhook.WEBHOOKS[ref["path"].lstrip("/")][0] == plural
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        (cond,) = hook["matchConditions"]
        assert cond["expression"] == "request.operation == 'CREATE' || object.spec != oldObject.spec"
    assert paths == {f"/{hid}" for hid in webhook.WEBHOOKS}


def test_cert_manager_injects_the_ca_of_the_mounted_certificate(components: list[dict[str, Any]]) -> None:
    config = one(components, "ValidatingWebhookConfiguration")
    service = one(components, "Service")
    ns, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    (cert,) = [d for d in components if d["kind"] == "Certificate" and d["metadata"]["name"] == name]
    assert cert["metadata"]["namespace"] == ns
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert svc in cert["spec"]["dnsNames"]
    # The serving certificate comes from a CA Issuer whose CA a self-signed Issuer made: renewing the
    # serving certificate keeps the injected caBundle (the CA), so no window refuses our writes.
    issuers = {d["metadata"]["name"]: d for d in components if d["kind"] == "Issuer"}
    assert cert["spec"]["issuerRef"]["kind"] == "Issuer"
    ca_issuer = issuers[cert["spec"]["issuerRef"]["name"]]
    (ca,) = [
        d
        for d in components
        if d["kind"] == "Certificate" and d["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
    ]
    assert ca["spec"]["isCA"] is True and "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]

    deployment = one(components, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == cert["spec"]["secretName"]]
    (manager,) = pod["containers"]
    (mount,) = [m for m in manager["volumeMounts"] if m["name"] == volume["name"]]
    args = [re.sub(r"\$\{[A-Z_]+:=([^}]*)\}", r"\1", a) for a in manager["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.webhook_port == 9443
    assert Path(mount["mountPath"]) == parsed.webhook_cert_dir == Settings().webhook_cert_dir


def test_service_reaches_the_webhook_port(components: list[dict[str, Any]]) -> None:
    service = one(components, "Service")
    deployment = one(components, "Deployment")
    (port,) = service["spec"]["ports"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in manager["ports"]}
    assert named[port["targetPort"]] == 9443
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
