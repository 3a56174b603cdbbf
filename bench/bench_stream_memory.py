#!/usr/bin/env python3
"""Peak memory of a replay against the number of requests in a Mooncake-style trace.

Writes one-turn Mooncake traces of N requests (default 10,000, 100,000 and
1,000,000) with a steady arrival rate, so the requests in flight stay about
the same whatever N: request i arrives at 2 i ms (500 req/s), has 512 to
2,047 input tokens in 512-token hash ids, the first of them one of 64
shared "system prompt" ids (so prefixes are reused), and 8 to 39 output
tokens. Each trace replays through ``servesim replay`` on 16 workers
(round robin) in its own process; the script prints N, the trace size, the
wall time, the peak resident set size (``getrusage(RUSAGE_CHILDREN)`` in a
wrapper process) and the completed requests.

A trace over ``STREAM_BYTES`` is streamed (read as the replay goes, see
``servesim.workload.stream``) and, with no ``--per-request-jsonl``, only a
compact row of each ended request is kept, so memory should follow the
requests in flight plus those rows. ``--mode stream`` streams at every size,
``--mode whole-file`` never does, for comparison.

    python bench/bench_stream_memory.py                       # 10k, 100k, 1M
    python bench/bench_stream_memory.py --sizes 100000 --mode whole-file
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRAPPER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(code)
"""


def write_trace(path: Path, n: int, seed: int = 7) -> None:
    """N one-turn requests, 2 ms apart (see the module docstring)."""
    rnd = random.Random(seed)
    next_id = 1000
    with path.open("w") as out:
        for i in range(n):
            blocks = rnd.randint(1, 3)
            ids = [rnd.randrange(64), *range(next_id, next_id + blocks)]
            next_id += blocks
            row = {
                "timestamp": 2 * i,
                "input_length": (blocks + 1) * 512 - rnd.randrange(512),
                "output_length": rnd.randint(8, 39),
                "hash_ids": ids,
            }
            out.write(json.dumps(row, separators=(",", ":")) + "\n")


def measure(trace: Path, report: Path, mode: str) -> tuple[float, int, dict[str, object]]:
    """Wall seconds, peak RSS bytes and the summary of one replay."""
    argv = [
        sys.executable,
        "-c",
        WRAPPER,
        sys.executable,
        "-c",
        "import sys; from servesim.cli import main; "
        + {
            "auto": "",
            "stream": "import servesim.simulation as s; s.STREAM_BYTES = 0; ",
            "whole-file": "import servesim.simulation as s; s.STREAM_BYTES = 1 << 62; ",
        }[mode]
        + "sys.exit(main(sys.argv[1:]))",
        "replay",
        str(trace),
        *("--num-workers", "16", "--quiet", "--report-json", str(report)),
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    summary = json.loads(report.read_text())["summary"]
    return wall, int(done.stdout.strip().splitlines()[-1]), summary


def main() -> int:
    """Write each trace, replay it, print one line per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--mode",
        choices=["auto", "stream", "whole-file"],
        default="auto",
        help="stream above STREAM_BYTES (auto), always, or never",
    )
    args = parser.parse_args()
    print("requests  trace MB  wall s  peak RSS MB  completed  max in flight (est.)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            trace = Path(tmp) / f"trace_{n}.jsonl"
            write_trace(trace, n)
            wall, rss, summary = measure(trace, Path(tmp) / "report.json", args.mode)
            mb = trace.stat().st_size / 1e6
            # Little's law: arrival rate x mean time in the system.
            in_flight = 500.0 * float(summary["mean_e2e_latency_ms"]) / 1000.0  # type: ignore[arg-type]
            print(
                f"{n:>8,}  {mb:>8.1f}  {wall:>6.1f}  {rss / 1e6:>11.1f}  "
                f"{summary['completed_requests']:>9,}  {in_flight:>8.1f}",
                flush=True,
            )
            trace.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
