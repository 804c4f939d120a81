"""``GET /v1/cluster``'s representation, written once (re-exported by ``engine.service.wire``):
the ownership map (``ClusterOut``, ``cluster_json``, ``cluster_of``) and, with ``?lag=true``,
each member's lag as its own ``/v1/stats`` gave it (``MemberOut``, filled by
``engine.client.members``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.cluster.ownership import OwnershipMap
from schemas.errors import InvalidRequest
from schemas.invalid import invalid

__all__ = ["ClusterOut", "MemberOut", "cluster_json", "cluster_of"]

_PARTITION = r"^[0-9]+$"


class MemberOut(BaseModel):
    """One member of ``GET /v1/cluster?lag=true``: its URL, the partitions the map gives it, and
    the records it has not applied yet on each partition it applies (its own ``/v1/stats``:
    ``owned_partitions`` and ``lag``); ``reachable`` false with ``error`` when it did not answer
    in time (the map is still answered)."""
    model_config = ConfigDict(extra="forbid")
    url: str
    partitions: list[int]
    lag: dict[Annotated[str, Field(pattern=_PARTITION)], int]
    reachable: bool
    error: str | None = None


class ClusterOut(BaseModel):
    """``GET /v1/cluster``: the owner of every partition as this member last learned it. Without
    a cluster (no ``--group``): ``group`` null, ``generation`` -1, and this server (the URL the
    request reached) owns every partition. ``standbys`` (partition -> the members keeping it as a
    standby replica) only in a cluster with ``--standbys``, ``warmups`` (partition -> the member
    warming it up to take it over) only while one is; ``members`` only with ``?lag=true``."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    group: str | None
    generation: int
    partitions: Annotated[int, Field(ge=1)]
    self_url: Annotated[str | None, Field(alias="self")]
    owners: dict[Annotated[str, Field(pattern=_PARTITION)], str]
    standbys: dict[Annotated[str, Field(pattern=_PARTITION)], list[str]] | None = None
    warmups: dict[Annotated[str, Field(pattern=_PARTITION)], str] | None = None
    members: list[MemberOut] | None = None


def cluster_json(owners: OwnershipMap | None, *, partitions: int, here: str) -> dict[str, Any]:
    """The ``GET /v1/cluster`` object of ``owners``; None (no cluster): ``here`` owns all ``partitions``."""
    if owners is None:
        return {"group": None, "generation": -1, "partitions": partitions, "self": here,
                "owners": {str(p): here for p in range(partitions)}}
    out: dict[str, Any] = {"group": owners.group, "generation": owners.generation, "partitions": owners.partitions,
                           "self": owners.self_url, "owners": {str(p): url for p, url in sorted(owners.owners.items())}}
    if owners.standbys:
        out["standbys"] = {str(p): list(urls) for p, urls in sorted(owners.standbys.items())}
    if owners.warmups:
        out["warmups"] = {str(p): url for p, url in sorted(owners.warmups.items())}
    return out


def cluster_of(tree: Any) -> OwnershipMap | None:
    """The ``OwnershipMap`` a ``GET /v1/cluster`` answer describes, None when it is no cluster
    (``group`` null: one server, or full replicas, where any server serves everything)."""
    try:
        model = ClusterOut.model_validate(tree)
    except ValidationError as exc:
        raise InvalidRequest(str(invalid(exc, "cluster"))) from None
    if model.group is None:
        return None
    return OwnershipMap(model.group, model.generation, model.partitions, model.self_url or "",
                        {int(p): url for p, url in model.owners.items()},
                        {int(p): tuple(urls) for p, urls in (model.standbys or {}).items()},
                        {int(p): url for p, url in (model.warmups or {}).items()})
