#!/usr/bin/env python3
"""Replay benchmarks: servesim beside the reference on the same inputs, in the same run.

Each benchmark is a scenario in ``../shared/reference/README.md``'s format;
servesim's command line is derived from it by ``refcheck.py argv`` and the
reference runs it through ``refcheck.py reference``, so both simulate exactly
the same thing. For each simulator the script measures:

- process wall time (start to exit of the simulator's own process);
- peak resident set size, from ``getrusage(RUSAGE_CHILDREN)`` inside a small
  wrapper process that runs only that simulator;
- simulated requests per wall second (completed requests / process wall);

then prints the servesim/reference wall-time ratio, key metrics side by side
(to show both ran the same workload) and a markdown table row for the README.
MB means 10^6 bytes. Without the reference's environment, servesim runs alone.

Benchmarks:
  mooncake  the full Mooncake conversation trace (12,031 requests), 16 workers, round robin
  kv        the same, KV router
  disagg    the same trace on 4 prefill and 12 decode workers
  batch     20,000 synthetic requests (2,000 in, 300 out), concurrency 256, 4 workers
  steady    25,000 synthetic requests (1,024 in, 128 out), one every 5 ms, 8 workers
  lowload   10,000 synthetic requests (512 in, 128 out), one every 200 ms, 1 worker
  nooffload the first 3,000 Mooncake requests on 8 workers with a small GPU KV cache
  offload   the same with a host KV tier (native_host_offload)
  workers   the first 2,000 Mooncake requests on 1,000 workers, round robin
  workers10k  the same on 10,000 workers (not in the default set)

    python bench/bench_replay.py                 # all benchmarks but workers10k
    python bench/bench_replay.py batch --venv .reference-venv --servesim "python -m servesim"
    python bench/bench_replay.py --repeat 3      # median of three turns each (noisy machines)
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
REFCHECK = SHARED / "reference" / "refcheck.py"

MOONCAKE = str(SHARED / "data" / "mooncake" / "conversation_trace.jsonl")
ENGINE = {"block_size": 64}
SGLANG_ENGINE = {"backend": "sglang", "block_size": 64, "sglang": {"schedule_policy": "lpm"}}
# A GPU KV cache that multi-turn sessions outgrow, and the same with host offload
# (131,072 bytes per token: Llama-3.1-8B's KV in 16 bits).
SMALL_KV = {"block_size": 64, "num_gpu_blocks": 2500, "kv_cache_bytes_per_token": 131072}
SMALL_KV_HOST = {**SMALL_KV, "native_host_offload": {"num_host_blocks": 20000}}


def mooncake(**cluster: object) -> dict[str, object]:
    """A scenario replaying the Mooncake conversation trace on ``cluster``."""
    return {"trace": MOONCAKE, "trace_block_size": 512, "router_mode": "round_robin", **cluster}


def synthetic(
    count: int, isl: int, osl: int, workers: int, **arrivals: object
) -> dict[str, object]:
    """A scenario of ``count`` synthetic requests on ``workers`` round-robin workers."""
    shape = {"input_tokens": isl, "output_tokens": osl, "request_count": count}
    arrival_interval = arrivals.pop("arrival_interval_ms", None)
    if arrival_interval is not None:
        shape["arrival_interval_ms"] = arrival_interval
    return {
        "synthetic": shape,
        **arrivals,
        "router_mode": "round_robin",
        "num_workers": workers,
        "engine": ENGINE,
    }


BENCHMARKS: dict[str, tuple[str, dict[str, object]]] = {
    "mooncake": (
        "Mooncake conversation trace, 16 workers, round robin",
        mooncake(num_workers=16, engine=ENGINE),
    ),
    "kv": (
        "Mooncake conversation trace, 16 workers, KV router",
        mooncake(router_mode="kv_router", num_workers=16, engine=ENGINE),
    ),
    "disagg": (
        "Mooncake conversation trace, 4 prefill + 12 decode workers, round robin",
        mooncake(
            num_prefill_workers=4,
            num_decode_workers=12,
            prefill_engine=ENGINE,
            decode_engine=ENGINE,
        ),
    ),
    "sglang": (
        "Mooncake conversation trace, 16 SGLang workers (LPM), round robin",
        mooncake(num_workers=16, engine=SGLANG_ENGINE),
    ),
    "batch": (
        "synthetic 2,000 in / 300 out, concurrency 256, 4 workers",
        synthetic(20000, 2000, 300, 4, replay_concurrency=256),
    ),
    "steady": (
        "synthetic 1,024 in / 128 out, one every 5 ms, 8 workers",
        synthetic(25000, 1024, 128, 8, arrival_interval_ms=5),
    ),
    "lowload": (
        "synthetic 512 in / 128 out, one every 200 ms, 1 worker",
        synthetic(10000, 512, 128, 1, arrival_interval_ms=200),
    ),
    "nooffload": (
        "first 3,000 Mooncake requests, 8 workers, small GPU KV (2,500 blocks), no host tier",
        mooncake(max_requests=3000, num_workers=8, engine=SMALL_KV),
    ),
    "offload": (
        "the same with a 20,000-block host tier per worker (32 GB/s each way)",
        mooncake(max_requests=3000, num_workers=8, engine=SMALL_KV_HOST),
    ),
    "workers": (
        "first 2,000 Mooncake requests, 1,000 workers, round robin",
        mooncake(max_requests=2000, num_workers=1000, engine=ENGINE),
    ),
    "workers10k": (
        "first 2,000 Mooncake requests, 10,000 workers, round robin",
        mooncake(max_requests=2000, num_workers=10000, engine=ENGINE),
    ),
}
DEFAULT = [name for name in BENCHMARKS if name != "workers10k"]

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
    p.add_argument(
        "benchmarks",
        nargs="*",
        metavar="BENCHMARK",
        help=f"any of {', '.join(BENCHMARKS)} (default: all but workers10k)",
    )
    p.add_argument("--venv", type=Path, default=REPO_ROOT / ".reference-venv")
    p.add_argument("--servesim", default=default_servesim(), help="command that starts servesim")
    p.add_argument("--out", type=Path, default=None, help="directory for reports (a temp dir)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each simulator this many times, in turns, and report the median wall of each",
    )
    args = p.parse_args()
    unknown = [name for name in args.benchmarks if name not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    return args


def measure(argv: list[str], stats_path: Path, report_path: Path) -> Run:
    """Run argv in the wrapper; return its wall, peak RSS and report summary."""
    subprocess.run([sys.executable, "-c", WRAPPER, str(stats_path), *argv], check=True)
    stats = json.loads(stats_path.read_text())
    if stats["rc"] != 0:
        sys.exit(f"command exited {stats['rc']}: {shlex.join(argv)}")
    summary = json.loads(report_path.read_text())["summary"]
    return Run(stats["wall_s"], stats["maxrss_kb"] * 1024 / 1e6, summary)


def cut_trace(scenario: Path, out_dir: Path) -> Path:
    """The scenario as servesim must be given it: a ``max_requests`` trace cut to a file.

    ``refcheck.py reference`` cuts the trace itself, but ``refcheck.py argv``
    puts the whole trace on servesim's command line (servesim has no flag for
    it), so without this servesim would replay every request of the trace.
    """
    sc = json.loads(scenario.read_text())
    limit = sc.pop("max_requests", None)
    if limit is None or "trace" not in sc:
        return scenario
    cut = out_dir / "trace.jsonl"
    with open(sc["trace"]) as fin, open(cut, "w") as fout:
        for n, line in enumerate(fin):
            if n >= limit:
                break
            fout.write(line)
    sc["trace"] = str(cut)
    path = out_dir / "scenario.servesim.json"
    path.write_text(json.dumps(sc, indent=1))
    return path


def run_servesim(cmd: str, scenario: Path, out_dir: Path) -> Run:
    report = out_dir / "servesim.json"
    scenario = cut_trace(scenario, out_dir)
    printed = subprocess.run(
        [sys.executable, str(REFCHECK), "argv", str(scenario), str(report), "--servesim", cmd],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    argv = [*shlex.split(printed), "--quiet"]
    print(f"servesim:  {shlex.join(argv)}", flush=True)
    return measure(argv, out_dir / "servesim.stats.json", report)


def run_reference(venv: Path, scenario: Path, out_dir: Path) -> Run:
    report = out_dir / "reference.json"
    argv = [str(venv / "bin" / "python"), str(REFCHECK), "reference", str(scenario), str(report)]
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


def ratio_cell(ratios: list[float]) -> str:
    """The median of the turns' ratios, with their range when there were several turns."""
    if not ratios:
        return "n/a"
    median = sorted(ratios)[(len(ratios) - 1) // 2]
    if len(ratios) == 1:
        return f"{median:.2f}"
    return f"{median:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def table_row(title: str, ours: Run, ref: Run | None, ratios: list[float]) -> str:
    cells = [
        title,
        f"{ours.summary.get('completed_requests', 0):,}",
        f"{ours.wall_s:.1f} s",
        f"{ref.wall_s:.1f} s" if ref else "n/a",
        ratio_cell(ratios),
        f"{ours.peak_rss_mb:.0f} MB" + (f" ({ref.peak_rss_mb:.0f} MB)" if ref else ""),
        f"{ours.requests_per_s:,.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def median_run(runs: list[Run]) -> Run:
    """The run with the median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.wall_s)[(len(runs) - 1) // 2]


def run_benchmark(name: str, args: argparse.Namespace, out_root: Path) -> str:
    title, scenario = BENCHMARKS[name]
    out_dir = out_root / name
    out_dir.mkdir(parents=True, exist_ok=True)
    scenario_path = out_dir / "scenario.json"
    scenario_path.write_text(json.dumps({"name": name, **scenario}, indent=1))
    print(f"\n## {name}: {title}\nreports:   {out_dir}")
    with_reference = (args.venv / "bin" / "python").exists() and REFCHECK.exists()
    if not with_reference:
        print(f"reference: not run: no virtual environment at {args.venv}; servesim alone")
    # The two simulators take turns, so a slow spell of the machine hits both.
    ours_runs, ref_runs, ratios = [], [], []
    for _ in range(args.repeat):
        ours_runs.append(run_servesim(args.servesim, scenario_path, out_dir))
        if with_reference:
            ref_runs.append(run_reference(args.venv, scenario_path, out_dir))
            ratios.append(ours_runs[-1].wall_s / ref_runs[-1].wall_s)
    ours = median_run(ours_runs)
    ref = median_run(ref_runs) if ref_runs else None
    # Each turn's ratio pairs runs made moments apart: their median cancels slow spells best.
    ratio = sorted(ratios)[(len(ratios) - 1) // 2] if ratios else None
    print()
    print_run("servesim", ours)
    if ref:
        print_run("reference", ref)
        spread = f" (runs: {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""
        print(f"ratio servesim/reference (process wall, median of turns): {ratio:.2f}{spread}")
        if ours.summary.get("completed_requests") != ref.summary.get("completed_requests"):
            print(
                "WARNING: the simulators completed different request counts: not the same workload"
            )
    print_metrics(ours, ref)
    return table_row(title, ours, ref, ratios)


def main() -> int:
    args = parse_args()
    # Byte-compile servesim's sources first, as installing a package does: an editable
    # install under PYTHONDONTWRITEBYTECODE would otherwise compile them in every run.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO_ROOT / "src")], check=True)
    out_root = args.out or Path(tempfile.mkdtemp(prefix="bench-replay-"))
    rows = [run_benchmark(name, args, out_root) for name in (args.benchmarks or DEFAULT)]
    print(
        "\n| benchmark | requests | servesim | reference | ratio (turns) | peak RSS (reference) "
        "| servesim req/s |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
