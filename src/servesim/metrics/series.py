"""The report's ``series`` section: what the HTML page plots, derived from the request records.

Like the summary, every series is a pure function of the per-request facts
recorded during the run (no sampling inside the loop, so a run with or
without them is the same run). Times are on the simulated clock, in ms.

* ``distributions``: each latency's quantiles 0, 1, ..., 100 over completed
  requests (nearest rank, as the summary's percentiles), an empirical CDF.
* ``over_time``: ``num_points`` buckets of ``bucket_ms`` from 0 to the run's
  end (the latest terminal or token time). Per bucket: requests completed and
  output tokens emitted per second (a request's first token at its first-token
  time, the others spread evenly up to its last token, its mean ITL), mean and
  p90 TTFT and E2E of the completed requests that arrived in it, and the prefix
  reuse of the requests first admitted in it (reused / input tokens).
* ``pools``: per pool, the state of each rank (``worker x dp_size + rank``, the
  per-request ``*_worker_idx``) at each bucket start: requests queued (routed,
  not yet admitted), requests running (admitted, not ended), and the KV share
  they hold, estimated as prompt plus tokens emitted so far over the rank's
  capacity (``num_gpu_blocks x block_size``). Prefix-cached blocks of ended
  requests are not counted; a preempted request counts as holding its KV.
  Pools of more than :data:`MAX_RANKS_PER_POOL` ranks report the mean and max
  over ranks instead of every rank.
* ``transfers`` (disaggregated runs): quantiles of each request's KV transfer
  (destination reserved to activated) and handoff (prefill done to decode
  admitted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servesim.metrics.collector import RequestRecord, Terminal, latencies
from servesim.metrics.stats import rank

NUM_POINTS = 120
"""Buckets of the over-time series."""
MAX_RANKS_PER_POOL = 64
"""Pools with more ranks report the mean and max over ranks, not each rank."""
_DIGITS = 4  # ms and ratios rounded to 0.1 µs: the page needs no more, the file stays small


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolShape:
    """One pool's ranks, as the series need them."""

    name: str
    """``aggregated``, ``prefill`` or ``decode``."""
    num_ranks: int
    kv_capacity_tokens: int
    """One rank's KV capacity."""


def _round(values: Any) -> list[Any]:
    return [None if v is None or not math.isfinite(v) else round(float(v), _DIGITS) for v in values]


def quantiles(values: Sequence[float]) -> list[float]:
    """Quantiles 0..100 of ``values`` (nearest rank); empty for no values."""
    ordered = sorted(values)
    n = len(ordered)
    return _round(ordered[rank(n, p)] for p in range(101)) if n else []


def build_series(records: Sequence[RequestRecord], pools: Sequence[PoolShape]) -> dict[str, Any]:
    """The ``series`` section of a report (see the module docstring)."""
    done = [
        r
        for r in records
        if r.terminal_status is Terminal.COMPLETED and r.first_admit_ms is not None
    ]
    end = max(
        (t for r in records for t in (r.terminal_time_ms, r.last_token_ms) if t is not None),
        default=0.0,
    )
    bucket = end / NUM_POINTS if end > 0 else 1.0
    out: dict[str, Any] = {
        "distributions": _distributions(done),
        "over_time": _over_time(records, done, bucket),
        "pools": [_pool(records, pool, bucket, end) for pool in pools],
    }
    if any(p.name == "prefill" for p in pools):
        out["transfers"] = {
            "kv_transfer_ms": quantiles(
                [
                    r.destination_activated_ms - r.destination_reserved_ms
                    for r in done
                    if r.destination_activated_ms is not None
                    and r.destination_reserved_ms is not None
                ]
            ),
            "handoff_ms": quantiles(
                [
                    r.decode_admit_ms - r.source_held_ms
                    for r in done
                    if r.decode_admit_ms is not None and r.source_held_ms is not None
                ]
            ),
        }
    return out


def _distributions(done: list[RequestRecord]) -> dict[str, list[float]]:
    lats = [latencies(r) for r in done]
    return {
        "ttft_ms": quantiles([lat.ttft for lat in lats if lat.ttft is not None]),
        "itl_ms": quantiles([lat.tpot for lat in lats if lat.tpot is not None]),
        "e2e_latency_ms": quantiles([lat.e2e for lat in lats if lat.e2e is not None]),
    }


