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

from servesim.metrics.collector import Facts, Terminal
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


@dataclass(frozen=True, slots=True)
class _Columns:
    """The records' facts as arrays (NaN for a time that never came), one entry per request."""

    arrival: np.ndarray
    routed: np.ndarray
    first_admit: np.ndarray
    first_token: np.ndarray
    last_token: np.ndarray
    terminal: np.ndarray
    completed: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    first_reused: np.ndarray
    decode_rank: np.ndarray
    prefill_rank: np.ndarray
    prefill_admit: np.ndarray
    source_released: np.ndarray
    destination_activated: np.ndarray
    decode_admit: np.ndarray


def _columns(f: Facts) -> _Columns:
    ranks = {
        k: np.nan_to_num(f[k], nan=-1.0).astype(np.int64)
        for k in ("decode_worker_idx", "prefill_worker_idx")
    }
    return _Columns(
        arrival=f["arrival_time_ms"],
        routed=f["arrival_time_ms"] + f["queue_wait_ms"],
        first_admit=f["first_admit_ms"],
        first_token=f["first_token_ms"],
        last_token=f["last_token_ms"],
        terminal=f["terminal_time_ms"],
        completed=f.completed,
        input_length=f["input_length"],
        output_length=f["output_length"],
        first_reused=f["first_admission_reused_input_tokens"],
        decode_rank=ranks["decode_worker_idx"],
        prefill_rank=ranks["prefill_worker_idx"],
        prefill_admit=f["prefill_admit_ms"],
        source_released=f["source_released_ms"],
        destination_activated=f["destination_activated_ms"],
        decode_admit=f["decode_admit_ms"],
    )


def build_series(facts: Facts, pools: Sequence[PoolShape]) -> dict[str, Any]:
    """The ``series`` section of a report (see the module docstring), from every request's facts."""
    c = _columns(facts)
    ends = np.concatenate([c.terminal, c.last_token])
    ends = ends[~np.isnan(ends)]
    end = float(ends.max()) if ends.size else 0.0
    bucket = end / NUM_POINTS if end > 0 else 1.0
    out: dict[str, Any] = {
        "distributions": _distributions(c),
        "over_time": _over_time(c, bucket),
        "pools": [_pool(c, pool, bucket, end) for pool in pools],
    }
    if any(p.name == "prefill" for p in pools):
        done = facts.ended(Terminal.COMPLETED)

        def spans(start: str, end: str) -> list[float]:
            ms = facts[end][done] - facts[start][done]
            return quantiles(ms[~np.isnan(ms)].tolist())

        out["transfers"] = {
            "kv_transfer_ms": spans("destination_reserved_ms", "destination_activated_ms"),
            "handoff_ms": spans("source_held_ms", "decode_admit_ms"),
        }
    return out


