"""``histlog`` CLI: exit codes, output shapes and the docs check, on real files.

Most tests run ``main([...])`` in-process (capsys); a few run ``python -m engine`` in a
subprocess to prove that bad input gives one line on stderr and never a traceback.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli import ProgressBar, build_parser, follow, main, subcommands
from engine.facade import HistoryEngine
from schemas.batch import Batch
from schemas.messages import Message

Capsys = pytest.CaptureFixture[str]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HISTLOG_DATA", "HISTLOG_KAFKA", "HISTLOG_TOPIC", "HISTLOG_STATE", "HISTLOG_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def data(tmp_path: Path) -> str:
    return str(tmp_path / "data")


def run(capsys: Capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("histlog: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- append / read / list / clear


def test_append_read_list_clear_then_append_is_refused(capsys: Capsys, data: str) -> None:
    code, out, _ = run(capsys, "--data", data, "append", "c1", "a1", "--text", "hello there")
    assert code == 0
    receipt = json.loads(out)
    assert receipt["conversation_id"] == "c1" and receipt["append_id"] == "a1"
    assert run(capsys, "--data", data, "append", "c1", "a2", "--text", "hi!", "--role", "assistant")[0] == 0

    code, out, _ = run(capsys, "--data", data, "read", "c1")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"\[\d+:1\] user: hello there", lines[0])
    assert re.fullmatch(r"\[\d+:2\] assistant: hi!", lines[1])

    assert run(capsys, "--data", data, "list")[1].splitlines() == ["c1"]
    assert run(capsys, "--data", data, "clear", "c1")[0] == 0
    assert run(capsys, "--data", data, "list")[1] == ""
    assert run(capsys, "--data", data, "read", "c1")[1] == ""

    code, out, err = run(capsys, "--data", data, "append", "c1", "a3", "--text", "anyone?")
    assert code == 3
    assert out == ""
    assert "closed" in one_error_line(err)


def test_retry_of_the_same_append_prints_the_identical_receipt(capsys: Capsys,
                                                               data: str) -> None:
    first = run(capsys, "--data", data, "append", "c1", "a1", "--text", "hello")
    second = run(capsys, "--data", data, "append", "c1", "a1", "--text", "hello")
    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    stats = json.loads(run(capsys, "--data", data, "stats", "--json")[1])
    assert stats["end_offsets"] == [1]


def test_same_append_id_with_other_content_is_a_conflict(capsys: Capsys, data: str) -> None:
    assert run(capsys, "--data", data, "append", "c1", "a1", "--text", "hello")[0] == 0
    code, out, err = run(capsys, "--data", data, "append", "c1", "a1", "--text", "goodbye")
    assert code == 3
    assert out == ""
    assert "different content" in one_error_line(err)


def test_append_from_a_file_list_or_object(capsys: Capsys, data: str, tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([
        {"role": "user", "parts": [{"kind": "text", "text": "order A1?"}]},
        {"role": "assistant",
         "parts": [{"kind": "tool_call", "id": "c1", "name": "lookup", "arguments": "{}"}]},
    ]))
    wrapped = tmp_path / "wrapped.json"
    message = {"role": "user", "parts": [{"kind": "text", "text": "again"}]}
    wrapped.write_text(json.dumps({"messages": [message]}))
    assert run(capsys, "--data", data, "append", "c", "a1", "--file", str(listed))[0] == 0
    assert run(capsys, "--data", data, "append", "c", "a2", "--file", str(wrapped))[0] == 0
    out = run(capsys, "--data", data, "read", "c")[1]
    assert "assistant: → lookup({})" in out
    assert len(out.splitlines()) == 3


@pytest.mark.parametrize("content", [
    "{not json", '{"msgs": []}', "[]", '[{"role": "user", "parts": []}]', "42",
])
def test_a_bad_batch_file_exits_2_with_one_line(capsys: Capsys, data: str, tmp_path: Path,
                                                content: str) -> None:
    path = tmp_path / "batch.json"
    path.write_text(content)
    code, _, err = run(capsys, "--data", data, "append", "c", "a", "--file", str(path))
    assert code == 2
    one_error_line(err)


@pytest.mark.parametrize("args", [
    ["append", " padded", "a", "--text", "x"],
    ["append", "c", "bell\x07", "--text", "x"],
    ["append", "c", "a", "--text", "x", "--role", "robot"],
    ["append", "c", "a"],
    ["append", "c", "a", "--text", "x", "--file", "f.json"],
    ["read", ""],
    ["read", "c", "--after", "three"],
    ["read", "c", "--after", "1:-2"],
    ["read", "c", "--window", "0"],
    ["read", "c", "--window", "x"],
    ["read", "c", "--unit", "message"],
    ["clear", "tab\there"],
    ["frobnicate"],
    [],
])
def test_bad_input_exits_2_with_one_clear_line(capsys: Capsys, data: str,
                                               args: list[str]) -> None:
    code, out, err = run(capsys, "--data", data, *args)
    assert code == 2
    assert out == ""
    one_error_line(err)


def test_invalid_conversation_id_is_refused_before_any_io(capsys: Capsys, tmp_path: Path) -> None:
    data = tmp_path / "never"
    code, _, err = run(capsys, "--data", str(data), "read", "bad\x01id")
    assert code == 2
    assert "control character" in one_error_line(err)
    assert not data.exists()


def test_read_json_and_after(capsys: Capsys, data: str) -> None:
    for i in range(3):
        run(capsys, "--data", data, "append", "c", f"a{i}", "--text", f"message {i}")
    entries = json.loads(run(capsys, "--data", data, "read", "c", "--json")[1])
    assert [e["message"]["parts"][0]["text"] for e in entries] == ["message 0", "message 1", "message 2"]
    assert set(entries[0]) == {"append_id", "created_at", "id", "message", "position"}
    after = entries[0]["position"]
    later = json.loads(run(capsys, "--data", data, "read", "c", "--json", "--after", after)[1])
    assert later == entries[1:]


def test_read_window_keeps_whole_turns(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "s", "--text", "be nice", "--role", "system")
    for turn in range(3):
        run(capsys, "--data", data, "append", "c", f"u{turn}", "--text", f"question {turn}")
        run(capsys, "--data", data, "append", "c", f"b{turn}", "--text", f"answer {turn}",
            "--role", "assistant")
    code, out, _ = run(capsys, "--data", data, "read", "c", "--window", "4")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0] == "[system] system: be nice"
    assert lines[1].endswith("user: question 2") and lines[2].endswith("assistant: answer 2")
    messages = json.loads(run(capsys, "--data", data, "read", "c", "--window", "4", "--json")[1])
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]


def test_read_window_smaller_than_the_newest_turn_exits_2(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "u", "--text", "q")
    run(capsys, "--data", data, "append", "c", "b", "--text", "a", "--role", "assistant")
    code, _, err = run(capsys, "--data", data, "read", "c", "--window", "1")
    assert code == 2
    one_error_line(err)


def test_read_max_bytes_keeps_the_crossing_turn_and_says_what_it_left_out(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "u1", "--text", "old question")
    run(capsys, "--data", data, "append", "c", "u2", "--text", "new question")
    code, out, _ = run(capsys, "--data", data, "read", "c", "--max-bytes", "1")
    assert code == 0
    assert out.splitlines() == ["… older messages left out (over the byte budget)", "[2:2] user: new question"]
    load = json.loads(run(capsys, "--data", data, "read", "c", "--max-bytes", "100000", "--json")[1])
    assert load["truncated"] is False and [e["id"] for e in load["entries"]] == ["u1/0", "u2/0"]


def test_read_turn_sources_and_measure(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "u1", "--text", "q")
    run(capsys, "--data", data, "append", "c", "a1", "--text", "a", "--role", "assistant")
    code, out, _ = run(capsys, "--data", data, "read", "c", "--max-bytes", "1000", "--turn-sources", "--json")
    sources = json.loads(out)
    assert code == 0 and sources["truncated"] is False
    assert [(s["id"], s["role"], s["interrupted"]) for s in sources["sources"]] == [
        ("u1/0", "user", False), ("a1/0", "assistant", False)]
    assert sources["sources"][0]["content"] == {"parts": [{"kind": "text", "text": "q"}], "role": "user"}
    measure = json.loads(run(capsys, "--data", data, "read", "c", "--measure", "--after", "1:1", "--json")[1])
    assistant = b'{"parts":[{"kind":"text","text":"a"}],"role":"assistant"}'
    assert measure == {"messages": 1, "content_bytes": len(assistant), "turns": 1}
    code, _, err = run(capsys, "--data", data, "read", "c", "--turn-sources")
    assert code == 2 and "--max-bytes" in one_error_line(err)


# --------------------------------------------------------------------------- stats / tail / rebuild / demo


def test_stats_json_parses_and_the_table_shows_counts(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "a", "--text", "x")
    run(capsys, "--data", data, "append", "c", "a", "--text", "y")
    stats = json.loads(run(capsys, "--data", data, "stats", "--json")[1])
    assert stats["accepted"] == 1 and stats["lag"] == [0] and stats["poison"] == []
    table = run(capsys, "--data", data, "stats")[1]
    assert re.search(r"accepted\s+1", table)


def test_tail_no_follow_prints_the_last_records(capsys: Capsys, data: str) -> None:
    for i in range(5):
        run(capsys, "--data", data, "append", "c", f"a{i}", "--text", f"m{i}")
    run(capsys, "--data", data, "clear", "c")
    code, out, _ = run(capsys, "--data", data, "tail", "--no-follow", "--lines", "3")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert "append  c  a3" in lines[0] and "append  c  a4" in lines[1]
    assert lines[2].endswith("clear   c")


def wait_for(out: io.StringIO, text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_tail_follow_prints_accepted_messages_and_clears(data: str) -> None:
    out, stop, ready = io.StringIO(), threading.Event(), threading.Event()
    with HistoryEngine.open(data) as engine:
        engine.append(Batch("old", "a", [Message.user("before the tail started")]))
        thread = threading.Thread(target=follow, args=(engine, out), kwargs={"stop": stop, "ready": ready.set})
        thread.start()
        try:
            assert ready.wait(timeout=10), "follow never became ready"
            batch = Batch("c", "a1", [Message.user("where is A1?"), Message.assistant("on its way")])
            engine.append(batch)
            engine.append(batch)  # a retry: no new record, nothing printed
            wait_for(out, "on its way")  # (a clear applied first would take the messages with it)
            engine.clear("c")
            wait_for(out, "cleared")
        finally:
            stop.set()
            thread.join(timeout=10)
    assert out.getvalue().splitlines() == [
        "c  [1:1] user: where is A1?",
        "c  [1:2] assistant: on its way",
        "c  cleared",
    ]


def test_rebuild_gives_identical_read_output(capsys: Capsys, data: str) -> None:
    for i in range(4):
        run(capsys, "--data", data, "append", "c", f"a{i}", "--text", f"m{i}", "--role",
            "user" if i % 2 == 0 else "assistant")
    run(capsys, "--data", data, "append", "d", "a", "--text", "gone")
    run(capsys, "--data", data, "clear", "d")
    before = run(capsys, "--data", data, "read", "c", "--json")[1]
    code, out, err = run(capsys, "--data", data, "rebuild")
    assert code == 0
    assert "replayed 6 records" in out
    assert "rebuild" in err  # the progress bar
    assert run(capsys, "--data", data, "read", "c", "--json")[1] == before
    assert run(capsys, "--data", data, "append", "d", "b", "--text", "back?")[0] == 3


def test_demo_exits_0_and_prints_the_rebuild_check(capsys: Capsys, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "demo", "--data", str(tmp_path / "demo"))
    assert code == 0, out
    assert "rebuild: identical state ✓" in out
    assert "AppendConflict (expected)" in out and "ConversationClosed (expected)" in out
    # A second run in the same directory still works (it picks fresh conversation ids).
    assert run(capsys, "demo", "--data", str(tmp_path / "demo"))[0] == 0


def test_demo_defaults_to_a_temporary_directory(capsys: Capsys, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert "temporary directory" in out
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_an_explicit_url_but_ignores_histlog_url(capsys: Capsys, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo closes a conversation and rebuilds in process: never on a server's history. Like
    every HISTLOG_* variable, HISTLOG_URL does not redirect it."""
    code, _, err = run(capsys, "--url", "http://127.0.0.1:9", "demo")
    assert code == 2
    assert "without --url" in one_error_line(err)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HISTLOG_URL", "http://127.0.0.1:9")
    code, out, _ = run(capsys, "demo")
    assert code == 0 and "rebuild: identical state ✓" in out


