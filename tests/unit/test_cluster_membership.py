"""The membership's parts that need no broker: argument checks (typed, before any I/O), the
group user-data formats, and the assignor's own state (the map, the generation, ``forget``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from engine.cluster import Membership, OwnershipAssignor, OwnershipMap
from engine.cluster.assignor import ASSIGNOR_NAME, decode_owners, decode_url, encode_owners, encode_url
from schemas.errors import InvalidConfiguration, LogUnavailable

NOWHERE = "127.0.0.1:1"  # nothing listens there: an attempt to connect would not raise InvalidConfiguration
GOOD: dict[str, Any] = {"bootstrap": NOWHERE, "topic": "t", "group": "g", "advertise": "http://10.0.0.5:8420"}


@pytest.mark.parametrize(("change", "named"), [
    ({"bootstrap": "no port"}, "bootstrap"),
    ({"topic": ""}, "topic"),
    ({"group": "  "}, "group"),
    ({"advertise": "10.0.0.5:8420"}, "advertise"),
    ({"advertise": "ftp://10.0.0.5:8420"}, "advertise"),
    ({"advertise": "http://10.0.0.5:8420/v1"}, "advertise"),
    ({"session_timeout": 1.0}, "session_timeout"),
    ({"session_timeout": "10"}, "session_timeout"),
    ({"heartbeat_interval": 5.0}, "heartbeat_interval"),
    ({"close_timeout": 0}, "close_timeout"),
    ({"on_revoked": "not callable"}, "on_revoked"),
    ({"instance_id": ""}, "instance_id"),
])
def test_bad_arguments_are_refused_before_any_io(change: dict[str, Any], named: str) -> None:
    args = {**GOOD, **change}
    started = time.monotonic()
    with pytest.raises(InvalidConfiguration, match=named):
        Membership(args.pop("bootstrap"), args.pop("topic"), args.pop("group"), args.pop("advertise"), **args)
    assert time.monotonic() - started < 0.5  # no connection attempt was made


def test_the_subscription_carries_the_url_and_the_owned_partitions() -> None:
    assignor = OwnershipAssignor("http://a:1", "t")
    assert assignor.name == ASSIGNOR_NAME
    assignor.on_assignment(ConsumerProtocolAssignment(1, [("t", [0, 2])], encode_owners(3, {0: "http://a:1"})), 4)
    sub = assignor.metadata({"t"})
    decoded = ConsumerProtocolSubscription.decode(sub.encode())
    assert decode_url(decoded.user_data) == "http://a:1"
    assert [(tp.topic, list(tp.partitions)) for tp in decoded.owned_partitions] == [("t", [0, 2])]


def test_an_assignment_gives_the_member_the_whole_map_and_generation() -> None:
    assignor = OwnershipAssignor("http://a:1", "t")
    assert assignor.latest is None and assignor.assignments == 0
    blob = encode_owners(3, {0: "http://a:1", 1: "http://b:2"})
    assignor.on_assignment(ConsumerProtocolAssignment(1, [("t", [0])], blob), 7)
    latest = assignor.latest
    assert latest is not None
    assert (latest.generation, latest.partitions, dict(latest.owners)) == (7, 3, {0: "http://a:1", 1: "http://b:2"})
    assert assignor.assignments == 1 and assignor.synced_at <= time.monotonic()


def test_forget_claims_nothing_in_the_next_join_and_drops_the_generation() -> None:
    assignor = OwnershipAssignor("http://a:1", "t")
    assignor.on_assignment(ConsumerProtocolAssignment(1, [("t", [0, 1])], encode_owners(2, {0: "http://a:1"})), 3)
    assignor.forget()
    assert ConsumerProtocolSubscription.decode(assignor.metadata({"t"}).encode()).owned_partitions == []
    latest = assignor.latest
    assert latest is not None and latest.generation == -1 and dict(latest.owners) == {0: "http://a:1"}


def test_user_data_formats_round_trip_and_unreadable_data_is_no_error() -> None:
    assert decode_url(encode_url("http://a:1")) == "http://a:1"
    assert decode_owners(encode_owners(6, {5: "http://b:2", 0: "http://a:1"})) == (6, {0: "http://a:1", 5: "http://b:2"})
    for junk in (b"", None, b"\xff\xfe", b"[]", b'{"v": 99, "url": "http://a:1"}', b'{"v": 1}'):
        assert decode_url(junk) is None
        assert decode_owners(junk) is None


def test_the_map_answers_owner_of_and_owns() -> None:
    m = OwnershipMap("g", 3, 2, "http://a:1", {0: "http://a:1", 1: "http://b:2"})
    assert m.owns(0) and not m.owns(1) and m.owner_of(1) == "http://b:2" and m.owner_of(5) is None


def test_an_unreachable_broker_is_log_unavailable_within_the_request_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(LogUnavailable, match="no Kafka broker answered"):
        Membership(NOWHERE, "t", "g", "http://10.0.0.5:8420", request_timeout=1.0)
    assert time.monotonic() - started < 5.0
