"""The state snapshot route between cluster members: ``GET /v1/partitions/{p}/snapshot``
(``projections.snapshots``' wire format, docs/cluster.md "State snapshots"), which
``engine.routes`` puts in its table. Behind the server's token like every ``/v1`` route; the
member restoring a partition it takes on with no state asks its peers for it
(``engine.cluster.restore``). The stream is read from one RocksDB point in time, in a worker
thread (``StreamingResponse`` iterates a plain iterator off the event loop)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.service.route_base import Context, Op
from engine.service.routing import segment
from schemas.errors import InvalidRequest

__all__ = ["PARTITION_OPS", "SNAPSHOT_MEDIA"]

SNAPSHOT_MEDIA = "application/vnd.histlog.partition-snapshot"


def partition_of(raw: str, partitions: int) -> int:
    """The path segment ``p`` as a partition of this log (``InvalidRequest`` naming ``p`` otherwise)."""
    if not raw.isascii() or not raw.isdigit() or (len(raw) > 1 and raw[0] == "0") or int(raw) >= partitions:
        raise InvalidRequest(f"path segment p: {raw!r} is not a partition of this log (0..{partitions - 1})")
    return int(raw)


async def get_snapshot(request: Request, ctx: Context, query: dict[str, Any]) -> Response:
    engine = ctx.router.local.engine
    p = partition_of(segment(request, "p"), engine.log.partitions)
    chunks = engine.partition_snapshot(p)  # NotFound (404) before anything is sent
    return StreamingResponse(chunks, media_type=SNAPSHOT_MEDIA)


PARTITION_OPS: tuple[Op, ...] = (
    Op("GET", "/v1/partitions/{p}/snapshot", "partition_snapshot", "The state this server holds of partition p "
       "(owned, a standby, or kept), as one point in time: for a cluster member taking p on with no state of it "
       "(docs/cluster.md \"State snapshots\"); 404 when it holds none", get_snapshot, (200, None),
       errors=(400, 401, 404, 503), ok_media=SNAPSHOT_MEDIA),
)
