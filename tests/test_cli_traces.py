"""Trace input: gzip read transparently (known by its magic bytes), ``-`` reads stdin, and a file
in another format is named as such."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.cli import main

TRACE = Path(__file__).parents[1] / "examples" / "mooncake_conversation_200.jsonl"
EXPECTED = (
    "expected a Mooncake JSONL trace: one JSON object per line, such as "
    '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}'
)
# The simulator's own speed differs from run to run; every simulated quantity must not.
WALL_CLOCK_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


def _summary(path: Path) -> dict[str, object]:
    summary: dict[str, object] = json.loads(path.read_text())["summary"]
    for key in WALL_CLOCK_KEYS:
        summary.pop(key)
    return summary


def _replay(
    trace: str, report: Path, *, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    code = "from servesim.cli import main; raise SystemExit(main())"
    argv = ["replay", trace, "--num-workers", "2", "--quiet", "--report-json", str(report)]
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        input=stdin.decode("latin-1") if stdin is not None else None,
        capture_output=True,
        text=True,
        encoding="latin-1",
        timeout=120,
        check=False,
    )


def test_gzip_and_stdin_traces_replay_as_the_plain_file(tmp_path: Path) -> None:
    """A gzip trace (named without .gz), and the trace or its gzip on stdin, give the plain
    file's report."""
    packed = tmp_path / "trace.data"
    packed.write_bytes(gzip.compress(TRACE.read_bytes()))
    runs = {
        "plain": _replay(str(TRACE), tmp_path / "plain.json"),
        "gzip": _replay(str(packed), tmp_path / "gzip.json"),
        "stdin": _replay("-", tmp_path / "stdin.json", stdin=TRACE.read_bytes()),
        "stdin-gzip": _replay("-", tmp_path / "stdin-gzip.json", stdin=packed.read_bytes()),
    }
    assert {name: (r.returncode, r.stderr) for name, r in runs.items()} == dict.fromkeys(
        runs, (0, "")
    )
    plain = _summary(tmp_path / "plain.json")
    assert plain["completed_requests"] == 200
    for name in ("gzip", "stdin", "stdin-gzip"):
        assert _summary(tmp_path / f"{name}.json") == plain, name


def _error(tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: Path) -> str:
    code = main(["replay", str(trace), "--quiet"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    return err


def test_csv_trace_is_named_as_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CSV file is called CSV, with the format expected instead."""
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_length,output_length\n0,100,5\n")
    assert _error(tmp_path, capsys, trace) == (
        f"servesim: error: {trace}:1: not a Mooncake trace: this line looks like CSV "
        f"('timestamp,input_length,output_length'); {EXPECTED}\n"
    )


def test_other_text_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Text that is not JSON on its first line is named as not a Mooncake trace."""
    trace = tmp_path / "trace.txt"
    trace.write_text("\n" + "hello world " * 10 + "\n")
    assert _error(tmp_path, capsys, trace) == (
        f"servesim: error: {trace}:2: not a Mooncake trace: this line is not JSON "
        f"('{'hello world ' * 4}hello wor...'); {EXPECTED}\n"
    )


def test_binary_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that are not text (here zstd's magic) are not a trace."""
    trace = tmp_path / "trace.zst"
    trace.write_bytes(b"\x28\xb5\x2f\xfd\x00\xff\xfe\n")
    assert (
        _error(tmp_path, capsys, trace) == f"servesim: error: {trace}: not UTF-8 text; {EXPECTED}\n"
    )


def test_invalid_json_after_the_first_line_keeps_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the first row, a bad line is a broken trace, not another format."""
    trace = tmp_path / "trace.jsonl"
    lines = TRACE.read_text().splitlines()[:2]
    trace.write_text(lines[0] + "\n" + lines[1][:20] + "\n")
    err = _error(tmp_path, capsys, trace)
    assert err.startswith(f"servesim: error: {trace}:2: invalid JSON (")


def test_truncated_gzip_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gzip trace cut short is reported, naming the file, without a traceback."""
    trace = tmp_path / "trace.jsonl.gz"
    trace.write_bytes(gzip.compress(TRACE.read_bytes())[:200])
    err = _error(tmp_path, capsys, trace)
    assert err.startswith(f"servesim: error: {trace}:")
    assert "cannot read the trace: Compressed file ended before the end-of-stream marker" in err
    assert len(err.splitlines()) == 1
