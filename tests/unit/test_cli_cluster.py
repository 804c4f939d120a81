"""``histlog serve --group``'s flags: refused with exit 2 and one line saying what to add, before
anything is opened (no state dir is created, no broker is contacted); port 0 in ``--advertise``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli import main
from engine.cli.serve import advertised_url

Capsys = pytest.CaptureFixture[str]
KAFKA = ["--kafka", "127.0.0.1:1", "--topic", "t"]  # nothing listens there: any I/O would fail otherwise


@pytest.mark.parametrize(("args", "says"), [
    (["--data", "{d}", "serve", "--group", "g", "--advertise", "http://127.0.0.1:1"], "--group needs --kafka"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g"], "--group needs --advertise"),
    ([*KAFKA, "--state", "{d}", "serve", "--advertise", "http://127.0.0.1:1"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--session-timeout", "8"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--instance-id", "m1"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", " ", "--advertise", "http://h:1"], "--group is empty"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "ftp://h:1"], "invalid --advertise"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1/x"], "invalid --advertise"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:99999"], "invalid --advertise"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--session-timeout", "2"],
     "invalid --session-timeout 2"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--session-timeout", "nan"],
     "invalid --session-timeout"),
    ([*KAFKA, "--state", "{d}", "serve", "--partitions", "0"], "invalid --partitions 0"),
    ([*KAFKA, "--state", "{d}", "serve", "--standbys", "1"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--standbys", "9"],
     "invalid --standbys 9"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--standbys", "-1"],
     "--standbys"),
    ([*KAFKA, "--state", "{d}", "serve", "--warmup-lag", "5"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--no-snapshots"], "add --group"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--warmup-lag", "5"],
     "add --standbys 1"),
    ([*KAFKA, "--state", "{d}", "serve", "--group", "g", "--advertise", "http://h:1", "--standbys", "1",
      "--warmup-lag", "-2"], "--warmup-lag"),
])
def test_cluster_flags_are_refused_before_any_io(capsys: Capsys, tmp_path: Path, args: list[str], says: str) -> None:
    state = tmp_path / "state"
    assert main([a.replace("{d}", str(state)) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not state.exists(), "nothing may be opened before the flags are checked"


@pytest.mark.parametrize(("given", "port", "expected"), [
    ("http://127.0.0.1:0", 43210, "http://127.0.0.1:43210"),
    ("http://[::1]:0", 43210, "http://[::1]:43210"),
    ("https://member-1.internal:0", 8420, "https://member-1.internal:8420"),
    ("http://10.0.0.5:8420", 43210, "http://10.0.0.5:8420"),  # an explicit port (a NAT, a proxy) is kept
    ("http://10.0.0.5", 43210, "http://10.0.0.5"),
])
def test_port_0_in_advertise_is_the_listening_port(given: str, port: int, expected: str) -> None:
    assert advertised_url(given, port) == expected
