"""``histlog`` on bad input and hostile surroundings (issue 11, defect 9), on real files.

* every bad invocation exits 2 with exactly one ``histlog: error:`` line and nothing on stdout;
* a data dir held by another process exits 4;
* a reader that closes stdout early (``histlog read c | head -1``) ends the command quietly;
* a projector that stops (the state store cannot write: RLIMIT_FSIZE in the child) is reported
  in one line per message, with no traceback unless ``HISTLOG_DEBUG=1``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.cli import PIPE_CLOSED, main
from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.errors import InvalidConfiguration
from schemas.messages import Message

Capsys = pytest.CaptureFixture[str]
ROOT = Path(__file__).resolve().parents[2]
DEEP = 800  # the depth: the JSON parser takes it, a recursive walk of the tree does not


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOPIC", "HISTLOG_STATE", "HISTLOG_DEBUG"):
        monkeypatch.delenv(name, raising=False)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISTLOG_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _histlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=120, check=False)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("histlog: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- the files the table uses


def _deep_array_file(tmp: Path) -> str:
    path = tmp / "deep-array.json"
    path.write_text('[{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":{"k":'
                    + "[" * DEEP + "]" * DEEP + "}}]")
    return str(path)


def _deep_object_file(tmp: Path) -> str:
    path = tmp / "deep-object.json"
    path.write_text('{"messages":[{"role":"user","parts":[{"kind":"text","text":"x"}],"metadata":'
                    + '{"k":' * DEEP + "1" + "}" * DEEP + "}]}")
    return str(path)


def _file(tmp: Path, name: str, content: bytes) -> str:
    path = tmp / name
    path.write_bytes(content)
    return str(path)


def _a_file(tmp: Path) -> str:
    return _file(tmp, "not-a-dir", b"I am a file\n")


# Each row: (name, argv after the program name with {data} {file} {dir} {tmp} placeholders, a
# function making the file the row needs). Every one must exit 2 with one line, nothing on stdout.
Row = tuple[str, list[str], Callable[[Path], str] | None]
BAD_INVOCATIONS: list[Row] = [
    # where the history lives
    ("data is a file: list", ["--data", "{file}", "list"], _a_file),
    ("data is a file: append", ["--data", "{file}", "append", "c", "a", "--text", "x"], _a_file),
    ("data is a file: read", ["--data", "{file}", "read", "c"], _a_file),
    ("data is a file: stats", ["--data", "{file}", "stats"], _a_file),
    ("data is a file: rebuild", ["--data", "{file}", "rebuild"], _a_file),
    ("data is a file: tail", ["--data", "{file}", "tail", "--no-follow"], _a_file),
    ("data is a file: log verify", ["--data", "{file}", "log", "verify"], _a_file),
    ("data under a file", ["--data", "{file}/sub", "list"], _a_file),
    ("data is empty", ["--data", "", "list"], None),
    ("kafka is empty", ["--kafka", "", "list"], None),
    ("state is empty", ["--kafka", "localhost:9", "--state", "", "list"], None),
    ("topic is empty", ["--kafka", "localhost:9", "--state", "{tmp}/s", "--topic", "", "list"], None),
    ("kafka without a port", ["--kafka", "localhost", "--state", "{tmp}/s", "list"], None),
    ("data and kafka", ["--data", "{data}", "--kafka", "h:1", "list"], None),
    ("state without kafka", ["--data", "{data}", "--state", "{tmp}/s", "list"], None),
    ("kafka state is a file", ["--kafka", "localhost:9", "--state", "{file}", "list"], _a_file),
    ("kafka state under a file", ["--kafka", "localhost:9", "--state", "{file}/s", "list"], _a_file),
    # ids
    ("empty conversation", ["--data", "{data}", "read", ""], None),
    ("padded conversation", ["--data", "{data}", "append", " c", "a", "--text", "x"], None),
    ("control char in append id", ["--data", "{data}", "append", "c", "a\x07", "--text", "x"], None),
    ("overlong conversation", ["--data", "{data}", "clear", "c" * 5000], None),
    ("empty old turn id", ["--data", "{data}", "replace-turn", "c", "", "a", "--reason", "edit", "--text", "x"],
     None),
    # numbers and positions
    ("window zero", ["--data", "{data}", "read", "c", "--window", "0"], None),
    ("window negative", ["--data", "{data}", "read", "c", "--window", "-3"], None),
    ("window not a number", ["--data", "{data}", "read", "c", "--window", "1e3"], None),
    ("max-bytes not a number", ["--data", "{data}", "read", "c", "--max-bytes", "ten"], None),
    ("lines negative", ["--data", "{data}", "tail", "--no-follow", "-n", "-1"], None),
    ("lines not a number", ["--data", "{data}", "tail", "--no-follow", "-n", "many"], None),
    ("after garbage", ["--data", "{data}", "read", "c", "--after", "three"], None),
    ("after empty", ["--data", "{data}", "read", "c", "--after", ""], None),
    ("after three parts", ["--data", "{data}", "read", "c", "--after", "1:2:3"], None),
    ("after negative", ["--data", "{data}", "read", "c", "--after", "1:-2"], None),
    ("after with window", ["--data", "{data}", "read", "c", "--window", "2", "--after", "1:1"], None),
    # files
    ("missing file", ["--data", "{data}", "append", "c", "a", "--file", "{tmp}/nope.json"], None),
    ("directory as file", ["--data", "{data}", "append", "c", "a", "--file", "{dir}"], None),
    ("empty file", ["--data", "{data}", "append", "c", "a", "--file", "{file}"],
     lambda t: _file(t, "empty.json", b"")),
    ("not UTF-8", ["--data", "{data}", "append", "c", "a", "--file", "{file}"],
     lambda t: _file(t, "latin1.json", b'[{"role":"user","parts":[{"kind":"text","text":"caf\xe9"}]}]')),
    ("duplicate keys", ["--data", "{data}", "append", "c", "a", "--file", "{file}"],
     lambda t: _file(t, "dup.json", b'{"messages":[],"messages":[]}')),
    ("deep array", ["--data", "{data}", "append", "c", "a", "--file", "{file}"], _deep_array_file),
    ("deep object", ["--data", "{data}", "append", "c", "a", "--file", "{file}"], _deep_object_file),
    ("deep file for replace-turn", ["--data", "{data}", "replace-turn", "c", "t", "a", "--reason", "edit",
                                    "--file", "{file}"], _deep_array_file),
    ("nested far too deep", ["--data", "{data}", "append", "c", "a", "--file", "{file}"],
     lambda t: _file(t, "deeper.json", b"[" * 100_000 + b"]" * 100_000)),
    # usage
    ("unknown role", ["--data", "{data}", "append", "c", "a", "--text", "x", "--role", "robot"], None),
    ("unknown command", ["frobnicate"], None),
    ("no command", [], None),
    ("bad projection spec", ["--data", "{data}", "replay", "--projection", "no-colon"], None),
    ("unimportable projection", ["--data", "{data}", "replay", "--projection", "no_such_module_xyz:P"], None),
    ("projection with a syntax error", ["--data", "{data}", "replay", "--projection", "histlog_syntax_error:P"],
     lambda t: _file(t, "histlog_syntax_error.py", b"def broken(:\n")),
    ("projection failing on import", ["--data", "{data}", "replay", "--projection", "histlog_import_fails:P"],
     lambda t: _file(t, "histlog_import_fails.py", b"raise RuntimeError('no config')\n")),
]


def _argv(row: Row, tmp: Path) -> list[str]:
    _, args, make = row
    file = make(tmp) if make is not None else ""
    (tmp / "a-dir").mkdir(exist_ok=True)
    return [a.format(data=tmp / "data", file=file, dir=tmp / "a-dir", tmp=tmp) for a in args]


@pytest.mark.parametrize("row", BAD_INVOCATIONS, ids=[r[0] for r in BAD_INVOCATIONS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(capsys: Capsys, tmp_path: Path, row: Row,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an accidental default data dir would appear here
    argv = _argv(row, tmp_path)
    before = _tree(tmp_path)
    code = main(argv)
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, ""), captured.err
    _one_error_line(captured.err)
    assert _tree(tmp_path) == before  # nothing written


def _tree(root: Path) -> list[Path]:
    """Every path under root, but Python's own bytecode cache (a projection module imported)."""
    return sorted(p.relative_to(root) for p in root.rglob("*") if "__pycache__" not in p.parts)


