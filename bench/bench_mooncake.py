#!/usr/bin/env python3
"""Replay the Mooncake conversation trace on servesim and on the reference; compare speed.

Both simulators replay the same trace (the full
``../shared/data/mooncake/conversation_trace.jsonl`` by default, 12,031 requests)
on 16 aggregated workers with round-robin routing, engine ``{"block_size": 64}``
and trace block size 512, one after the other in the same run. For each it
measures:

- process wall time (start to exit of the simulator's own process);
- peak resident set size, taken from ``getrusage(RUSAGE_CHILDREN)`` inside a
  small wrapper process that runs only that simulator, so one simulator's
  figure never includes the other's;
- simulated requests per wall second (completed requests / process wall).

It prints those figures, the servesim/reference wall-time ratio, a few summary
metrics side by side (to show that both ran the same workload) and a final
markdown table row for a README. The reference is NVIDIA Dynamo's offline
replay, run through ``../shared/reference/refcheck.py reference`` in its own
virtual environment; if that environment is missing, servesim's figures are
printed alone. MB below means 10^6 bytes.

Run from anywhere (standard library only):

    python bench/bench_mooncake.py                      # full trace, a few minutes
    python bench/bench_mooncake.py --max-requests 1000  # quick check
    python bench/bench_mooncake.py --workers 8 --out bench-out --venv .reference-venv \\
        --servesim "python -m servesim"
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
TRACE = SHARED / "data" / "mooncake" / "conversation_trace.jsonl"
REFCHECK = SHARED / "reference" / "refcheck.py"
ENGINE = {"block_size": 64}
TRACE_BLOCK_SIZE = 512
ROUTER_MODE = "round_robin"

# Summary metrics printed side by side.
METRICS = [
    "completed_requests",
    "duration_ms",
    "mean_ttft_ms",
    "mean_itl_ms",
    "prefix_cache_reused_ratio",
]

# Runs argv[2:] as a child, waits for it, and writes its wall time, exit code and
# peak RSS (RUSAGE_CHILDREN: this wrapper's waited-for descendants only) to argv[1].
WRAPPER = """\
import json, resource, subprocess, sys, time
start = time.perf_counter()
rc = subprocess.run(sys.argv[2:]).returncode
wall = time.perf_counter() - start
rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "wall_s": wall, "maxrss_kb": rss_kb}, f)
"""


@dataclass
class Run:
    """One simulator's measured run."""

    wall_s: float
    peak_rss_mb: float
    summary: dict
    in_process_s: float | None = None  # the reference's own timing of the replay call

    @property
    def requests_per_s(self) -> float:
        return self.summary.get("completed_requests", 0) / self.wall_s


def default_servesim() -> str:
    """The servesim script next to this interpreter, else whatever is on PATH."""
    beside = Path(sys.executable).parent / "servesim"
    return shlex.quote(str(beside)) if beside.exists() else "servesim"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workers", type=int, default=16, help="aggregated workers (16)")
    p.add_argument("--max-requests", type=int, default=None, help="first N trace rows (all)")
    p.add_argument("--venv", type=Path, default=REPO_ROOT / ".reference-venv")
    p.add_argument("--servesim", default=default_servesim(), help="command that starts servesim")
    p.add_argument("--out", type=Path, default=None, help="directory for reports (a temp dir)")
    return p.parse_args()


def prepare_trace(max_requests: int | None, out_dir: Path) -> tuple[Path, int]:
    """The trace both simulators replay (the full file, or its first rows) and its size."""
    if max_requests is None:
        with open(TRACE) as f:
            return TRACE, sum(1 for line in f if line.strip())
    subset = out_dir / f"conversation_trace.first{max_requests}.jsonl"
    count = 0
    with open(TRACE) as fin, open(subset, "w") as fout:
        for line in fin:
            if count >= max_requests:
                break
            if line.strip():
                fout.write(line)
                count += 1
    return subset, count


def measure(argv: list[str], stats_path: Path, report_path: Path) -> Run:
    """Run argv in the wrapper; return its wall, peak RSS and report summary."""
    subprocess.run([sys.executable, "-c", WRAPPER, str(stats_path), *argv], check=True)
    stats = json.loads(stats_path.read_text())
    if stats["rc"] != 0:
        sys.exit(f"command exited {stats['rc']}: {shlex.join(argv)}")
    summary = json.loads(report_path.read_text())["summary"]
    return Run(stats["wall_s"], stats["maxrss_kb"] * 1024 / 1e6, summary)


