#!/usr/bin/env python3
"""Validate servesim's AIC timing against measured deployments; write docs/validation.md.

    python bench/validate_aic.py                 # every covered row (many minutes)
    python bench/validate_aic.py --limit 20      # a quick look

For every row of ``../shared/data/aiconfigurator/silicon_sample.csv`` (measured
TTFT and TPOT of real deployments) that AIC's database covers, servesim
simulates the deployment with AIC timing and compares:

- agg rows: one worker of ``attention_dp_size`` DP ranks, TP ``tp_size`` (or
  several, round robin, when the concurrency is a multiple of what one worker's
  ranks hold: see :func:`agg_replicas`), fed
  by a closed loop of the measured concurrency (``silicon_concurrency``; else
  ``batch_size``) of ``isl`` prompt and ``osl`` output tokens, ``2 x concurrency``
  requests in all (at least 16). The first wave arrives at once and is a
  warm-up: the statistics are those of the second wave, whose requests arrive
  one by one as earlier ones finish, against a full engine (steady state);
- disagg rows: ``prefill_num_workers`` prefill and ``decode_num_workers``
  decode workers with their own TP and DP, at the concurrency the row's
  ``silicon_concurrency`` names.

TTFT is the steady-state requests' median TTFT, TPOT their mean of
``(last token - first token) / (tokens - 1)``; the report also reads the same
runs over every request (first wave included), as a client that counts them
all would. Each row's relative error is ``simulated / measured - 1``. To tell
AIC's own kernel estimate from servesim's batching and scheduling, every
agg row is also priced by AIC alone as a static batch: ``predict_prefill_latency(1,
isl, 0)`` for TTFT and ``predict_decode_latency(batch per rank, isl + osl / 2, 2)``
for TPOT (no queueing, no chunking, no mixing of prefill and decode). Where
the simulation's error is close to the static estimate's, the error is AIC's.

Rows are skipped, with their reason counted, when AIC lacks the system, the
backend, the model, or cannot build the engine (a model name AIC spells
differently is mapped, see ``MODEL_NAMES``). The measured backend versions
are not AIC's; each row is priced with the database's current version of
its backend. The report is deterministic: same data and package, same file.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "src"))

from servesim import aic  # noqa: E402
from servesim.config import parse_engine_args  # noqa: E402
from servesim.engine.timing import InterpolatedTiming, make_timing  # noqa: E402
from servesim.errors import ServesimError  # noqa: E402
from servesim.simulation import RunConfig, SyntheticWorkload, run  # noqa: E402

SHARED = REPO_ROOT.parent / "shared" / "data"
SILICON = SHARED / "aiconfigurator" / "silicon_sample.csv"
DYNAMO_H200 = SHARED / "dynamo" / "profiling_results" / "H200_TP1P_TP1D"
REPORT = REPO_ROOT / "docs" / "validation.md"
PLOT = REPO_ROOT / "docs" / "validation_scatter.svg"
ROWS = REPO_ROOT / "docs" / "validation_rows.csv"

MODEL_NAMES = {
    "meta-llama/Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", None),
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", None),
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-8B", "fp8"),
    "zhipuai/GLM-5": ("zai-org/GLM-5", None),
    "nvidia/Qwen3-32B-NVFP4": ("Qwen/Qwen3-32B", "nvfp4"),
    "nvidia/DeepSeek-R1-NVFP4": ("deepseek-ai/DeepSeek-R1", "nvfp4"),
}
"""Measured model name -> (AIC's name for the same weights, GEMM precision it implies)."""

MAX_CONCURRENCY = 512
"""Rows measured at a higher concurrency are skipped (the run would take minutes each)."""


@dataclass
class Result:
    """One compared row."""

    row: dict[str, str]
    ttft: float
    tpot: float
    static_ttft: float | None
    static_tpot: float | None
    every_ttft: float
    """Median TTFT of every request, the first wave's included."""
    every_tpot: float
    """Mean TPOT of every request."""

    def error(self, what: str) -> float:
        measured = float(self.row[f"silicon_{what}_ms"])
        return getattr(self, what) / measured - 1.0

    def every_error(self, what: str) -> float:
        measured = float(self.row[f"silicon_{what}_ms"])
        return float(getattr(self, f"every_{what}")) / measured - 1.0

    def static_error(self, what: str) -> float | None:
        value = getattr(self, f"static_{what}")
        return None if value is None else value / float(self.row[f"silicon_{what}_ms"]) - 1.0


def number(row: dict[str, str], key: str, default: int = 1) -> int:
    value = row.get(key, "")
    # A size of 0 in the sample means "not set".
    return int(float(value)) or default if value not in ("", None) else default


def timing(row: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """The ``aic`` timing model of a row (its prefill or decode side with ``prefix``)."""
    model, quant = MODEL_NAMES.get(row["model_path"], (row["model_path"], None))
    spec: dict[str, Any] = {
        "type": "aic",
        "system": row["system"],
        "backend": row["backend"],
        "model": model,
        "tp_size": number(row, f"{prefix}tp_size"),
        "attention_dp_size": number(row, f"{prefix}attention_dp_size"),
    }
    moe_tp, moe_ep = row.get(f"{prefix}moe_tp_size", ""), row.get(f"{prefix}moe_ep_size", "")
    if moe_tp:
        spec["moe_tp_size"] = number(row, f"{prefix}moe_tp_size")
    if moe_ep:
        spec["moe_ep_size"] = number(row, f"{prefix}moe_ep_size")
    gemm = quant or row.get("gemm_quant_mode") or None
    if gemm:
        spec["gemm_quant"] = gemm
    if row.get("moe_quant_mode"):
        spec["moe_quant"] = row["moe_quant_mode"]
    return spec


def engine(row: dict[str, str], prefix: str, role: str, concurrency: int) -> Any:
    dp = number(row, f"{prefix}attention_dp_size")
    raw: dict[str, Any] = {
        "backend": row["backend"],
        "timing_model": timing(row, prefix),
        "dp_size": dp,
        "max_num_seqs": max(256, -(-concurrency // dp)),
        "worker_type": role,
    }
    if row["backend"] == "sglang":
        raw["block_size"] = 64
    return parse_engine_args(raw, source=row["id"], role=role)  # type: ignore[arg-type]


def concurrency_of(row: dict[str, str]) -> int:
    """The benchmark client's concurrency: ``silicon_concurrency`` in the source column
    (an agg row's ``batch_size`` is per attention-DP rank: 16 on 4 ranks is 64)."""
    found = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
    if found is not None:
        return int(found.group(1))
    if row["mode"] == "agg":
        return number(row, "batch_size")
    raise ValueError("no silicon_concurrency")


def agg_replicas(row: dict[str, str], concurrency: int) -> int:
    """Agg workers behind the client: ``batch_size`` is per attention-DP rank, so a
    concurrency of ``k x batch_size x attention_dp_size`` (k > 1: 29 rows) means k
    replicas of the worker, round robin."""
    per_worker = number(row, "batch_size") * number(row, "attention_dp_size")
    if concurrency > per_worker and concurrency % per_worker == 0:
        return concurrency // per_worker
    return 1


def simulate(row: dict[str, str]) -> Result:
    """Replay one row's deployment; raises ServesimError/ValueError when not covered."""
    if number(row, "pp_size") > 1 or number(row, "prefill_pp_size") > 1:
        raise ValueError("pipeline parallelism")
    concurrency = concurrency_of(row)
    if concurrency > MAX_CONCURRENCY:
        raise ValueError(f"concurrency above {MAX_CONCURRENCY}")
    isl, osl = int(row["isl"]), int(row["osl"])
    workload = SyntheticWorkload(
        input_tokens=isl, output_tokens=osl, request_count=max(2 * concurrency, 16)
    )
    if row["mode"] == "agg":
        replicas = agg_replicas(row, concurrency)
        config = RunConfig(
            synthetic=workload,
            replay_concurrency=concurrency,
            engine=engine(row, "", "aggregated", concurrency // replicas),
            num_workers=replicas,
        )
    else:
        config = RunConfig(
            synthetic=workload,
            replay_concurrency=concurrency,
            prefill_engine=engine(row, "prefill_", "prefill", concurrency),
            decode_engine=engine(row, "decode_", "decode", concurrency),
            num_prefill_workers=number(row, "prefill_num_workers"),
            num_decode_workers=number(row, "decode_num_workers"),
        )
    every = sorted(run(config).records, key=lambda r: r.arrival_ms)
    ttfts, tpots = latencies(every[concurrency:])
    every_ttfts, every_tpots = latencies(every)
    static_ttft = static_tpot = None
    if row["mode"] == "agg":
        handle = aic.compile_engine(config.engine.timing_model.aic)
        per_rank = -(-concurrency // (config.engine.dp_size * config.num_workers))
        static_ttft = float(handle.predict_prefill_latency(1, isl, 0))
        static_tpot = float(handle.predict_decode_latency(per_rank, isl + osl // 2, 2))
    return Result(
        row,
        statistics.median(ttfts),
        statistics.fmean(tpots),
        static_ttft,
        static_tpot,
        statistics.median(every_ttfts),
        statistics.fmean(every_tpots),
    )


def latencies(records: list[Any]) -> tuple[list[float], list[float]]:
    """TTFTs and TPOTs of the finished requests among ``records``."""
    ttfts = [r.first_token_ms - r.arrival_ms for r in records if r.first_token_ms is not None]
    tpots = [
        (r.last_token_ms - r.first_token_ms) / (r.num_tokens - 1)
        for r in records
        if r.first_token_ms is not None and r.last_token_ms is not None and r.num_tokens > 1
    ]
    if not ttfts or not tpots:
        raise ValueError("no steady-state request finished")
    return ttfts, tpots


def attempt(row: dict[str, str]) -> tuple[dict[str, str], Result | str]:
    """:func:`simulate`, or why the row is not compared."""
    try:
        return row, simulate(row)
    except (ServesimError, ValueError) as exc:
        return row, reason(exc)
    except Exception as exc:  # a bug in this script or servesim: shown in the table, by type
        return row, f"{type(exc).__name__}: {reason(exc)}"


def reason(exc: BaseException) -> str:
    """A short, row-independent reason: AIC's own words without paths and table keys."""
    text = str(exc).split("perf database error: ")[-1]
    text = re.split(r" \{| at /|; |\(", text)[0]
    text = re.sub(r"^.*?: (?=AIC )", "", text)
    return (text.strip() or type(exc).__name__)[:100]


def stats(errors: list[float]) -> tuple[float, float]:
    """Median and p90 of the absolute relative errors."""
    values = sorted(abs(e) for e in errors)
    p90 = values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]
    return statistics.median(values), p90


def table(results: list[Result], key: str) -> list[str]:
    groups: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        groups[result.row[key]].append(result)
    lines = [
        f"| {key} | rows | TTFT median | TTFT p90 | TPOT median | TPOT p90 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    return lines + [row_line(name, groups[name]) for name in sorted(groups)]


def row_line(name: str, results: list[Result]) -> str:
    ttft = stats([r.error("ttft") for r in results])
    tpot = stats([r.error("tpot") for r in results])
    return f"| {name} | {len(results)} | {ttft[0]:.1%} | {ttft[1]:.1%} | {tpot[0]:.1%} | {tpot[1]:.1%} |"


def write_rows(results: list[Result]) -> None:
    """Every compared row: measured, simulated and AIC-static TTFT and TPOT (ms)."""
    with ROWS.open("w", newline="") as handle:
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(
            ["id", "system", "backend", "model", "mode", "isl", "osl", "concurrency"]
            + [
                f"{k}_{w}_ms"
                for w in ("ttft", "tpot")
                for k in ("measured", "simulated", "every", "static")
            ]
        )
        for r in results:
            static = {"ttft": r.static_ttft, "tpot": r.static_tpot}
            out.writerow(
                [r.row[k] for k in ("id", "system", "backend", "model_path", "mode", "isl", "osl")]
                + [concurrency_of(r.row)]
                + [
                    f"{v:.4f}" if v is not None else ""
                    for w in ("ttft", "tpot")
                    for v in (
                        float(r.row[f"silicon_{w}_ms"]),
                        getattr(r, w),
                        getattr(r, f"every_{w}"),
                        static[w],
                    )
                ]
            )


def by_concurrency(results: list[Result]) -> list[str]:
    """Signed median errors by concurrency: at 1 there is no batching to get wrong."""
    buckets = [(1, 1), (2, 8), (9, 32), (33, 128), (129, MAX_CONCURRENCY)]
    lines = [
        "| agg concurrency | rows | TTFT simulated | TTFT every request | TTFT AIC static "
        "| TPOT simulated | TPOT every request | TPOT AIC static |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lo, hi in buckets:
        group = [
            r for r in results if r.static_ttft is not None and lo <= concurrency_of(r.row) <= hi
        ]
        if not group:
            continue
        cells = []
        for what in ("ttft", "tpot"):
            sim = statistics.median(r.error(what) for r in group)
            every = statistics.median(r.every_error(what) for r in group)
            static = statistics.median(r.static_error(what) or 0.0 for r in group)
            cells += [f"{sim:+.1%}", f"{every:+.1%}", f"{static:+.1%}"]
        name = str(lo) if lo == hi else f"{lo}–{hi}"
        lines.append(f"| {name} | {len(group)} | {' | '.join(cells)} |")
    return lines


def causes(results: list[Result]) -> list[str]:
    """The reading of the attribution tables, with this run's numbers."""
    agg = [r for r in results if r.static_ttft is not None]

    def signed(what: str, group: list[Result], static: bool = False) -> str:
        if not group:
            return "n/a"
        if static:
            return f"{statistics.median(r.static_error(what) or 0.0 for r in group):+.1%}"
        return f"{statistics.median(r.error(what) for r in group):+.1%}"

    low = [r for r in agg if concurrency_of(r.row) <= 32]
    high = [r for r in agg if concurrency_of(r.row) > 128]
    return [
        f"- **TPOT: AIC's kernel estimate is the largest cause.** AIC alone, one decode step "
        f"of the whole batch, is {signed('tpot', agg, True)} off the measurement (signed "
        f"median); the simulation, whose passes also carry prefill chunks, is "
        f"{signed('tpot', agg)}. Both fall short by more as the batch grows (concurrency "
        f"above 128: static {signed('tpot', high, True)}, simulated {signed('tpot', high)}): "
        "AIC's per-step kernel sums likely leave out the engine's per-step host overhead and "
        "under-price large decode batches (AIC's own agg estimates add backend corrections "
        "that `predict_decode_latency` does not). servesim's scheduling moves the estimate "
        "towards the measurement, not away from it. Not fixed here: adding an overhead "
        "per step would be fitting servesim to this sample.",
        f"- **TTFT: queueing dominates, and the measurement protocol is the open question.** "
        f"AIC's prefill of one prompt is {signed('ttft', agg, True)} off: measured TTFTs are "
        "mostly waiting, which only a simulation of the batching supplies. At concurrency "
        f"up to 32 the simulated TTFT is {signed('ttft', low)} off (signed median); above 128 "
        f"it is {signed('ttft', high)}. The sample does not say how its client counted: "
        "read over every request (the first wave, all arriving at once, included) instead "
        "of the steady state, the same runs move towards the measurement at high "
        "concurrency (table below). The largest TTFT cause is named, not fixed: the "
        "benchmark's arrival pattern and warm-up are not in the data.",
        "- **Spread.** The absolute errors are larger than the signed medians: rows err "
        "both ways, by model and system (tables below), which a single correction "
        "could not remove.",
    ]


def every_line(results: list[Result]) -> str:
    ttft = stats([r.every_error("ttft") for r in results])
    tpot = stats([r.every_error("tpot") for r in results])
    return (
        f"| all, every request | {len(results)} | {ttft[0]:.1%} | {ttft[1]:.1%} "
        f"| {tpot[0]:.1%} | {tpot[1]:.1%} |"
    )


def attribution(results: list[Result]) -> list[str]:
    agg = [r for r in results if r.static_ttft is not None]
    lines = [
        "| agg rows | n | simulated: median abs error | AIC static batch: median abs error | median signed error, simulated | median signed error, static |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for what in ("ttft", "tpot"):
        sim = [r.error(what) for r in agg]
        static = [r.static_error(what) for r in agg]
        stat_values = [s for s in static if s is not None]
        lines.append(
            f"| {what.upper()} | {len(agg)} | {stats(sim)[0]:.1%} | {stats(stat_values)[0]:.1%} "
            f"| {statistics.median(sim):+.1%} | {statistics.median(stat_values):+.1%} |"
        )
    return lines


def scatter(results: list[Result]) -> str:
    """An SVG of simulated vs measured TTFT and TPOT, log-log, with the y = x line."""
    width, height, pad = 420, 420, 50
    panels = []
    for index, what in enumerate(("ttft", "tpot")):
        pairs = [(float(r.row[f"silicon_{what}_ms"]), getattr(r, what)) for r in results]
        values = [v for pair in pairs for v in pair if v > 0]
        lo, hi = math.log10(min(values)), math.log10(max(values))
        span = hi - lo or 1.0

        def at(value: float, lo: float = lo, span: float = span) -> float:
            return pad + (math.log10(max(value, 1e-9)) - lo) / span * (width - 2 * pad)

        x0 = index * width
        dots = "".join(
            f'<circle cx="{x0 + at(m):.1f}" cy="{height - at(s):.1f}" r="2" '
            f'fill="{"#1f77b4" if r.row["mode"] == "agg" else "#d62728"}" fill-opacity="0.5"/>'
            for (m, s), r in zip(pairs, results, strict=True)
        )
        ticks = "".join(
            f'<text x="{x0 + at(10**k):.1f}" y="{height - pad + 15}" font-size="10" '
            f'text-anchor="middle">{10**k:g}</text>'
            f'<text x="{x0 + pad - 5}" y="{height - at(10**k) + 3:.1f}" font-size="10" '
            f'text-anchor="end">{10**k:g}</text>'
            for k in range(math.ceil(lo), math.floor(hi) + 1)
        )
        panels.append(
            f'<rect x="{x0 + pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" '
            f'fill="none" stroke="#888"/>'
            f'<line x1="{x0 + pad}" y1="{height - pad}" x2="{x0 + width - pad}" y2="{pad}" '
            f'stroke="#888" stroke-dasharray="4"/>{dots}{ticks}'
            f'<text x="{x0 + width / 2}" y="{pad - 20}" font-size="14" text-anchor="middle">'
            f"{what.upper()} (ms): simulated (y) vs measured (x)</text>"
            f'<text x="{x0 + width / 2}" y="{height - 12}" font-size="11" text-anchor="middle">'
            f"blue: agg, red: disagg; dashed: y = x</text>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
        + "".join(panels)
        + "</svg>\n"
    )


def preset_check() -> list[str]:
    """The interpolated H200 preset against its own measured points."""
    import numpy as np

    timing = make_timing(parse_engine_args({"timing_model": {"profile": "h200-llama3.1-8b-fp8"}}))
    assert isinstance(timing, InterpolatedTiming)
    with np.load(DYNAMO_H200 / "selected_prefill_interpolation" / "raw_data.npz") as prefill:
        pre = [
            abs(timing.prefill_ms(1, int(isl), 0) / float(ttft) - 1)
            for isl, ttft in zip(prefill["prefill_isl"], prefill["prefill_ttft"], strict=True)
        ]
    with np.load(DYNAMO_H200 / "selected_decode_interpolation" / "raw_data.npz") as decode:
        capacity = float(np.ravel(decode["max_kv_tokens"])[0])
        dec = [
            abs(timing.decode_ms(1, round(u * capacity), int(c)) / float(itl) - 1)
            for u, c, itl in zip(
                decode["x_kv_usage"], decode["y_context_length"], decode["z_itl"], strict=True
            )
        ]
    return [
        "| points | n | largest relative error |",
        "|---|---:|---:|",
        f"| prefill (ISL → TTFT) | {len(pre)} | {max(pre):.2e} |",
        f"| decode (KV tokens, context → ITL) | {len(dec)} | {max(dec):.2e} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first LIMIT rows")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args()
    with SILICON.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    results: list[Result] = []
    skipped: Counter[str] = Counter()
    started = time.perf_counter()
    chosen = rows if args.limit is None else rows[: args.limit]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, (row, outcome) in enumerate(pool.imap(attempt, chosen, chunksize=4), 1):
            if isinstance(outcome, Result):
                results.append(outcome)
            else:
                skipped[f"{row['system']}/{row['backend']}: {outcome}"] += 1
            if done % 50 == 0:
                print(f"{done} rows: {len(results)} compared", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    PLOT.write_text(scatter(results))
    write_rows(results)
    REPORT.write_text(render(results, skipped, rows, args.limit) + "\n")
    print(f"{len(results)} rows compared in {elapsed:.0f} s; wrote {REPORT} and {PLOT}")


def render(
    results: list[Result], skipped: Counter[str], rows: list[dict[str, str]], limit: int | None
) -> str:
    ttft = stats([r.error("ttft") for r in results])
    tpot = stats([r.error("tpot") for r in results])
    command = "python bench/validate_aic.py" + (f" --limit {limit}" if limit else "")
    lines = [
        "# Validation: servesim with AIC timing against measured deployments",
        "",
        f"Made by `{command}` (aiconfigurator-core "
        f"{_version()}); the method is in that script's docstring. Measurements: "
        "`../shared/data/aiconfigurator/silicon_sample.csv` "
        f"({len(rows):,} rows, AIConfigurator's silicon sample, Apache-2.0).",
        "",
        f"**{len(results)} rows compared**; {sum(skipped.values())} skipped (below). "
        "Errors are |simulated / measured − 1|.",
        "",
        "| | rows | TTFT median | TTFT p90 | TPOT median | TPOT p90 |",
        "|---|---:|---:|---:|---:|---:|",
        f"| all | {len(results)} | {ttft[0]:.1%} | {ttft[1]:.1%} | {tpot[0]:.1%} | {tpot[1]:.1%} |",
        row_line("agg", [r for r in results if r.row["mode"] == "agg"]),
        row_line("disagg", [r for r in results if r.row["mode"] == "disagg"])
        if any(r.row["mode"] == "disagg" for r in results)
        else "| disagg | 0 | | | | |",
        "",
        "The same runs read as a benchmark client that counts every request, the first "
        "wave (all arriving at once) included:",
        "",
        "| | rows | TTFT median | TTFT p90 | TPOT median | TPOT p90 |",
        "|---|---:|---:|---:|---:|---:|",
        every_line(results),
        "",
        "Targets: median TPOT error ≤ 10%, median TTFT error ≤ 15%.",
        "",
        "![simulated vs measured](validation_scatter.svg)",
        "",
        "## Where the error comes from",
        "",
        "Agg rows priced two ways: the simulation, and AIC alone on a static batch "
        "(prefill of one prompt; one decode step of the whole batch at the mean context). "
        "Where both err alike, the error is AIC's kernel estimate, not servesim's "
        "batching and scheduling.",
        "",
        *attribution(results),
        "",
        *causes(results),
        "",
        "Signed median errors (simulated / measured − 1) by concurrency:",
        "",
        *by_concurrency(results),
        "",
        "Every compared row, with its measured, simulated and AIC-static values: "
        "[validation_rows.csv](validation_rows.csv).",
        "",
        "## By system",
        "",
        *table(results, "system"),
        "",
        "## By backend",
        "",
        *table(results, "backend"),
        "",
        "## By model",
        "",
        *table(results, "model_path"),
        "",
        "## The interpolated H200 preset against its own measurements",
        "",
        "`h200-llama3.1-8b-fp8` (NVIDIA Dynamo 1.6.1's measured H200 profile) at each "
        "measured point:",
        "",
        *preset_check(),
        "",
        "## Rows not compared",
        "",
        "| system/backend: reason | rows |",
        "|---|---:|",
        *[
            f"| {reason} | {n} |"
            for reason, n in sorted(skipped.items(), key=lambda x: (-x[1], x[0]))
        ],
    ]
    return "\n".join(lines)


def _version() -> str:
    from importlib.metadata import version

    return version("aiconfigurator-core")


if __name__ == "__main__":
    main()
