"""Telemetry: periodic samples of traffic and of every worker's scheduler, in the reference's shape.

A run with ``--telemetry-interval-ms I`` publishes a *baseline* sample once
time 0 has settled (gauges only), a *periodic* sample at each multiple of
``I`` (after that instant has settled, or between events when nothing happens
then), and a *final* sample at the run's end when the last interval is not
empty. Each sample closes an interval::

    baseline(0)   periodic(I)   periodic(2I)   ...   final(end)
        |-----------|-------------|----- ... ----------|
          traffic,    traffic,                 traffic,
          counters    counters                 counters

*Traffic* counts what happened in the interval: arrivals, and the completed
requests' prompt and output lengths, TTFT and mean ITL; the KV router's
overlap ratios at routing; decode request-forwards and the tokens they made
visible (``avg_accept_length``, 1.0 without speculative decoding).
*Gauges* are each (worker, rank)'s published counts (see
:mod:`servesim.engine.worker`: the state after its latest pass end or
submit). *Interval counters* are the pool's preemptions in the interval
and, as the reference's SGLang engine reports them, the prefix-cache hit
and prompt tokens of its prefill chunks (its vLLM engine reports none).

Sampling observes and never changes the run: a sample between events runs
no settle loop and prices no worker time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from servesim.engine.scheduler import RankGauges
from servesim.metrics.collector import RequestRecord, latencies


class TrafficWindow:
    """What the workload did since the last drain: arrivals, completions, router overlaps."""

    __slots__ = (
        "arrivals",
        "completed",
        "hit_count",
        "hit_sum",
        "isl_sum",
        "itl_count",
        "itl_sum",
        "osl_sum",
        "ttft_count",
        "ttft_sum",
    )

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.arrivals = 0
        self.completed = 0
        self.isl_sum = 0
        self.osl_sum = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.itl_sum = 0.0
        self.itl_count = 0
        self.hit_sum = 0.0
        self.hit_count = 0

    def on_arrival(self) -> None:
        """A request reached the cluster."""
        self.arrivals += 1

    def on_completed(self, record: RequestRecord) -> None:
        """A request completed (a rejected one is no completion)."""
        self.completed += 1
        self.isl_sum += record.input_length
        self.osl_sum += record.output_length
        lat = latencies(record)
        if lat.ttft is not None and lat.ttft > 0.0:
            self.ttft_sum += lat.ttft
            self.ttft_count += 1
        if lat.tpot is not None:
            self.itl_sum += lat.tpot
            self.itl_count += 1

    def on_routed(self, overlap_blocks: int, isl_blocks: int) -> None:
        """The KV router placed a request whose target held ``overlap_blocks`` of its blocks."""
        if isl_blocks > 0:
            self.hit_sum += overlap_blocks / isl_blocks
            self.hit_count += 1

    def drain(self, duration_ms: float, forwards: int, tokens: int) -> dict[str, Any]:
        """The interval's traffic (``duration_ms`` long) as the report writes it; then start afresh."""
        out = {
            "duration_s": duration_ms / 1000.0,
            "arriving_requests": self.arrivals,
            "completed_requests": self.completed,
            "avg_isl": self.isl_sum / self.completed if self.completed else 0.0,
            "avg_osl": self.osl_sum / self.completed if self.completed else 0.0,
            "avg_ttft_ms": self.ttft_sum / self.ttft_count if self.ttft_count else 0.0,
            "avg_itl_ms": self.itl_sum / self.itl_count if self.itl_count else 0.0,
            "ttft_count": self.ttft_count,
            "itl_count": self.itl_count,
            "avg_router_kv_hit_rate": self.hit_sum / self.hit_count if self.hit_count else 0.0,
            "router_kv_hit_rate_count": self.hit_count,
            "avg_accept_length": tokens / forwards if forwards else None,
            "accept_length_forward_count": forwards,
        }
        self._reset()  # in place: the ledger and the flow hold this window
        return out

    @property
    def empty(self) -> bool:
        """Nothing was observed since the last drain."""
        return not (self.arrivals or self.completed or self.hit_count)


class PublishingWorker(Protocol):
    """What telemetry reads of a worker (see :class:`servesim.engine.worker.Worker`)."""

    worker_id: int
    published: list[RankGauges] | None
    decode_forwards: int
    decode_tokens: int
    cache_hit_tokens: int
    cache_total_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolView:
    """One pool as a sample sees it: its workers by lifecycle state."""

    active: Sequence[PublishingWorker]
    starting: Sequence[int] = ()
    draining: Sequence[PublishingWorker] = ()


