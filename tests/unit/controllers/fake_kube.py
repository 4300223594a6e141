"""An in-memory management cluster for controller unit tests: objects by (plural, namespace, name), JSON
merge patches with the resourceVersion precondition, server-side apply of status conditions, and every
write recorded, so a test can say "this pass wrote nothing" or "the Machine was never deleted"."""

from __future__ import annotations

import copy
from typing import Any

from capi_gpu.kube import Conflict, Obj, Res

NS = "gpu"


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


class FakeKube:
    """Objects by (plural, namespace, name); merge patches with the resourceVersion precondition; every
    write recorded as (verb, plural, name, subresource, body)."""

    def __init__(self, *objs: tuple[str, Obj]) -> None:
        self.objs: dict[tuple[str, str, str], Obj] = {}
        self.writes: list[tuple[str, str, str, str | None, Any]] = []
        self.rv = 10
        for plural, obj in objs:
            self.put(plural, obj)

    def put(self, plural: str, obj: Obj) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("namespace", NS)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objs[(plural, NS, obj["metadata"]["name"])] = obj

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        obj = self.objs.get((res.plural, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list(self, res: Res, namespace: str | None = None, **_: Any) -> list[Obj]:
        return [copy.deepcopy(o) for (p, ns, _n), o in self.objs.items() if p == res.plural and ns == namespace]

    async def patch(
        self, res: Res, name: str, patch: Any, namespace: str | None = None, sub: str | None = None, **_: Any
    ) -> Obj:
        self.writes.append(("patch", res.plural, name, sub, copy.deepcopy(patch)))
        obj = self.objs[(res.plural, namespace or "", name)]
        want = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        _merge(obj, patch)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    async def create(self, res: Res, body: Obj, namespace: str | None = None) -> Obj:
        self.writes.append(("create", res.plural, body["metadata"]["name"], None, None))
        self.put(res.plural, body)
        return body

    async def apply_patch(
        self, res: Res, name: str, body: Obj, manager: str, namespace: str | None = None, sub: str | None = None
    ) -> Obj:
        """Server-side apply of status conditions (a list-map by type), as the gate and remediation use it."""
        self.writes.append(("apply", res.plural, name, sub, copy.deepcopy(body)))
        obj = self.objs[(res.plural, namespace or "", name)]
        conds = obj.setdefault("status", {}).setdefault("conditions", [])
        for cond in (body.get("status") or {}).get("conditions") or []:
            conds[:] = [c for c in conds if c.get("type") != cond["type"]] + [copy.deepcopy(cond)]
        return copy.deepcopy(obj)

    async def delete(self, res: Res, name: str, namespace: str | None = None) -> None:
        self.writes.append(("delete", res.plural, name, None, None))
        self.objs.pop((res.plural, namespace or "", name), None)
