"""What the command's process loads and starts: ``import servesim`` loads nothing, and the
command keeps numpy's BLAS from starting threads it never uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import servesim


def test_importing_the_package_loads_none_of_it() -> None:
    """Names load on first use, so the command can set up its process before numpy loads."""
    code = "import sys, servesim; print(sorted(m for m in sys.modules if m.startswith(('servesim.', 'numpy'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"


def test_every_public_name_loads_on_first_use() -> None:
    for name in servesim.__all__:
        assert getattr(servesim, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        servesim.missing  # noqa: B018


def _threads_once_numpy_loaded(env: dict[str, str], out: Path) -> int:
    """How many threads a long replay run by ``python -m servesim`` has once numpy's BLAS loaded."""
    argv = [
        *(sys.executable, "-m", "servesim", "replay"),
        *("--input-tokens", "1000", "--output-tokens", "1000", "--request-count", "1000000"),
        *("--request-rate", "100", "--num-workers", "4", "--quiet"),
        *("--report-json", str(out)),
    ]
    process = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "openblas" not in Path(f"/proc/{process.pid}/maps").read_text():
            assert process.poll() is None and time.monotonic() < deadline, "numpy never loaded"
            time.sleep(0.01)
        time.sleep(0.2)  # (OpenBLAS starts its pool as it loads)
        return len(os.listdir(f"/proc/{process.pid}/task"))
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_the_command_runs_on_one_thread(tmp_path: Path) -> None:
    """OpenBLAS would start a thread a core as numpy loads (on 2 cores, 20 ms of a run
    and 120 ms of CPU time); the command asks it for none, unless the user set its count."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads_once_numpy_loaded(env, tmp_path / "a.json") == 1
    if (os.cpu_count() or 1) > 1:
        env["OPENBLAS_NUM_THREADS"] = "2"
        assert _threads_once_numpy_loaded(env, tmp_path / "b.json") == 2


def test_a_plain_replay_loads_only_what_it_uses(tmp_path: Path) -> None:
    """Telemetry, agentic graphs, streamed traces, the SGLang engine, the trace toolkit
    and OpenSSL's hashes (file digests) load when a replay uses them: ~8 ms of every
    start-up a plain synthetic replay would otherwise pay."""
    argv = [
        *("replay", "--input-tokens", "100", "--output-tokens", "10", "--request-count", "5"),
        *("--arrival-interval-ms", "10", "--quiet", "--report-json", str(tmp_path / "r.json")),
    ]
    code = (
        "import sys; from servesim import cli; assert cli.main(sys.argv[1:]) == 0; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "servesim.engine.vllm" in loaded  # (it did replay)
    unused = {
        "servesim.metrics.telemetry",
        "servesim.workload.agentic",
        "servesim.workload.stream",
        "servesim.workload.toolkit",
        "servesim.engine.sglang",
        "hashlib",
    }
    assert not unused & loaded


def test_the_command_keeps_what_its_imports_made_out_of_every_collection(tmp_path: Path) -> None:
    """The imports (numpy's and servesim's, some 40,000 tracked objects) run with the collector
    paused and are then frozen: left tracked, the first allocation after them started a
    collection that walked them all, about 11 ms of every run."""
    code = (
        "import gc, os, sys\n"
        "from servesim.__main__ import main\n"
        "exit_now = os._exit\n"
        "def report(code):\n"
        "    print(code, gc.get_freeze_count(), flush=True)\n"
        "    exit_now(code)\n"
        "os._exit = report\n"
        "main()\n"
    )
    argv = [
        *("replay", "--input-tokens", "100", "--output-tokens", "10", "--request-count", "5"),
        *("--arrival-interval-ms", "10", "--quiet", "--report-json", str(tmp_path / "r.json")),
    ]
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    )
    exit_code, frozen = map(int, out.stdout.split())
    assert exit_code == 0
    assert frozen > 20_000