SUBPROCESS_ROWS = [r for r in BAD_INVOCATIONS if r[0] in {
    "data is a file: list", "data under a file", "deep array", "deep object", "nested far too deep",
    "after garbage", "no command"}]


@pytest.mark.parametrize("row", SUBPROCESS_ROWS, ids=[r[0] for r in SUBPROCESS_ROWS])
def test_python_m_engine_bad_input_is_one_line_without_traceback(tmp_path: Path, row: Row) -> None:
    proc = _histlog(*_argv(row, tmp_path))
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    _one_error_line(proc.stderr)


def test_the_library_refuses_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    path = Path(_a_file(tmp_path))
    with pytest.raises(InvalidConfiguration, match="is a file"):
        HistoryEngine.open(path)
    assert path.read_bytes() == b"I am a file\n"


def test_the_demo_on_a_data_dir_that_is_a_file_exits_2(capsys: Capsys, tmp_path: Path) -> None:
    """The demo prints its heading first (engine/demo.py), then the refusal: one error line."""
    path = Path(_a_file(tmp_path))
    assert main(["--data", str(path), "demo"]) == 2
    assert "is a file" in _one_error_line(capsys.readouterr().err)
    assert path.read_bytes() == b"I am a file\n"


def test_a_deep_file_is_refused_as_a_bad_message(capsys: Capsys, tmp_path: Path) -> None:
    code = main(["--data", str(tmp_path / "data"), "append", "c", "a", "--file", _deep_array_file(tmp_path)])
    assert code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "nested deeper than" in line  # refused while reading the JSON, before any recursion