# --------------------------------------------------------------------------- where the history lives


def test_a_locked_data_dir_exits_4(capsys: Capsys, data: str) -> None:
    with HistoryEngine.open(data):
        code, _, err = run(capsys, "--data", data, "list")
    assert code == 4
    assert "locked" in one_error_line(err)


def test_global_options_work_after_the_subcommand(capsys: Capsys, data: str) -> None:
    assert run(capsys, "append", "c", "a", "--text", "x", "--data", data)[0] == 0
    assert run(capsys, "list", "--data", data)[1] == "c\n"
    assert run(capsys, "--data", data, "list")[1] == "c\n"


def test_env_vars_choose_the_data_dir_and_flags_win(capsys: Capsys, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HISTLOG_DATA", str(tmp_path / "env"))
    assert run(capsys, "append", "from-env", "a", "--text", "x")[0] == 0
    assert run(capsys, "list")[1] == "from-env\n"
    assert run(capsys, "list", "--data", str(tmp_path / "flag"))[1] == ""
    assert (tmp_path / "env" / "log").is_dir()


def test_kafka_without_a_state_dir_is_bad_input(capsys: Capsys,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HISTLOG_KAFKA", "localhost:9")
    code, _, err = run(capsys, "list")
    assert code == 2
    assert "--state" in one_error_line(err)


# --------------------------------------------------------------------------- other commands


def test_log_verify_reports_a_clean_log(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "a", "--text", "x")
    code, out, _ = run(capsys, "--data", data, "log", "verify")
    assert code == 0
    assert "clean" in out


def test_log_verify_exits_1_on_damage(capsys: Capsys, data: str) -> None:
    for i in range(3):
        run(capsys, "--data", data, "append", "c", f"a{i}", "--text", f"message number {i}")
    segment = next((Path(data) / "log" / "0").glob("*.log"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 6] ^= 0xFF  # damage in the first record, intact records after it
    segment.write_bytes(bytes(raw))
    code, out, err = run(capsys, "--data", data, "log", "verify")
    assert code == 1
    assert "corruption" in out
    code, _, err = run(capsys, "--data", data, "list")
    assert code == 1
    assert "damaged" in one_error_line(err)


def test_replay_rebuilds_a_custom_projection_from_the_log(capsys: Capsys, data: str) -> None:
    from engine import HistoryEngine
    from schemas import Batch, Message, ToolCallPart

    with HistoryEngine.open(data) as engine:
        for i in range(3):
            engine.append(Batch("c", f"a{i}", [Message.user("hi"),
                                               Message.assistant(ToolCallPart(f"t{i}", "lookup_order", "{}"))]))
    code, out, _ = run(capsys, "--data", data, "replay", "--projection", "examples.projections:ToolUsage")
    assert code == 0, out
    assert "'tool-usage' rebuilt from offset 0" in out
    with HistoryEngine.open(data) as engine:
        assert engine.view("tool-usage").get(b"lookup_order") == b"3"


@pytest.mark.parametrize("spec", ["orders", "no.such.module:X", "examples.projections:Nope", "json:dumps"])
def test_replay_with_a_bad_projection_spec_exits_2(capsys: Capsys, data: str, spec: str) -> None:
    code, _, err = run(capsys, "--data", data, "replay", "--projection", spec)
    assert code == 2
    assert "--projection" in one_error_line(err)


def test_help_exits_0(capsys: Capsys) -> None:
    assert run(capsys, "--help")[0] == 0
    assert run(capsys, "demo", "--help")[0] == 0


def test_progress_bar_without_a_tty_prints_about_every_10_percent() -> None:
    stream = io.StringIO()
    bar = ProgressBar("rebuild", stream)
    for done in range(0, 1001):
        bar(done, 1000)
    bar.finish()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "rebuild: 0% (0/1000)" and lines[-1] == "rebuild: 100% (1000/1000)"
    assert len(lines) == 11


# --------------------------------------------------------------------------- docs


def test_every_subcommand_has_a_section_in_docs_cli_md() -> None:
    docs = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    headings = {line[3:].strip().strip("`") for line in docs.splitlines() if line.startswith("## ")}
    commands = subcommands(build_parser())
    assert {"demo", "append", "read", "list", "clear", "stats", "tail", "rebuild", "replay", "log verify",
            "bench"} <= set(commands)
    missing = [c for c in commands if f"histlog {c}" not in headings]
    assert not missing, f"docs/cli.md lacks a '## histlog <command>' section for: {missing}"


# --------------------------------------------------------------------------- subprocess: no traceback


def _python_m_engine(*args: str, data: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISTLOG_")}
    return subprocess.run([sys.executable, "-m", "engine", "--data", data, *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args", [
    ["read", "bad\x07id"],
    ["read", "c", "--after", "x:y"],
    ["append", "c", "a", "--role", "robot", "--text", "x"],
    ["nope"],
])
def test_python_m_engine_bad_input_is_one_line_and_no_traceback(data: str, args: list[str]) -> None:
    proc = _python_m_engine(*args, data=data)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_python_m_engine_conflict_exits_3(data: str) -> None:
    assert _python_m_engine("append", "c", "a", "--text", "x", data=data).returncode == 0
    proc = _python_m_engine("append", "c", "a", "--text", "y", data=data)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr


@pytest.fixture
def follower(data: str) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISTLOG_")}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--data", data, "tail"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_tail_follows_until_sigterm(follower: subprocess.Popen[str]) -> None:
    assert follower.stderr is not None
    line = follower.stderr.readline()  # printed once it is following, its SIGTERM handler in place
    assert "following" in line
    follower.send_signal(signal.SIGTERM)
    assert follower.wait(timeout=30) == 0


@pytest.mark.parametrize("chosen", [("codec",), ("--only", "codec")], ids=["positional", "only"])
def test_bench_runs_a_quick_benchmark_and_writes_json(capsys: Capsys, tmp_path: Path, chosen: tuple[str, ...]) -> None:
    out_json = tmp_path / "bench.json"
    code, out, _ = run(capsys, "bench", *chosen, "--quick", "--json", str(out_json))
    assert code == 0
    assert "encode+decode" in out
    data = json.loads(out_json.read_text())
    assert data["codec"]["cases"][0]["messages"] == 2


def test_bench_rejects_an_unknown_benchmark(capsys: Capsys) -> None:
    assert run(capsys, "bench", "--only", "nope")[0] == 2
    assert run(capsys, "bench", "nope")[0] == 2


def test_turns_replace_turn_and_include_hidden(capsys: Capsys, data: str) -> None:
    run(capsys, "--data", data, "append", "c", "u1", "--text", "hi")
    code, out, _ = run(capsys, "--data", data, "turns", "c", "--json")
    assert code == 0 and json.loads(out) == [
        {"id": "u1/0", "position": 1, "request_message_id": "u1/0", "assistant_message_id": None, "messages": 1}]
    code, out, _ = run(capsys, "--data", data, "replace-turn", "c", "u1/0", "r1", "--reason", "edit",
                       "--text", "hello", "--answer", "hi there")
    receipt = json.loads(out)
    assert code == 0 and receipt["append_id"] == "r1"
    again = run(capsys, "--data", data, "replace-turn", "c", "u1/0", "r1", "--reason", "edit",
                "--text", "hello", "--answer", "hi there")
    assert again[0] == 0 and json.loads(again[1]) == receipt  # idempotent by append id
    code, _, err = run(capsys, "--data", data, "replace-turn", "c", "u1/0", "r2", "--reason", "edit", "--text", "x")
    assert code == 3 and "not the latest visible turn" in one_error_line(err)
    visible = run(capsys, "--data", data, "read", "c")[1].splitlines()
    assert visible == ["[2:2] user: hello", "[2:3] assistant: hi there"]
    hidden = run(capsys, "--data", data, "read", "c", "--include-hidden")[1].splitlines()
    assert hidden[0] == "[1:1] user: hi (hidden: edit by turn r1/0)" and len(hidden) == 3
    code, _, err = run(capsys, "--data", data, "read", "c", "--include-hidden", "--window", "3")
    assert code == 2 and "--include-hidden" in one_error_line(err)
