"""A malformed Kafka bootstrap string is refused before any I/O (issue 11, defect 9): by
``parse_bootstrap``, by ``KafkaLog``, and by the CLI with exit 2 and one line. No broker needed:
the addresses below would otherwise mean a connection attempt (and a 30 s timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.log.kafka import KafkaLog, parse_bootstrap
from schemas.errors import InvalidConfiguration

REPO = Path(__file__).resolve().parents[2]

MALFORMED = [
    "", "host:notaport", "localhost", "localhost:", ":9092", "host:0", "host:99999", "host:-1",
    " host:9092", "host:9092 ", "host :9092", "host:90 92", "a:1,,b:2", "a:1,", ",a:1", "a:1, b:2",
    "::1:9092", "[::zz]:9092", "[::1]:", "ho$t:9092", "host:\uff19\uff10\uff19\uff12", "-host:9092",
]
VALID = ["127.0.0.1:9092", "localhost:1", "kafka-1.example.com:65535", "a:1,b:2,c:3", "[::1]:9092",
         "broker_1:9092"]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_bootstrap_is_invalid_configuration(value: str) -> None:
    with pytest.raises(InvalidConfiguration) as info:
        parse_bootstrap(value)
    message = str(info.value)
    assert repr(value) in message or value == ""
    assert "HOST:PORT" in message


@pytest.mark.parametrize("value", VALID)
def test_well_formed_bootstrap_is_accepted(value: str) -> None:
    assert parse_bootstrap(value) == value


@pytest.mark.parametrize("value", [None, 9092, b"host:9092"])
def test_a_bootstrap_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(InvalidConfiguration, match="HOST:PORT"):
        parse_bootstrap(value)


@pytest.mark.parametrize("value", ["10.255.255.1:notaport", "10.255.255.1", "10.255.255.1:0"])
def test_kafkalog_refuses_before_connecting(value: str) -> None:
    # 10.255.255.1 is unroutable: any connection attempt would hang until a timeout.
    t0 = time.monotonic()
    with pytest.raises(InvalidConfiguration, match="HOST:PORT"):
        KafkaLog(value, "histlog.events")
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"topic": ""}, "topic"), ({"partitions": 0}, "partitions"), ({"replication_factor": 0}, "replication_factor"),
    ({"request_timeout_s": float("nan")}, "request_timeout_s"), ({"request_timeout_s": -1.0}, "request_timeout_s"),
    ({"max_record_bytes": 0}, "max_record_bytes"),
])
def test_kafkalog_refuses_other_bad_settings_before_connecting(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"topic": "histlog.events", **kwargs}
    with pytest.raises(InvalidConfiguration, match=needle):
        KafkaLog("10.255.255.1:9092", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["host:notaport", "host:99999", "a:1, b:2"])
def test_cli_exits_2_with_one_line(value: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HISTLOG_KAFKA", None)
    proc = subprocess.run([sys.executable, "-m", "engine", "--kafka", value, "--topic", "t",
                           "--state", str(tmp_path / "state"), "stats"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HOST:PORT" in lines[0], proc.stderr
    assert not (tmp_path / "state").exists()  # nothing was created