def run_servesim(cmd: str, trace: Path, workers: int, out_dir: Path) -> Run:
    report = out_dir / "servesim.json"
    argv = [
        *shlex.split(cmd),
        "replay",
        str(trace),
        "--num-workers",
        str(workers),
        "--router-mode",
        ROUTER_MODE,
        "--trace-block-size",
        str(TRACE_BLOCK_SIZE),
        "--extra-engine-args",
        json.dumps(ENGINE),
        "--report-json",
        str(report),
        "--quiet",
    ]
    print(f"servesim:  {shlex.join(argv)}", flush=True)
    return measure(argv, out_dir / "servesim.stats.json", report)


def run_reference(venv: Path, trace: Path, workers: int, out_dir: Path) -> Run:
    scenario = {
        "name": "bench_mooncake",
        "trace": str(trace),
        "trace_block_size": TRACE_BLOCK_SIZE,
        "router_mode": ROUTER_MODE,
        "num_workers": workers,
        "engine": ENGINE,
    }
    scenario_path = out_dir / "scenario.json"
    scenario_path.write_text(json.dumps(scenario, indent=1))
    report = out_dir / "reference.json"
    argv = [str(venv / "bin" / "python"), str(REFCHECK), "reference", str(scenario_path)]
    argv.append(str(report))
    print(f"reference: {shlex.join(argv)}", flush=True)
    run = measure(argv, out_dir / "reference.stats.json", report)
    run.in_process_s = json.loads(report.read_text())["in_process_wall_s"]
    return run


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_run(name: str, run: Run) -> None:
    line = f"{name:<10} wall {run.wall_s:8.2f} s"
    if run.in_process_s is not None:
        line += f" (in-process {run.in_process_s:.2f} s)"
    line += f"   peak RSS {run.peak_rss_mb:7.1f} MB   {run.requests_per_s:9,.1f} simulated req/s"
    print(line)


def print_metrics(ours: Run, ref: Run | None) -> None:
    print(f"\n{'metric':<28}{'servesim':>16}{'reference' if ref else '':>16}".rstrip())
    for key in METRICS:
        theirs = fmt(ref.summary.get(key)) if ref else ""
        print(f"{key:<28}{fmt(ours.summary.get(key)):>16}{theirs:>16}".rstrip())


def table_row(workers: int, requests: int, ours: Run, ref: Run | None) -> str:
    ref_cell = f"reference {ref.wall_s:.1f} s" if ref else "reference n/a"
    ratio_cell = f"ratio {ours.wall_s / ref.wall_s:.1f}" if ref else "ratio n/a"
    cells = [
        f"mooncake conversation, {workers} workers, RR",
        f"{requests:,}",
        f"servesim {ours.wall_s:.1f} s",
        ref_cell,
        ratio_cell,
        f"{ours.peak_rss_mb:.0f} MB",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    args = parse_args()
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="bench-mooncake-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    trace, requests = prepare_trace(args.max_requests, out_dir)
    print(f"trace:     {trace} ({requests:,} requests)")
    print(
        f"cluster:   {args.workers} aggregated workers, {ROUTER_MODE}, engine {json.dumps(ENGINE)}"
    )
    print(f"reports:   {out_dir}")

    ours = run_servesim(args.servesim, trace, args.workers, out_dir)
    ref = None
    if (args.venv / "bin" / "python").exists() and REFCHECK.exists():
        ref = run_reference(args.venv, trace, args.workers, out_dir)
    else:
        print(f"reference: not run: no virtual environment at {args.venv} (or no {REFCHECK});")
        print("           see ../shared/reference/README.md to install it. servesim alone:")

    print()
    print_run("servesim", ours)
    if ref:
        print_run("reference", ref)
        print(f"ratio servesim/reference (process wall): {ours.wall_s / ref.wall_s:.2f}")
    print_metrics(ours, ref)
    print()
    print(table_row(args.workers, requests, ours, ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