def _latencies(c: _Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT, E2E, TPOT, has TPOT) of every request, as :func:`latencies` defines them."""
    ttft = np.maximum(0.0, c.first_token - c.arrival)
    e2e = np.maximum(0.0, c.last_token - c.arrival)
    two = c.output_length >= 2
    tpot = np.full_like(ttft, math.nan)
    tpot[two] = np.maximum(0.0, c.last_token[two] - c.first_token[two]) / (c.output_length[two] - 1)
    return ttft, e2e, tpot, two


def _distributions(c: _Columns) -> dict[str, list[float]]:
    ttft, e2e, tpot, two = _latencies(c)
    timed = c.completed & ~np.isnan(c.first_token) & ~np.isnan(c.last_token)
    return {
        "ttft_ms": quantiles(ttft[timed].tolist()),
        "itl_ms": quantiles(tpot[timed & two].tolist()),
        "e2e_latency_ms": quantiles(e2e[timed].tolist()),
    }


def _index(t: np.ndarray, bucket: float) -> np.ndarray:
    """The bucket each time falls in (the last bucket holds the run's end)."""
    index: np.ndarray = np.minimum(np.floor_divide(t, bucket), NUM_POINTS - 1).astype(np.int64)
    return index


def _per_bucket(index: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(index, weights=weights, minlength=NUM_POINTS).astype(np.float64)


def _by_bucket(index: np.ndarray, values: np.ndarray) -> tuple[list[Any], list[Any]]:
    """Mean and p90 (nearest rank) of ``values`` in each bucket; None for an empty bucket."""
    order = np.lexsort((values, index))
    index, values = index[order], values[order]
    starts = np.searchsorted(index, np.arange(NUM_POINTS), side="left")
    stops = np.searchsorted(index, np.arange(NUM_POINTS), side="right")
    means: list[Any] = []
    p90s: list[Any] = []
    for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True):
        if lo == hi:
            means.append(None)
            p90s.append(None)
            continue
        means.append(float(values[lo:hi].mean()))
        p90s.append(float(values[lo + rank(hi - lo, 90.0)]))
    return means, p90s


def _over_time(c: _Columns, bucket: float) -> dict[str, Any]:
    seconds = bucket / 1000.0
    done = c.completed
    completed = _per_bucket(_index(c.terminal[done], bucket))
    first = _index(c.first_admit[done], bucket)
    reused = _per_bucket(first, c.first_reused[done])
    prompt = _per_bucket(first, c.input_length[done])
    ttft, e2e, _, _ = _latencies(c)
    timed = done & ~np.isnan(c.first_token) & ~np.isnan(c.last_token)
    arrived = _index(c.arrival[timed], bucket)
    mean_ttft, p90_ttft = _by_bucket(arrived, ttft[timed])
    mean_e2e, p90_e2e = _by_bucket(arrived, e2e[timed])
    return {
        "bucket_ms": round(bucket, _DIGITS),
        "t_ms": _round(i * bucket for i in range(NUM_POINTS)),
        "request_throughput_rps": _round(completed / seconds),
        "output_throughput_tok_s": _round(_tokens(c, bucket) / seconds),
        "mean_ttft_ms": _round(mean_ttft),
        "p90_ttft_ms": _round(p90_ttft),
        "mean_e2e_latency_ms": _round(mean_e2e),
        "p90_e2e_latency_ms": _round(p90_e2e),
        "first_admission_prefix_reuse_ratio": _round(
            reused[i] / prompt[i] if prompt[i] else None for i in range(NUM_POINTS)
        ),
    }


def _tokens(c: _Columns, bucket: float) -> np.ndarray:
    """Tokens emitted per bucket, whatever the request's end: each request's first at its
    first-token time, its ``n - 1`` others evenly over ``(first, last]``.

    The others are ``G(e_{k+1}) - G(e_k)`` at the bucket edges ``e_k = k x bucket``
    (the last edge at infinity), ``G`` rising linearly from 0 at the first token to
    ``n - 1`` at the last; ``G`` is continuous, so a token on an edge is never split.
    """
    emitted = ~np.isnan(c.first_token) & ~np.isnan(c.last_token)
    first, last, n = c.first_token[emitted], c.last_token[emitted], c.output_length[emitted]
    tokens = _per_bucket(_index(first, bucket))
    rest = n - 1
    burst = (rest > 0) & (last <= first)
    tokens += _per_bucket(_index(last[burst], bucket), rest[burst])
    spread = (rest > 0) & (last > first)
    first, last, rest = first[spread], last[spread], rest[spread]
    rate = rest / (last - first)
    rows = np.zeros(first.size, dtype=np.int64)
    const = np.zeros((1, NUM_POINTS + 1))
    slope = np.zeros((1, NUM_POINTS + 1))
    _add(const, rows, first, last, bucket, -rate * first)
    _add(slope, rows, first, last, bucket, rate)
    _add(const, rows, last, np.full_like(last, math.inf), bucket, rest)
    edges = np.arange(NUM_POINTS) * bucket
    g = np.cumsum(const[0])[:NUM_POINTS] + edges * np.cumsum(slope[0])[:NUM_POINTS]
    g = np.append(g, rest.sum())  # the edge at infinity
    return tokens + np.diff(g)


RANKS_PER_CHUNK = 1024
"""A large pool's ranks are summed and maxed this many at a time (bounded memory)."""


def _pool(c: _Columns, pool: PoolShape, bucket: float, end: float) -> dict[str, Any]:
    """Queued, running and KV share per rank of one pool at each bucket start."""
    n = pool.num_ranks
    rank_id, routed, admit, release = _phases(c, pool.name, end)
    out: dict[str, Any] = {
        "name": pool.name,
        "num_ranks": n,
        "kv_capacity_tokens": pool.kv_capacity_tokens,
        "prefix_reuse_ratio": _reuse_per_rank(c, pool, n),
    }
    keys = ("queued_requests", "running_requests", "kv_usage_ratio")
    if n <= MAX_RANKS_PER_POOL:
        there = rank_id >= 0
        state = _state(c, pool, there, rank_id[there], routed, admit, release, bucket, n)
        out["per_rank"] = True
        for key, values in zip(keys, state, strict=True):
            out[key] = [_round(row) for row in values]
        return out
    # Many ranks: their sum and max, a chunk of ranks at a time, never all ranks' arrays at once.
    total = np.zeros((3, NUM_POINTS))
    peak = np.zeros((3, NUM_POINTS))
    for lo in range(0, n, RANKS_PER_CHUNK):
        hi = min(n, lo + RANKS_PER_CHUNK)
        there = (rank_id >= lo) & (rank_id < hi)
        state = _state(c, pool, there, rank_id[there] - lo, routed, admit, release, bucket, hi - lo)
        for i, values in enumerate(state):
            total[i] += values.sum(axis=0)
            peak[i] = np.maximum(peak[i], values.max(axis=0))
    out["per_rank"] = False
    for i, key in enumerate(keys):
        out[key] = {"mean": _round(total[i] / n), "max": _round(peak[i])}
    return out


def _state(
    c: _Columns,
    pool: PoolShape,
    there: np.ndarray,
    rows: np.ndarray,
    routed: np.ndarray,
    admit: np.ndarray,
    release: np.ndarray,
    bucket: float,
    num_rows: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queued and running requests and KV share of ``num_rows`` ranks at each bucket start,
    from the requests selected by ``there`` (on rows ``rows``)."""
    routed, admit, release = routed[there], admit[there], release[there]
    queued = np.zeros((num_rows, NUM_POINTS + 1))
    running = np.zeros((num_rows, NUM_POINTS + 1))
    kv_const = np.zeros((num_rows, NUM_POINTS + 1))
    kv_slope = np.zeros((num_rows, NUM_POINTS + 1))
    ones = np.ones(rows.size)
    _add(queued, rows, routed, admit, bucket, ones)
    _add(running, rows, admit, release, bucket, ones)
    if pool.name == "prefill":
        _add(kv_const, rows, admit, release, bucket, c.input_length[there])
    else:
        _add_kv(kv_const, kv_slope, c, there, rows, admit, release, bucket)
    times = np.arange(NUM_POINTS) * bucket
    held = (
        np.cumsum(kv_const, axis=1)[:, :NUM_POINTS]
        + times * np.cumsum(kv_slope, axis=1)[:, :NUM_POINTS]
    )
    return (
        np.cumsum(queued, axis=1)[:, :NUM_POINTS],
        np.cumsum(running, axis=1)[:, :NUM_POINTS],
        held / pool.kv_capacity_tokens,
    )


def _reuse_per_rank(c: _Columns, pool: PoolShape, n: int) -> list[Any] | dict[str, Any]:
    """Completed requests' first-admission reuse on each rank (None: none, or a decode pool);
    for a pool of more than :data:`MAX_RANKS_PER_POOL` ranks, its min, mean and max over the
    ranks that completed a request, and how many did."""
    if pool.name == "decode":
        return [None] * n if n <= MAX_RANKS_PER_POOL else {"ranks": 0}
    ranks = c.prefill_rank if pool.name == "prefill" else c.decode_rank
    mine = c.completed & (ranks >= 0)
    reused = np.bincount(ranks[mine], weights=c.first_reused[mine], minlength=n)
    prompt = np.bincount(ranks[mine], weights=c.input_length[mine], minlength=n)
    if n <= MAX_RANKS_PER_POOL:
        return _round(reused[i] / prompt[i] if prompt[i] else None for i in range(n))
    served = prompt > 0
    if not served.any():
        return {"ranks": 0}
    ratios = reused[served] / prompt[served]
    low, mean, high = _round([ratios.min(), ratios.mean(), ratios.max()])
    return {"ranks": int(served.sum()), "min": low, "mean": mean, "max": high}


def _phases(
    c: _Columns, pool: str, end: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each request's (rank, routed, admitted, released) in one pool; rank -1: never there.

    A request never admitted is queued until its end; one never released holds
    its rank until the run's end.
    """
    ended = np.where(np.isnan(c.terminal), end, c.terminal)
    if pool == "prefill":
        rank_id, routed, admit = c.prefill_rank, c.routed, c.prefill_admit
        release = np.where(np.isnan(c.source_released), ended, c.source_released)
    elif pool == "decode":
        rank_id = np.where(np.isnan(c.destination_activated), -1, c.decode_rank)
        routed, admit, release = c.destination_activated, c.decode_admit, ended
    else:
        rank_id, routed, admit, release = c.decode_rank, c.routed, c.first_admit, ended
    never = np.isnan(admit)
    admit = np.where(never, ended, admit)
    release = np.where(never, ended, np.maximum(admit, release))
    return rank_id, routed, admit, release


def _span(start: np.ndarray, stop: np.ndarray, bucket: float) -> tuple[np.ndarray, np.ndarray]:
    """Bucket starts ``k * bucket`` in ``[start, stop)``, as ranges of k."""
    with np.errstate(invalid="ignore"):
        first = np.minimum(np.ceil(start / bucket), NUM_POINTS)
        last = np.minimum(np.ceil(stop / bucket), NUM_POINTS)
    return first.astype(np.int64), np.maximum(first, last).astype(np.int64)


def _add(
    diff: np.ndarray,
    rows: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    bucket: float,
    values: np.ndarray,
) -> None:
    """Add ``values[i]`` to row ``rows[i]`` at every bucket start in ``[start[i], stop[i])``."""
    first, last = _span(start, stop, bucket)
    some = first < last
    np.add.at(diff, (rows[some], first[some]), values[some])
    np.add.at(diff, (rows[some], last[some]), -values[some])


def _add_kv(
    const: np.ndarray,
    slope: np.ndarray,
    c: _Columns,
    there: np.ndarray,
    rows: np.ndarray,
    admit: np.ndarray,
    release: np.ndarray,
    bucket: float,
) -> None:
    """KV tokens each request holds on its rank, ``const + slope * t`` piece by piece:
    its prompt from admission, plus its tokens as emitted (linearly from the first to the
    last), all of them from the last token to its release."""
    length = c.input_length[there]
    n = c.output_length[there]
    first_token, last_token = c.first_token[there], c.last_token[there]
    no_token = np.isnan(first_token) | np.isnan(last_token)
    _add(const, rows[no_token], admit[no_token], release[no_token], bucket, length[no_token])
    has = ~no_token
    rows, admit, release, length, n = rows[has], admit[has], release[has], length[has], n[has]
    first, last = np.maximum(admit, first_token[has]), last_token[has]
    _add(const, rows, admit, first, bucket, length)
    linear = (last > first) & (n > 1)
    rate = np.zeros_like(first)
    rate[linear] = (n[linear] - 1) / (last[linear] - first[linear])
    r, f, la = rows[linear], first[linear], last[linear]
    _add(const, r, f, la, bucket, length[linear] + 1 - rate[linear] * f)
    _add(slope, r, f, la, bucket, rate[linear])
    _add(const, rows, np.maximum(first, last), release, bucket, length + n)
