"""The summary: the reference's metrics, each a pure function of the recorded facts."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

from servesim.metrics.collector import Collector, RequestRecord, Terminal, latencies
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


def _is_good(r: RequestRecord, sla: Sla) -> bool:
    if r.output_length == 0:
        return sla.e2e_ms is not None and sla.ttft_ms is None and sla.itl_ms is None
    lat = latencies(r)
    assert lat.ttft is not None and lat.e2e is not None
    ttft, e2e = lat.ttft, lat.e2e
    if sla.ttft_ms is not None and ttft > sla.ttft_ms:
        return False
    if sla.e2e_ms is not None and e2e > sla.e2e_ms:
        return False
    return not (
        sla.itl_ms is not None
        and r.output_length > 1
        and (e2e - ttft) / (r.output_length - 1) > sla.itl_ms
    )


def summarize(collector: Collector, *, cost: Cost, sla: Sla, wall_time_ms: float) -> dict[str, Any]:
    """Every summary key of the reference report (plus counts by terminal status)."""
    # One pass in arrival order (the records may be rebuilt one at a time: see Collector);
    # samples in arrays of doubles, a quarter of a list of floats' memory on large runs.
    ttft, ttst, tpot, e2e, waits = (array("d") for _ in range(5))
    completed = rejected = incomplete = 0
    total_in = total_out = reused = first_reused = 0
    duration = 0.0
    good = good_tokens = 0
    for r in collector.all_records():
        if r.queue_wait_ms > 0:
            waits.append(r.queue_wait_ms)
        if r.terminal_status is None:
            incomplete += 1
            continue
        if r.terminal_status is Terminal.REJECTED:
            rejected += 1
            continue
        if r.first_admit_ms is None:
            continue
        completed += 1
        total_in += r.input_length
        total_out += r.output_length
        # A request's reuse: its best admission, a re-admission on a decode rank included.
        reused += max(r.reused_input_tokens, r.decode_reused_input_tokens or 0)
        first_reused += r.first_admission_reused_input_tokens
        if r.terminal_time_ms is not None:
            duration = max(duration, r.terminal_time_ms)
        if sla.any and _is_good(r, sla):
            good += 1
            good_tokens += r.output_length
        lat = latencies(r)
        if lat.ttft is None or lat.e2e is None:
            continue
        ttft.append(lat.ttft)
        e2e.append(lat.e2e)
        if lat.ttst is not None and lat.tpot is not None:
            ttst.append(lat.ttst)
            tpot.append(lat.tpot)
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