def _gauge_rows(workers: Sequence[PublishingWorker]) -> list[dict[str, Any]]:
    rows = []
    for worker in sorted(workers, key=lambda w: w.worker_id):
        assert worker.published is not None, "telemetry turned on the workers' gauges"
        for rank, g in enumerate(worker.published):
            rows.append(
                {
                    "worker_id": worker.worker_id,
                    "dp_rank": rank,
                    "active_blocks": g.active_blocks,
                    "inactive_blocks": g.inactive_blocks,
                    "total_blocks": g.total_blocks,
                    "active_cache_usage": g.active_blocks / g.total_blocks,
                    "physical_cache_usage": (g.active_blocks + g.inactive_blocks) / g.total_blocks,
                    "running_requests": g.running,
                    "waiting_requests": g.waiting,
                }
            )
    return rows


class Telemetry:
    """The samples of one run, and the cadence of the periodic ones.

    Periodic sample times are ``k x interval`` (no drift from repeated
    addition). Counters (forwards, preemptions) are cumulative on the
    workers; a sample reports their growth since the previous one, over the
    workers that sample sees.
    """

    def __init__(self, interval_ms: float, traffic: TrafficWindow) -> None:
        self.interval_ms = interval_ms
        self.traffic = traffic
        self.samples: list[dict[str, Any]] = []
        self._ordinal = 1  # the next periodic multiple of the interval
        self._last_ms = 0.0
        # Cumulative counters at the previous sample, by (pool name, worker id).
        self._seen: dict[tuple[str, int], tuple[int, int, int, int, int]] = {}

    @property
    def next_ms(self) -> float:
        """When the next periodic sample is due."""
        return self._ordinal * self.interval_ms

    def baseline(self, now: float, pools: dict[str, PoolView], pending: tuple[int, int]) -> None:
        """The first sample, once time ``now`` (0) has settled: gauges only."""
        self._sample("baseline", now, pools, pending)

    def periodic(self, now: float, pools: dict[str, PoolView], pending: tuple[int, int]) -> None:
        """The sample due at ``now`` (== :attr:`next_ms`)."""
        self._sample("periodic", now, pools, pending)
        self._ordinal += 1

    def final(self, now: float, pools: dict[str, PoolView], pending: tuple[int, int]) -> None:
        """The run ended at ``now``: a last sample if time advanced or something happened."""
        if now > self._last_ms or not self.traffic.empty:
            self._sample("final", now, pools, pending)

    def section(self) -> dict[str, Any]:
        """The report's ``telemetry`` section."""
        return {"sample_interval_ms": self.interval_ms, "samples": self.samples}

    def _sample(
        self, kind: str, now: float, pools: dict[str, PoolView], pending: tuple[int, int]
    ) -> None:
        baseline = kind == "baseline"
        forwards = tokens = 0
        interval: dict[str, dict[str, int]] = {}
        for name in ("prefill", "decode"):
            pool = pools.get(name)
            counted = [0, 0, 0]  # preemptions, cache hit tokens, cache total tokens
            for worker in [*pool.active, *pool.draining] if pool is not None else []:
                assert worker.published is not None
                counts = (
                    worker.decode_forwards,
                    worker.decode_tokens,
                    sum(g.preemptions for g in worker.published),
                    worker.cache_hit_tokens,
                    worker.cache_total_tokens,
                )
                before = self._seen.get((name, worker.worker_id), (0, 0, 0, 0, 0))
                if baseline:  # gauges only: its counters open the first interval
                    continue
                self._seen[name, worker.worker_id] = counts
                forwards += counts[0] - before[0]
                tokens += counts[1] - before[1]
                for i in range(3):
                    counted[i] += counts[2 + i] - before[2 + i]
            interval[name] = {
                "cache_hit_tokens": counted[1],
                "cache_total_tokens": counted[2],
                "preemptions": counted[0],
            }
        sample: dict[str, Any] = {
            "sample_ordinal": len(self.samples),
            "kind": kind,
            "interval_start_ms": self._last_ms,
            "sampled_at_ms": now,
            # The baseline observes gauges only; time 0's arrivals open the first interval.
            "traffic": (TrafficWindow() if baseline else self.traffic).drain(
                now - self._last_ms, forwards, tokens
            ),
            "router_pending_prefill_requests": pending[0],
            "router_pending_decode_requests": pending[1],
        }
        for name in ("prefill", "decode"):
            pool = pools.get(name)
            sample[f"{name}_scheduler_metrics"] = (
                _gauge_rows([*pool.active, *pool.draining]) if pool is not None else []
            )
            sample[f"{name}_interval_metrics"] = interval[name]
            sample[f"active_{name}_ids"] = (
                sorted(w.worker_id for w in pool.active) if pool is not None else []
            )
            sample[f"starting_{name}_ids"] = sorted(pool.starting) if pool is not None else []
            sample[f"draining_{name}_ids"] = (
                sorted(w.worker_id for w in pool.draining) if pool is not None else []
            )
        self.samples.append(sample)
        self._last_ms = now
