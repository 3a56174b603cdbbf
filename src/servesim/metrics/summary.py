"""The summary: the reference's metrics, each a pure function of the recorded facts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from servesim.metrics.collector import Collector, Facts, Terminal
from servesim.metrics.stats import describe


@dataclass(frozen=True, slots=True, kw_only=True)
class Sla:
    """Goodput bounds; a request is good when every bound given holds (<=)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def any(self) -> bool:
        """Whether any bound is set."""
        return self.ttft_ms is not None or self.itl_ms is not None or self.e2e_ms is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """Worker-seconds and GPUs per worker of each pool (aggregated workers count as decode)."""

    prefill_worker_seconds: float = 0.0
    decode_worker_seconds: float = 0.0
    prefill_gpus_per_worker: int = 0
    decode_gpus_per_worker: int = 0


def _dist(out: dict[str, Any], name: str, stats: dict[str, float], suffix: str = "_ms") -> None:
    for stat, value in stats.items():
        out[f"{stat}_{name}{suffix}"] = value


def _good(
    sla: Sla, output: np.ndarray, ttft: np.ndarray, e2e: np.ndarray, timed: np.ndarray
) -> np.ndarray:
    """Mask of the completed requests within every bound of ``sla`` (``ttft`` and ``e2e``
    are NaN where ``timed`` is False: a request with no token, good only by an E2E bound
    alone, as the reference counts it)."""
    good = timed.copy()
    if sla.ttft_ms is not None:
        good &= ttft <= sla.ttft_ms
    if sla.e2e_ms is not None:
        good &= e2e <= sla.e2e_ms
    if sla.itl_ms is not None:
        many = output > 1
        itl = np.divide(e2e - ttft, output - 1, out=np.zeros_like(e2e), where=many)
        good &= ~many | (itl <= sla.itl_ms)
    if sla.e2e_ms is not None and sla.ttft_ms is None and sla.itl_ms is None:
        good |= output == 0
    return good


def summarize(
    collector: Collector, f: Facts, *, cost: Cost, sla: Sla, wall_time_ms: float
) -> dict[str, Any]:
    """Every summary key of the reference report (plus counts by terminal status), from the
    collector's sketches and every request's facts ``f`` (:meth:`Collector.facts`)."""
    # Columns in arrival order; samples go to describe() in that order (its sums are
    # plain sequential sums, as the reference's).
    waits = f["queue_wait_ms"]
    waits = waits[waits > 0]
    done = f.completed
    completed = int(np.count_nonzero(done))
    # Never fitting: rejected by a rank, or (disaggregated) a destination that failed.
    rejected = int(np.count_nonzero(f.ended(Terminal.REJECTED) | f.ended(Terminal.FAILED)))
    incomplete = int(np.count_nonzero(f.terminal < 0))
    inputs, outputs = f["input_length"][done], f["output_length"][done]
    total_in, total_out = int(inputs.sum()), int(outputs.sum())
    # A request's reuse: its best admission, a re-admission on a decode rank included.
    decode_reused = np.nan_to_num(f["decode_reused_input_tokens"][done], nan=0.0)
    reused = int(np.maximum(f["reused_input_tokens"][done], decode_reused).sum())
    first_reused = int(f["first_admission_reused_input_tokens"][done].sum())
    ends = f["terminal_time_ms"][done]
    duration = float(ends[~np.isnan(ends)].max(initial=0.0))
    arrival, first, last = (
        f[name][done] for name in ("arrival_time_ms", "first_token_ms", "last_token_ms")
    )
    timed = ~np.isnan(first) & ~np.isnan(last)
    ttft_all = np.maximum(0.0, first - arrival)
    e2e_all = np.maximum(0.0, last - arrival)
    ttft, e2e = ttft_all[timed], e2e_all[timed]
    two = timed & (outputs >= 2)
    first2 = first[two]
    ttst = np.maximum(0.0, f["second_token_ms"][done][two] - first2)
    tpot = np.maximum(0.0, last[two] - first2) / (outputs[two] - 1)
    good = good_tokens = 0
    if sla.any:
        good_mask = _good(sla, outputs, ttft_all, e2e_all, timed)
        good, good_tokens = int(np.count_nonzero(good_mask)), int(outputs[good_mask].sum())
    seconds = max(duration / 1000.0, 1e-9)
    wall_s = wall_time_ms / 1000.0
    out: dict[str, Any] = {
        "num_requests": collector.num_requests,
        "completed_requests": completed,
        "rejected_requests": rejected,
        "incomplete_requests": incomplete,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_ms": duration,
        "wall_time_ms": wall_time_ms,
        "request_throughput_rps": completed / seconds,
        "input_throughput_tok_s": total_in / seconds,
        "output_throughput_tok_s": total_out / seconds,
        "total_throughput_tok_s": (total_in + total_out) / seconds,
        "processed_tokens": total_in + total_out,
        "processed_tokens_per_s": (total_in + total_out) / wall_s if wall_s > 0 else 0.0,
        "processed_output_tokens_per_s": total_out / wall_s if wall_s > 0 else 0.0,
        "prefill_worker_seconds": cost.prefill_worker_seconds,
        "decode_worker_seconds": cost.decode_worker_seconds,
        "prefill_gpus_per_worker": cost.prefill_gpus_per_worker,
        "decode_gpus_per_worker": cost.decode_gpus_per_worker,
        "gpu_hours": (
            cost.prefill_worker_seconds * cost.prefill_gpus_per_worker
            + cost.decode_worker_seconds * cost.decode_gpus_per_worker
        )
        / 3600.0,
        "prefix_cache_reused_ratio": reused / total_in if total_in else 0.0,
        "first_admission_prefix_cache_reused_ratio": (first_reused / total_in if total_in else 0.0),
        "committed_prefill_tokens": collector.committed_prefill_tokens,
        # The block pool evicts least recently used inactive blocks (the reference's only policy).
        "kv_eviction_policy": "lru",
        # No power model: the reference reports both as null without one.
        "power_w": None,
        "power_coverage": None,
        "num_ttft_samples": len(ttft),
        "num_tpot_samples": len(tpot),
        "num_e2e_latency_samples": len(e2e),
    }
    _dist(out, "ttft", describe(ttft))
    _dist(out, "ttst", describe(ttst))
    _dist(out, "tpot", describe(tpot))
    _dist(out, "itl", collector.itl.describe())
    _dist(out, "e2e_latency", describe(e2e))
    _dist(out, "output_token_throughput_per_user", collector.per_user.describe(), suffix="")
    out["router_queued_requests"] = len(waits)
    _dist(out, "router_queue_wait", describe(waits))
    if sla.any:
        out["goodput_completed_requests"] = good
        out["goodput_request_throughput_rps"] = good / seconds
        out["goodput_output_throughput_tok_s"] = good_tokens / seconds
    return {
        k: (v if not isinstance(v, float) or math.isfinite(v) else None)
        for k, v in sorted(out.items())
    }
