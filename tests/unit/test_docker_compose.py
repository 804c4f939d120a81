"""docker-compose.yml: Apache Kafka (KRaft), a histlog container running the demo, and one running
``histlog serve``, wired so they can talk."""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def kafka(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["kafka"]
    return service


@pytest.fixture(scope="module")
def kenv(kafka: dict[str, Any]) -> dict[str, str]:
    env = kafka["environment"]
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


@pytest.fixture(scope="module")
def histlog(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["histlog"]
    return service


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` → {NAME: (host, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in value.split(","):
        m = re.fullmatch(r"([A-Z_]+)://([^:]*):(\d+)", item.strip())
        assert m, f"bad listener {item!r}"
        out[m.group(1)] = (m.group(2), int(m.group(3)))
    return out


def histlog_command(histlog: dict[str, Any]) -> list[str]:
    command = histlog["command"]
    if isinstance(command, list):
        command = " ".join(command)
    words = shlex.split(command)
    return shlex.split(words[-1]) if words[:2] == ["sh", "-c"] else words


def histlog_setting(histlog: dict[str, Any], flag: str, env: str) -> str:
    """A CLI setting as the histlog container sees it: ``--flag VALUE`` wins over the env var."""
    words = histlog_command(histlog)
    if flag in words:
        return words[words.index(flag) + 1]
    environment = histlog.get("environment", {})
    assert env in environment, f"the histlog service must set {flag} or {env}"
    return str(environment[env])


def histlog_bootstrap(histlog: dict[str, Any]) -> str:
    return histlog_setting(histlog, "--kafka", "HISTLOG_KAFKA")


def test_three_services_and_three_cluster_members_behind_a_profile(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "histlog", "serve", "member-1", "member-2", "member-3"}
    for name in ("kafka", "histlog", "serve"):  # `docker compose up` starts these only
        assert "profiles" not in compose["services"][name]


def test_kafka_image_is_the_official_one_pinned_to_4x(kafka: dict[str, Any]) -> None:
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka["image"]), kafka["image"]


def test_kraft_combined_single_node(kenv: dict[str, str]) -> None:
    assert set(kenv["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = kenv["KAFKA_NODE_ID"]
    voters = kenv["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1
    voter_id, _, voter_addr = voters[0].partition("@")
    assert voter_id == node_id
    controller = kenv["KAFKA_CONTROLLER_LISTENER_NAMES"]
    _host, port = listeners(kenv["KAFKA_LISTENERS"])[controller]
    assert voter_addr.endswith(f":{port}")


def test_every_listener_has_a_security_protocol(kenv: dict[str, str]) -> None:
    protocol_map = dict(item.split(":") for item in kenv["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for name in listeners(kenv["KAFKA_LISTENERS"]):
        assert name in protocol_map
    assert kenv["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners(kenv["KAFKA_LISTENERS"])


def test_advertised_listeners_are_bound_and_not_the_controller(kenv: dict[str, str]) -> None:
    bound = listeners(kenv["KAFKA_LISTENERS"])
    advertised = listeners(kenv["KAFKA_ADVERTISED_LISTENERS"])
    assert kenv["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised
    for name, (_, port) in advertised.items():
        assert bound[name][1] == port


def test_histlog_bootstrap_is_an_advertised_listener(kenv: dict[str, str], histlog: dict[str, Any]) -> None:
    bootstrap = histlog_bootstrap(histlog)
    advertised = {f"{h}:{p}" for h, p in listeners(kenv["KAFKA_ADVERTISED_LISTENERS"]).values()}
    assert bootstrap in advertised
    assert bootstrap.split(":")[0] == "kafka"  # the service name: reachable from the other container


def test_host_port_is_published_for_the_host_listener(kafka: dict[str, Any], kenv: dict[str, str]) -> None:
    advertised = listeners(kenv["KAFKA_ADVERTISED_LISTENERS"])
    localhost = [port for host, port in advertised.values() if host in ("localhost", "127.0.0.1")]
    assert localhost, "a listener for clients on the host"
    published = {str(p).split(":")[0]: str(p).split(":")[-1] for p in kafka["ports"]}
    for port in localhost:
        assert published.get(str(port)) == str(port)


def test_internal_topics_fit_one_node(kenv: dict[str, str]) -> None:
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert kenv[key] == "1", key


def test_cluster_id_is_16_bytes_of_url_safe_base64(kenv: dict[str, str]) -> None:
    cid = kenv["CLUSTER_ID"]
    assert not cid.startswith("-")
    assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_history_lives_in_a_named_volume(compose: dict[str, Any], kafka: dict[str, Any],
                                         kenv: dict[str, str]) -> None:
    mounts = {v.split(":")[1]: v.split(":")[0] for v in kafka["volumes"]}
    assert kenv["KAFKA_LOG_DIRS"] in mounts
    assert mounts[kenv["KAFKA_LOG_DIRS"]] in compose["volumes"]


def test_kafka_has_a_healthcheck_on_its_broker_listener(kafka: dict[str, Any]) -> None:
    check = kafka["healthcheck"]
    test = " ".join(check["test"]) if isinstance(check["test"], list) else check["test"]
    assert "kafka-broker-api-versions.sh" in test or "kafka-topics.sh" in test
    assert "--bootstrap-server" in test
    assert int(check["retries"]) >= 3


def test_histlog_service(histlog: dict[str, Any]) -> None:
    assert histlog["image"] == "python:3.11-slim"
    assert any(str(v).split(":")[0] == "." for v in histlog["volumes"]), "mounts the repo"
    words = histlog_command(histlog)
    assert words[:2] == ["pip", "install"] and "-e" in words and "." in words
    assert "histlog" in words
    assert histlog_setting(histlog, "--topic", "HISTLOG_TOPIC")
    assert histlog_setting(histlog, "--state", "HISTLOG_STATE")


def test_histlog_runs_the_demo_against_kafka_with_explicit_flags(histlog: dict[str, Any]) -> None:
    """``histlog demo`` ignores HISTLOG_* (it never writes into a real history by accident), so
    the compose command must name the broker, topic and state directory as flags."""
    words = histlog_command(histlog)
    assert words[-1] == "demo"
    for flag in ("--kafka", "--topic", "--state"):
        assert flag in words and words.index(flag) < words.index("demo")


def test_histlog_waits_for_a_healthy_kafka(histlog: dict[str, Any]) -> None:
    assert histlog["depends_on"]["kafka"]["condition"] == "service_healthy"


@pytest.fixture(scope="module")
def serve(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["serve"]
    return service


def serve_words(serve: dict[str, Any]) -> list[str]:
    """The ``histlog ...`` command the serve container execs (after installing the server extra)."""
    words = histlog_command(serve)
    assert words[:3] == ["pip", "install", "-q"] and words[3] == "-e" and words[4] == ".[server]", words
    start = words.index("exec")
    return words[start + 1:]


def test_serve_runs_histlog_serve_on_the_broker_with_flags_the_cli_accepts(
        serve: dict[str, Any], histlog: dict[str, Any], kenv: dict[str, str]) -> None:
    from engine.cli.parser import build_parser

    words = serve_words(serve)
    assert words[0] == "histlog"
    ns = build_parser().parse_args(words[1:])
    assert ns.command == "serve"
    advertised = {f"{h}:{p}" for h, p in listeners(kenv["KAFKA_ADVERTISED_LISTENERS"]).values()}
    assert ns.kafka in advertised and ns.kafka.startswith("kafka:")
    assert ns.topic == histlog_setting(histlog, "--topic", "HISTLOG_TOPIC")  # it serves what the demo wrote


def test_serve_listens_on_its_container_but_publishes_to_the_host_loopback_only(serve: dict[str, Any]) -> None:
    """A non-loopback --listen without a token is refused unless --insecure: the compose file may
    say --insecure only because the published port is bound to the host's 127.0.0.1."""
    from engine.cli.parser import build_parser

    ns = build_parser().parse_args(serve_words(serve)[1:])
    host, _, port = ns.listen.rpartition(":")
    assert host == "0.0.0.0"
    if ns.insecure:
        assert serve["ports"] == [f"127.0.0.1:{port}:{port}"]


def test_serve_keeps_its_state_in_a_named_volume_and_is_healthy_when_ready(compose: dict[str, Any],
                                                                           serve: dict[str, Any]) -> None:
    from engine.cli.parser import build_parser

    ns = build_parser().parse_args(serve_words(serve)[1:])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in serve["volumes"]}
    assert mounts[ns.state] in compose["volumes"]
    test = " ".join(serve["healthcheck"]["test"])
    assert f"127.0.0.1:{ns.listen.rpartition(':')[2]}/readyz" in test
    assert serve["depends_on"]["kafka"]["condition"] == "service_healthy"


MEMBERS = ("member-1", "member-2", "member-3")


@pytest.mark.parametrize("name", MEMBERS)
def test_a_cluster_member_is_a_serve_group_on_the_broker_advertising_its_compose_name(
        compose: dict[str, Any], kenv: dict[str, str], name: str) -> None:
    from engine.cli.parser import build_parser
    from engine.cli.serve import cluster_of
    from engine.cli.target import resolve

    member = compose["services"][name]
    assert member["profiles"] == ["cluster"]
    ns = build_parser().parse_args(serve_words(member)[1:])
    assert ns.command == "serve" and ns.partitions == 6
    cluster = cluster_of(ns, resolve(ns, {}))
    assert cluster is not None and cluster.group == "histlog"
    port = ns.listen.rpartition(":")[2]
    assert cluster.advertise == f"http://{name}:{port}"  # what the other members reach it at
    advertised = {f"{h}:{p}" for h, p in listeners(kenv["KAFKA_ADVERTISED_LISTENERS"]).values()}
    assert ns.kafka in advertised and ns.kafka.startswith("kafka:")
    assert member["ports"] == [f"127.0.0.1:{8420 + MEMBERS.index(name) + 1}:{port}"]  # --insecure: loopback only
    mounts = {v.split(":")[1]: v.split(":")[0] for v in member["volumes"]}
    assert mounts[ns.state] == f"{name}-state" and mounts[ns.state] in compose["volumes"]
    assert f"127.0.0.1:{port}/readyz" in " ".join(member["healthcheck"]["test"])


def test_the_members_share_one_topic_and_group_the_full_replica_does_not_use(compose: dict[str, Any]) -> None:
    from engine.cli.parser import build_parser

    parsed = [build_parser().parse_args(serve_words(compose["services"][n])[1:]) for n in MEMBERS]
    assert len({(ns.topic, ns.group) for ns in parsed}) == 1
    replica = build_parser().parse_args(serve_words(compose["services"]["serve"])[1:])
    assert parsed[0].topic != replica.topic  # a 1-partition topic cannot be split
