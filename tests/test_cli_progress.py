"""The progress bar: on a terminal, requests ended out of the total and the time left, on
stderr; nothing when stderr is not a terminal or with --quiet."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path


def _replay_argv(requests: int) -> list[str]:
    """A synthetic replay of ``requests`` requests."""
    return [
        "replay",
        *("--input-tokens", "500", "--output-tokens", "50", "--request-count", str(requests)),
        *("--request-rate", "200", "--num-workers", "4"),
    ]


ARGV = _replay_argv(20000)
CODE = "from servesim.cli import main; raise SystemExit(main())"
# The bar waits DELAY_S seconds before it appears; a run as fast as the machine makes it
# may end sooner, so the tests that look for frames, or for their absence under --quiet,
# have the bar appear at once.
AT_ONCE = "from servesim import cli; cli._ProgressBar.DELAY_S = 0.0; raise SystemExit(cli.main())"


def _run_on_a_terminal(
    *extra: str, code: str = CODE, argv: list[str] = ARGV
) -> tuple[int, str, str]:
    """Run servesim with stderr on a pseudo-terminal; return (exit code, stdout, terminal)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", code, *argv, *extra],
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = process.communicate(timeout=300)
    os.close(controller)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", seen.decode("utf-8", "replace"))
    return process.returncode, stdout, text


def test_a_terminal_shows_requests_done_of_the_total_and_the_time_left(tmp_path: Path) -> None:
    code, stdout, terminal = _run_on_a_terminal(
        "--report-json", str(tmp_path / "r.json"), code=AT_ONCE
    )
    assert code == 0
    frames = re.findall(r"replaying .*? (\d+)/(\d+) requests (\d+:\d\d:\d\d) ETA", terminal)
    assert frames, terminal
    assert {total for _, total, _ in frames} == {"20000"}
    done = [int(d) for d, _, _ in frames]
    assert done == sorted(done) and 0 < done[-1] <= 20000
    assert "20,000 arrived · 20,000 completed" in stdout and "replaying" not in stdout


def test_quiet_shows_no_progress_even_on_a_terminal() -> None:
    code, stdout, terminal = _run_on_a_terminal("--quiet", code=AT_ONCE)
    assert (code, stdout, terminal) == (0, "", "")


def test_a_run_shorter_than_the_delay_shows_no_bar() -> None:
    # 20 requests replay in milliseconds, far under the bar's one-second delay.
    code, stdout, terminal = _run_on_a_terminal(argv=_replay_argv(20))
    assert (code, terminal) == (0, "")
    assert "20 arrived · 20 completed" in stdout
