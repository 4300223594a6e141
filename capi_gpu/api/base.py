"""Building blocks shared by every kind: the model base, metav1 conditions, references, selectors.

The pydantic models are the single source of the CRD schemas (see ``crdgen``), so what a field accepts
is written once, here, and reaches the apiserver as OpenAPI. Field docstrings become the CRD
descriptions (``use_attribute_docstrings``). ``json_schema_extra`` carries the few Kubernetes
extensions (list-type, int-or-string) that plain JSON Schema can't say, and the CEL rules
(``x-kubernetes-validations``) the apiserver checks at admission: a rule is declared once, next to the
field it guards, with :func:`cel` and :func:`validations`, so bad input is refused at ``kubectl apply``
with the message a user can act on, not found later by a controller.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

_INITIALISMS = {"id": "ID", "ip": "IP", "uid": "UID", "url": "URL", "wwn": "WWN", "wwns": "WWNs", "mib": "MiB"}


def to_camel(name: str) -> str:
    """snake_case -> Kubernetes camelCase, with initialisms as the API conventions spell them (providerID)."""
    first, *rest = name.split("_")
    return first + "".join(_INITIALISMS.get(w, w.capitalize()) for w in rest)


class KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
        validate_default=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the apiserver wants it: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def list_map(*keys: str) -> dict[str, Any]:
    """json_schema_extra for a list merged by key (``x-kubernetes-list-type: map``)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}


def cel(rule: str, message: str, *, field: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One CEL rule. ``message`` names the field and the fix; ``field`` (a path relative to where the rule
    sits, e.g. ``.values``) is where the apiserver reports it; ``reason`` one of FieldValueInvalid,
    FieldValueForbidden, FieldValueRequired, FieldValueDuplicate. A rule using ``oldSelf`` is a
    transition rule: it runs on updates only."""
    out = {"rule": rule, "message": message}
    if field is not None:
        out["fieldPath"] = field
    if reason is not None:
        out["reason"] = reason
    return out


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """json_schema_extra attaching CEL rules to a model (in its ``model_config``) or to a field."""
    return {"x-kubernetes-validations": list(rules)}


def immutable(message: str) -> dict[str, Any]:
    """json_schema_extra for a field that can't change once set (a transition rule on the field)."""
    return validations(cel("self == oldSelf", message))


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(KubeModel):
    """A metav1.Condition: the shape CAPI core reads."""

    type: Annotated[str, Field(min_length=1, max_length=316, pattern=r"^([a-z0-9.-]+/)?[A-Za-z][A-Za-z0-9_.]*$")]
    """Condition type, e.g. Ready or GPUReady."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    """A CamelCase reason, one of the documented values for this condition type."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """Human-readable detail. Never contains secrets."""
    last_transition_time: datetime
    """When status last changed."""
    observed_generation: Annotated[int | None, Field(ge=0)] = None
    """metadata.generation the condition was computed from."""


Conditions = Annotated[list[Condition], Field(max_length=32, json_schema_extra=list_map("type"))]


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class LocalObjectReference(KubeModel):
    """A reference to an object in the same namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Name of the referenced object."""


class ObjectReference(KubeModel):
    """A full reference to an object, used for consumerRef."""

    api_version: Annotated[str, Field(min_length=1)]
    """apiVersion of the referent."""
    kind: Annotated[str, Field(min_length=1)]
    """Kind of the referent."""
    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Name of the referent."""
    namespace: str | None = None
    """Namespace of the referent."""
    uid: str | None = None
    """UID of the referent, so a recreated object with the same name is not mistaken for it."""


class SecretKeySelector(KubeModel):
    """One key of a Secret in the same namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """Secret name."""
    key: Annotated[str, Field(min_length=1, max_length=253)]
    """Key within the Secret's data."""


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(KubeModel):
    """A metav1 label selector requirement."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                "operator In and NotIn need at least one entry in values (e.g. values: [rtx-pro-6000]); "
                "use Exists to match any value",
                field=".values",
                reason="FieldValueRequired",
            ),
            cel(
                "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                "operator Exists and DoesNotExist take no values: remove values, or use In / NotIn",
                field=".values",
                reason="FieldValueForbidden",
            ),
        )
    )

    key: Annotated[str, Field(min_length=1, max_length=317)]
    """Label key."""
    operator: LabelSelectorOperator
    """In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[Annotated[str, Field(max_length=63)]] | None, Field(max_length=64)] = None
    """Values for In and NotIn; empty for Exists and DoesNotExist."""


class LabelSelector(KubeModel):
    """A metav1 label selector over HetznerGPUHost labels."""

    match_labels: dict[str, str] | None = None
    """Labels a host must carry, exactly."""
    match_expressions: Annotated[list[LabelSelectorRequirement] | None, Field(max_length=32)] = None
    """Set-based requirements, ANDed with matchLabels."""

    def matches(self, labels: dict[str, str]) -> bool:
        """Pure evaluation, so host choice can be tested without an apiserver."""
        for k, v in (self.match_labels or {}).items():
            if labels.get(k) != v:
                return False
        for req in self.match_expressions or []:
            present = req.key in labels
            vals = req.values or []
            op = req.operator
            if op is LabelSelectorOperator.IN and (not present or labels[req.key] not in vals):
                return False
            if op is LabelSelectorOperator.NOT_IN and present and labels[req.key] in vals:
                return False
            if op is LabelSelectorOperator.EXISTS and not present:
                return False
            if op is LabelSelectorOperator.DOES_NOT_EXIST and present:
                return False
        return True


class AddressType(StrEnum):
    HOSTNAME = "Hostname"
    EXTERNAL_IP = "ExternalIP"
    INTERNAL_IP = "InternalIP"
    EXTERNAL_DNS = "ExternalDNS"
    INTERNAL_DNS = "InternalDNS"


class MachineAddress(KubeModel):
    """An address of the machine, copied to the CAPI Machine for display."""

    type: AddressType
    """Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS."""
    address: Annotated[str, Field(min_length=1, max_length=256)]
    """The address."""


class Initialization(KubeModel):
    """The v1beta2 contract's initialization block."""

    provisioned: bool | None = None
    """True once the infrastructure is provisioned; CAPI core copies providerID and addresses then."""


class ObjectMetaTemplate(KubeModel):
    """Labels and annotations for objects created from a template."""

    labels: dict[str, str] | None = None
    """Labels to set."""
    annotations: dict[str, str] | None = None
    """Annotations to set."""