# --------------------------------------------------------------------------- a data dir in use: exit 4


def test_a_data_dir_held_by_another_process_exits_4(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with HistoryEngine.open(data) as engine:
        engine.append(Batch("c", "a", [Message.user("x")]))
        for args in (["list"], ["append", "c", "b", "--text", "y"], ["rebuild"]):
            proc = _histlog("--data", str(data), *args)
            assert proc.returncode == 4, proc.stderr
            _one_error_line(proc.stderr)
        assert engine.log.end_offsets() == [1]
    assert _histlog("--data", str(data), "list").stdout == "c\n"  # and it was left intact


# --------------------------------------------------------------------------- stdout closed early


@pytest.fixture
def long_history(tmp_path: Path) -> Path:
    """A conversation whose `read` output (~600 KB) is far larger than a pipe's buffer."""
    data = tmp_path / "data"
    with HistoryEngine.open(data) as engine:
        for i in range(6):
            engine.append(Batch("c", f"a{i}", [Message.user(f"{i}:{j} " + "y" * 1000) for j in range(100)]))
    return data


def test_read_into_a_reader_that_stops_after_one_line_ends_quietly(long_history: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--data", str(long_history), "read", "c"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # like `head -1`
        assert proc.wait(timeout=60) == PIPE_CLOSED == 141  # what `git log | head -1` gives
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert first.startswith(b"[1:1] user: 0:0 ")
    assert err == ""  # no "Broken pipe", no traceback, no "Exception ignored"


@pytest.mark.parametrize("args", [["read", "c", "--json"], ["list"], ["stats"], ["tail", "--no-follow"]])
def test_a_stdout_closed_before_the_first_write_ends_quietly(long_history: Path, args: list[str]) -> None:
    """The read end is closed before the child starts, so even a short output (kept in the
    stream's buffer until exit) meets a closed pipe: deterministic."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "engine", "--data", str(long_history), *args],
                              stdout=write_end, stderr=subprocess.PIPE, env=_env(), cwd=ROOT, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == PIPE_CLOSED
    assert proc.stderr.decode() == ""


# --------------------------------------------------------------------------- a projector that stops


STATE_LIMIT = 100_000  # bytes: the state's write-ahead log outgrows it while replaying the log below


@pytest.fixture
def log_without_state(tmp_path: Path) -> Path:
    """A data dir whose log (~400 KB) must be replayed into a fresh state on open."""
    data = tmp_path / "data"
    with HistoryEngine.open(data) as engine:
        for i in range(20):
            engine.append(Batch("c", f"a{i}", [Message.user("y" * 20_000)]))
    shutil.rmtree(data / "state")
    return data


def _small_disk() -> None:
    """In the child: files may not grow past STATE_LIMIT (EFBIG instead of SIGXFSZ), a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (STATE_LIMIT, STATE_LIMIT))


def _stats_on_a_small_disk(data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "--data", str(data), "stats"], capture_output=True,
                          text=True, env=_env(**env), cwd=ROOT, timeout=120, check=False, preexec_fn=_small_disk)


def test_a_projector_stop_is_reported_in_one_line_per_message_without_traceback(log_without_state: Path) -> None:
    proc = _stats_on_a_small_disk(log_without_state)
    assert proc.returncode in (1, 4), proc.stderr  # the state failed: exit 4 once it is StateUnavailable
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and all(line.startswith("histlog: ") for line in lines), proc.stderr
    assert any(line.startswith("histlog: error: projector stopped") and "File too large" in line
               for line in lines), proc.stderr
    assert lines[-1].startswith("histlog: error: ")


def test_histlog_debug_shows_the_projector_traceback(log_without_state: Path) -> None:
    proc = _stats_on_a_small_disk(log_without_state, HISTLOG_DEBUG="1")
    assert proc.returncode in (1, 4)
    assert "histlog: error: projector stopped" in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr


def test_a_warning_is_one_line(capsys: Capsys, tmp_path: Path) -> None:
    """A state built by another layout version is rebuilt with a warning: one line, prefixed."""
    data = tmp_path / "data"
    assert main(["--data", str(data), "append", "c", "a", "--text", "x"]) == 0
    from projections.keys import meta_key
    from projections.store import StateStore

    store = StateStore(data / "state")
    store.db.put(meta_key("format"), b"0")
    store.close()
    capsys.readouterr()
    assert main(["--data", str(data), "list"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "c\n"
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("histlog: warning: state in "), captured.err
    assert lines[0].endswith("rebuilding it from the log")


def test_output_json_still_parses_after_the_changes(capsys: Capsys, tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert main(["--data", data, "append", "c", "a", "--text", "x"]) == 0
    capsys.readouterr()
    assert main(["--data", data, "read", "c", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["append_id"] == "a"