def _index(t: float, bucket: float) -> int:
    return min(int(t // bucket), NUM_POINTS - 1)


def _over_time(
    records: Sequence[RequestRecord], done: list[RequestRecord], bucket: float
) -> dict[str, Any]:
    seconds = bucket / 1000.0
    completed = np.zeros(NUM_POINTS)
    tokens = np.zeros(NUM_POINTS)
    reused = np.zeros(NUM_POINTS)
    prompt = np.zeros(NUM_POINTS)
    ttft: list[list[float]] = [[] for _ in range(NUM_POINTS)]
    e2e: list[list[float]] = [[] for _ in range(NUM_POINTS)]
    for r in done:
        assert r.terminal_time_ms is not None and r.first_admit_ms is not None
        completed[_index(r.terminal_time_ms, bucket)] += 1
        first = _index(r.first_admit_ms, bucket)
        reused[first] += r.first_admission_reused_input_tokens
        prompt[first] += r.input_length
        lat = latencies(r)
        if lat.ttft is not None and lat.e2e is not None:
            ttft[_index(r.arrival_time_ms, bucket)].append(lat.ttft)
            e2e[_index(r.arrival_time_ms, bucket)].append(lat.e2e)
    for r in records:  # tokens reach users whatever the request's end
        if r.first_token_ms is not None and r.last_token_ms is not None:
            _spread_tokens(tokens, r.first_token_ms, r.last_token_ms, r.output_length, bucket)
    return {
        "bucket_ms": round(bucket, _DIGITS),
        "t_ms": _round(i * bucket for i in range(NUM_POINTS)),
        "request_throughput_rps": _round(completed / seconds),
        "output_throughput_tok_s": _round(tokens / seconds),
        "mean_ttft_ms": _round(np.mean(v) if v else None for v in ttft),
        "p90_ttft_ms": _round(sorted(v)[rank(len(v), 90.0)] if v else None for v in ttft),
        "mean_e2e_latency_ms": _round(np.mean(v) if v else None for v in e2e),
        "p90_e2e_latency_ms": _round(sorted(v)[rank(len(v), 90.0)] if v else None for v in e2e),
        "first_admission_prefix_reuse_ratio": _round(
            reused[i] / prompt[i] if prompt[i] else None for i in range(NUM_POINTS)
        ),
    }


def _spread_tokens(tokens: np.ndarray, first: float, last: float, n: int, bucket: float) -> None:
    """Add a request's ``n`` tokens: one at ``first``, ``n - 1`` evenly over ``(first, last]``."""
    tokens[_index(first, bucket)] += 1
    rest = n - 1
    if rest <= 0:
        return
    if last <= first:
        tokens[_index(last, bucket)] += rest
        return
    # The share of (first, last] each bucket covers, times the tokens.
    lo, hi = _index(first, bucket), _index(last, bucket)
    edges = np.clip(np.arange(lo, hi + 2) * bucket, first, last)
    edges[-1] = last
    tokens[lo : hi + 1] += rest * np.diff(edges) / (last - first)


def _pool(
    records: Sequence[RequestRecord], pool: PoolShape, bucket: float, end: float
) -> dict[str, Any]:
    """Queued, running and KV share per rank of one pool at each bucket start."""
    n = pool.num_ranks
    queued = np.zeros((n, NUM_POINTS + 1))
    running = np.zeros((n, NUM_POINTS + 1))
    kv_const = np.zeros((n, NUM_POINTS + 1))
    kv_slope = np.zeros((n, NUM_POINTS + 1))
    reused = np.zeros(n)
    prompt = np.zeros(n)
    for r in records:
        phases = _phases(r, pool.name, end)
        if phases is None:
            continue
        rank_id, route, admit, release = phases
        _add(queued, rank_id, route, admit, bucket, 1.0)
        _add(running, rank_id, admit, release, bucket, 1.0)
        _add_kv(kv_const, kv_slope, r, pool.name, rank_id, admit, release, bucket)
        if r.terminal_status is Terminal.COMPLETED and pool.name != "decode":
            reused[rank_id] += r.first_admission_reused_input_tokens
            prompt[rank_id] += r.input_length
    times = np.arange(NUM_POINTS) * bucket
    queued_now = np.cumsum(queued, axis=1)[:, :NUM_POINTS]
    running_now = np.cumsum(running, axis=1)[:, :NUM_POINTS]
    held = (
        np.cumsum(kv_const, axis=1)[:, :NUM_POINTS]
        + times * np.cumsum(kv_slope, axis=1)[:, :NUM_POINTS]
    )
    kv = held / pool.kv_capacity_tokens
    out: dict[str, Any] = {
        "name": pool.name,
        "num_ranks": n,
        "kv_capacity_tokens": pool.kv_capacity_tokens,
        "prefix_reuse_ratio": _round(
            reused[i] / prompt[i] if prompt[i] else None for i in range(n)
        ),
    }
    if n <= MAX_RANKS_PER_POOL:
        out["per_rank"] = True
        out["queued_requests"] = [_round(row) for row in queued_now]
        out["running_requests"] = [_round(row) for row in running_now]
        out["kv_usage_ratio"] = [_round(row) for row in kv]
    else:
        out["per_rank"] = False
        for key, values in (
            ("queued_requests", queued_now),
            ("running_requests", running_now),
            ("kv_usage_ratio", kv),
        ):
            out[key] = {"mean": _round(values.mean(axis=0)), "max": _round(values.max(axis=0))}
    return out


def _phases(r: RequestRecord, pool: str, end: float) -> tuple[int, float, float, float] | None:
    """(rank, routed, admitted, released) of a request in one pool, or None if it never got there.

    A request never admitted is queued until its end; one never released holds
    its rank until the run's end.
    """
    ended = r.terminal_time_ms if r.terminal_time_ms is not None else end
    if pool == "prefill":
        rank_id, routed, admit = (
            r.prefill_worker_idx,
            r.arrival_time_ms + r.queue_wait_ms,
            r.prefill_admit_ms,
        )
        release = r.source_released_ms if r.source_released_ms is not None else ended
    elif pool == "decode":
        if r.destination_activated_ms is None:
            return None
        rank_id, routed, admit = r.decode_worker_idx, r.destination_activated_ms, r.decode_admit_ms
        release = ended
    else:
        rank_id, routed, admit = (
            r.decode_worker_idx,
            r.arrival_time_ms + r.queue_wait_ms,
            r.first_admit_ms,
        )
        release = ended
    if rank_id is None:
        return None
    if admit is None:
        return rank_id, routed, ended, ended
    return rank_id, routed, admit, max(admit, release)


def _span(start: float, stop: float, bucket: float) -> tuple[int, int]:
    """Bucket starts ``k * bucket`` in ``[start, stop)``, as a range of k."""
    first = min(math.ceil(start / bucket), NUM_POINTS)
    last = min(math.ceil(stop / bucket), NUM_POINTS)
    return first, max(first, last)


def _add(diff: np.ndarray, row: int, start: float, stop: float, bucket: float, v: float) -> None:
    first, last = _span(start, stop, bucket)
    if first < last:
        diff[row, first] += v
        diff[row, last] -= v


def _add_kv(
    const: np.ndarray,
    slope: np.ndarray,
    r: RequestRecord,
    pool: str,
    row: int,
    admit: float,
    release: float,
    bucket: float,
) -> None:
    """KV tokens a request holds on its rank, ``const + slope * t`` piece by piece."""
    if pool == "prefill" or r.first_token_ms is None or r.last_token_ms is None:
        _add(const, row, admit, release, bucket, r.input_length)
        return
    first, last, n = max(admit, r.first_token_ms), r.last_token_ms, r.output_length
    _add(const, row, admit, first, bucket, r.input_length)
    if last > first and n > 1:
        rate = (n - 1) / (last - first)
        _add(const, row, first, last, bucket, r.input_length + 1 - rate * first)
        _add(slope, row, first, last, bucket, rate)
    _add(const, row, max(first, last), release, bucket, r.input_length + n)
