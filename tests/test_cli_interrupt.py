"""The command as a user runs it (``python -m servesim``, the console script's entry): Ctrl-C,
a reader that stops early, and the output of a run that ends without tearing Python down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _default_sigint() -> None:
    # A process started in the background by a non-interactive shell ignores SIGINT, and a
    # child inherits that; the user's terminal never does, so the test restores the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_stops_a_replay_cleanly(tmp_path: Path) -> None:
    """SIGINT in the middle of a long replay: ``servesim: interrupted``, exit 130, no report,
    no temporary file, no traceback."""
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        "replay",
        *("--input-tokens", "1000", "--output-tokens", "1000", "--request-count", "1000000"),
        *("--request-rate", "100", "--num-workers", "4"),
        *("--report-json", str(out / "report.json"), "--per-request-jsonl", str(out / "r.jsonl")),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "servesim", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        time.sleep(3.0)  # past start-up and into the replay, which takes minutes
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert (process.returncode, stdout, stderr) == (130, "", "servesim: interrupted\n")
    assert list(out.iterdir()) == []


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """``servesim replay ... | head``: stdout is a pipe whose reader has gone; the report file
    is written, nothing goes to stderr, exit 0."""
    trace = Path(__file__).parents[1] / "examples" / "mooncake_conversation_200.jsonl"
    report = tmp_path / "report.json"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: the first write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "servesim", "replay", str(trace), "--report-json", str(report)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
    assert report.is_file()


def test_the_command_flushes_everything_before_it_exits(tmp_path: Path) -> None:
    """The process ends right after the run (no interpreter teardown): the printed report,
    the files and the exit code are complete, for a replay and for a usage error."""
    trace = Path(__file__).parents[1] / "examples" / "mooncake_conversation_200.jsonl"
    report, rows = tmp_path / "report.json", tmp_path / "requests.jsonl"
    argv = [sys.executable, "-m", "servesim", "replay", str(trace), "--num-workers", "2"]
    files = ["--report-json", str(report), "--per-request-jsonl", str(rows)]
    done = subprocess.run([*argv, *files], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("servesim 0.1.0 · simulated serving run\n")
    assert done.stdout.endswith(f"Saved full report to: {report}\n")  # its last line
    assert json.loads(report.read_text())["summary"]["completed_requests"] == 200
    assert len(rows.read_text().splitlines()) == 200
    wrong = subprocess.run([*argv, "--bogus"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert wrong.stdout == ""
    assert "unrecognized arguments: --bogus" in wrong.stderr
