#!/usr/bin/env python3
"""Sweep benchmark: 24 points over the full Mooncake conversation trace (12,031
requests), run one by one, then with ``--jobs 2``, then again (no work), then
(``--ray``) as Ray tasks on a local Ray instance; the tables must be identical
(wall-time columns aside) and the script prints the wall-time ratio of ``--jobs 2``
to one by one.

The points: aggregated 4, 8, 12 and 16 workers; P/D 1:3 (1P+3D to 4P+12D) and 1:1
(2P+2D to 8P+8D) at the same GPU totals; each with the round-robin and the KV
router. "One by one" is ``servesim.sweep(jobs=1)``: the points in this process,
in turn, as a loop around ``servesim.run`` would run them.

    python bench/bench_sweep.py                 # one by one, --jobs 2, rerun
    python bench/bench_sweep.py --ray           # and on a local Ray instance
    python bench/bench_sweep.py --repeat 2      # alternate serial and parallel twice
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servesim.sweeps import WALL_TIME_COLUMNS, SweepResult, sweep

REPO_ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = REPO_ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
ROUTERS = ["round_robin", "kv_router"]


def spec(trace: Path) -> dict[str, Any]:
    """The 24-point sweep file."""
    return {
        "workload": {"trace": str(trace)},
        "fixed": {"sla_ttft_ms": 2000, "sla_itl_ms": 50},
        "grids": [
            {"axes": {"num_workers": {"from": 4, "to": 16, "step": 4}, "router_mode": ROUTERS}},
            {
                "axes": {
                    "pd_1_3": {
                        "zip": {
                            "num_prefill_workers": [1, 2, 3, 4],
                            "num_decode_workers": [3, 6, 9, 12],
                        }
                    },
                    "router_mode": ROUTERS,
                }
            },
            {
                "axes": {
                    "pd_1_1": {
                        "zip": {
                            "num_prefill_workers": [2, 4, 6, 8],
                            "num_decode_workers": [2, 4, 6, 8],
                        }
                    },
                    "router_mode": ROUTERS,
                }
            },
        ],
    }


def timed(label: str, **kwargs: Any) -> tuple[SweepResult, float]:
    started = time.perf_counter()
    result = sweep(**kwargs)
    seconds = time.perf_counter() - started
    print(
        f"{label:<22} {seconds:8.1f} s   {result.ran} run, {result.skipped} skipped, "
        f"{result.failed} failed",
        flush=True,
    )
    return result, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, default=MOONCAKE, help="the trace (default: %(default)s)"
    )
    parser.add_argument(
        "--ray", action="store_true", help="also run the sweep on a local Ray instance"
    )
    parser.add_argument("--repeat", type=int, default=1, help="serial/parallel pairs to time")
    args = parser.parse_args()
    if not args.trace.is_file():
        print(f"bench_sweep: trace not found: {args.trace}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_sweep.") as tmp:
        path = Path(tmp) / "sweep.json"
        path.write_text(json.dumps(spec(args.trace)))
        ratios = []
        tables = []
        for turn in range(args.repeat):
            serial, serial_s = timed(
                f"one by one ({turn + 1})", spec=path, jobs=1, output=Path(tmp) / f"serial{turn}"
            )
            parallel, parallel_s = timed(
                f"--jobs 2 ({turn + 1})", spec=path, jobs=2, output=Path(tmp) / f"jobs{turn}"
            )
            ratios.append(parallel_s / serial_s)
            tables += [serial.table, parallel.table]
        again, again_s = timed("--jobs 2, rerun", spec=path, jobs=2, output=Path(tmp) / "jobs0")
        assert again.ran == 0 and again.skipped == len(again.table), "the rerun did work"
        if args.ray:
            ray_result, _ = timed(
                "--ray (local, 2 CPUs)", spec=path, jobs=2, ray=True, output=Path(tmp) / "ray"
            )
            tables.append(ray_result.table)
        reference = tables[0].drop(WALL_TIME_COLUMNS)
        identical = all(t.drop(WALL_TIME_COLUMNS) == reference for t in tables)
        print(
            f"\npoints: {len(reference)}, failed: {sum(1 for r in reference if r['status'] != 'ok')}"
        )
        print(f"tables identical (wall-time columns aside): {identical}")
        shown = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"--jobs 2 / one by one wall time: {shown} (target <= 0.60)")
        print(f"rerun of a finished sweep: {again_s:.1f} s, no point run")
        return 0 if identical and max(ratios) <= 0.6 else 1


if __name__ == "__main__":
    sys.exit(main())
