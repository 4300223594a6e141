"""What one DRA device request wants, read from its DeviceClass and CEL selectors: a MIG profile, a whole
NVIDIA GPU, our gate device, or something the scaler does not understand. Pure.

The scaler adds bare-metal nodes (an hour, a monthly bill) on the strength of this reading, so it reads
only the forms it can be sure of and calls everything else "not ours", with the reason, rather than
guess. Understood: conjunctions (``&&``) of

* ``device.driver == "<driver>"``;
* ``device.attributes["gpu.nvidia.com"].type == "mig"`` / ``"gpu"``;
* ``device.attributes["gpu.nvidia.com"].profile == "<profile>"`` (what the shipped claim templates and
  NVIDIA's chart write), with either quote style and optional parentheses around a term.

The class's selectors and the request's add up (the scheduler ANDs them). A profile implies a MIG device;
``type == "mig"`` without a profile (any MIG device) is not ours, since no layout choice follows from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from capi_gpu import domain

_QUOTED = r"(?P<q{n}>[\"'])(?P<{name}>[^\"']*)(?P=q{n})"
_DRIVER = re.compile(rf"^device\.driver\s*==\s*{_QUOTED.format(n=1, name='value')}$")
_ATTRIBUTE = re.compile(
    rf"^device\.attributes\[{_QUOTED.format(n=1, name='domain')}\]\.(?P<attr>[A-Za-z][A-Za-z0-9]*)"
    rf"\s*==\s*{_QUOTED.format(n=2, name='value')}$"
)
DRIVER_FACT = "driver"


class Kind(StrEnum):
    MIG = "mig"
    WHOLE_GPU = "gpu"
    GATE = "gate"


@dataclass(frozen=True, slots=True)
class Want:
    kind: Kind
    profile: str | None = None


class NotOurs(ValueError):
    """The request is not one the scaler can plan for; the message is the reason."""


def facts(expression: str) -> dict[str, str]:
    """``{"driver": ..., "<domain>/<attribute>": ...}`` from one CEL expression of the understood forms."""
    out: dict[str, str] = {}
    for raw in expression.split("&&"):
        term = raw.strip()
        while term.startswith("(") and term.endswith(")"):
            term = term[1:-1].strip()
        if m := _DRIVER.match(term):
            key, value = DRIVER_FACT, m["value"]
        elif m := _ATTRIBUTE.match(term):
            key, value = f"{m['domain']}/{m['attr']}", m["value"]
        else:
            raise NotOurs(f"CEL {expression!r} is not a form the scaler reads")
        if out.get(key, value) != value:
            raise NotOurs(f"CEL {expression!r} asks for two values of {key}")
        out[key] = value
    return out


def expressions(selectors: Iterable[Any]) -> list[str]:
    """The CEL expressions of a selectors list; a selector of another kind is not ours."""
    out = []
    for s in selectors or ():
        cel = (s or {}).get("cel") if isinstance(s, Mapping) else None
        if not isinstance(cel, Mapping) or not isinstance(cel.get("expression"), str):
            raise NotOurs("a selector that is not CEL")
        out.append(str(cel["expression"]))
    return out


def resolve(class_name: str, selectors: Iterable[Any], classes: Mapping[str, Mapping[str, Any]]) -> Want:
    """What a request of ``class_name`` with ``selectors`` wants; NotOurs with the reason otherwise."""
    device_class = classes.get(class_name)
    if device_class is None:
        raise NotOurs(f"DeviceClass {class_name!r} not found")
    exprs = expressions((device_class.get("spec") or {}).get("selectors") or ()) + expressions(selectors)
    known: dict[str, str] = {}
    for expr in exprs:
        for key, value in facts(expr).items():
            if known.get(key, value) != value:
                raise NotOurs(f"DeviceClass {class_name!r} and the request disagree on {key}")
            known[key] = value
    return _want(class_name, known)


def _want(class_name: str, known: Mapping[str, str]) -> Want:
    driver = known.get(DRIVER_FACT)
    if driver == domain.GATE_DRIVER:
        return Want(Kind.GATE)
    nvidia = {k.split("/", 1)[1]: v for k, v in known.items() if k.startswith(f"{domain.NVIDIA_DRIVER}/")}
    foreign = sorted(k for k in known if k != DRIVER_FACT and not k.startswith(f"{domain.NVIDIA_DRIVER}/"))
    if driver not in (None, domain.NVIDIA_DRIVER) or foreign:
        raise NotOurs(f"DeviceClass {class_name!r} selects devices of another driver ({driver or foreign[0]})")
    if not nvidia:
        raise NotOurs(f"DeviceClass {class_name!r} does not select an NVIDIA device type")
    extra = sorted(set(nvidia) - {"type", "profile"})
    if extra:
        raise NotOurs(f"selects on {extra[0]!r}, which no layout decides")
    kind, profile = nvidia.get("type"), nvidia.get("profile")
    if profile is not None and kind in (None, Kind.MIG.value):
        return Want(Kind.MIG, profile)
    if profile is None and kind == Kind.WHOLE_GPU.value:
        return Want(Kind.WHOLE_GPU)
    if profile is None and kind == Kind.MIG.value:
        raise NotOurs("a MIG request without a profile selector (any MIG device)")
    raise NotOurs(f"NVIDIA device type {kind!r} is not one the scaler plans for")
