"""Building small replays for tests, without the CLI; writing small traces."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cli import main
from servesim.cluster.disagg import DisaggregatedFlow
from servesim.cluster.flows import AggregatedFlow, KvObserver
from servesim.cluster.runtime import (
    Ledger,
    Pool,
    RunOutcome,
    Runtime,
    ScaleDecision,
    ScalingSnapshot,
    Stage,
)
from servesim.config import EngineConfig, RouterConfig
from servesim.engine.worker import Worker
from servesim.metrics.collector import Collector
from servesim.router.indexer import KvIndexer
from servesim.router.kv_router import KvRouter
from servesim.router.routing import KvPolicy, PlacementPolicy, RoundRobinPolicy
from servesim.simulation import Report
from servesim.workload.admission import AdmissionQueue
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt

HANDOFF_TIMELINE = (
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "first_token_ms",
    "last_token_ms",
)
"""A disaggregated request's record fields, in the order its handoff sets them."""


def replay_aggregated(
    sessions: list[Session],
    config: EngineConfig,
    workers: list[Worker],
    *,
    concurrency: int | None = None,
    max_sim_time_ms: float | None = None,
    kv_router: bool = False,
) -> tuple[Collector, RunOutcome]:
    """Replay ``sessions`` on ``workers`` behind a round-robin router, or with ``kv_router``
    the KV router (default config, seed 0; the workers must record KV events)."""
    collector = Collector()
    admission = AdmissionQueue(sessions, concurrency=concurrency)
    ledger = Ledger(collector, admission, None)
    completions: list[tuple[float, Stage, int]] = []
    policy: PlacementPolicy = RoundRobinPolicy([config.dp_size] * len(workers))
    observer = None
    if kv_router:
        indexer = KvIndexer()
        router_config = RouterConfig()
        targets = len(workers) * config.dp_size
        router = KvRouter(
            router_config, targets, config.block_size, random.Random(0), indexer=indexer
        )
        policy = KvPolicy(router, config.dp_size, router_config, config.max_num_batched_tokens)
        observer = KvObserver(indexer, config.dp_size)
    flow = AggregatedFlow(
        Pool(Stage.AGGREGATED, workers, completions),
        policy,
        ledger,
        block_size=config.block_size,
        observer=observer,
    )
    outcome = Runtime(flow, admission, ledger, completions).run(max_sim_time_ms)
    return collector, outcome


def replay_disaggregated(
    sessions: list[Session],
    prefill: EngineConfig,
    decode: EngineConfig,
    *,
    prefill_workers: int,
    decode_workers: int,
    fast_forward: bool = True,
    concurrency: int | None = None,
    anonymous_prompts: bool = False,
) -> tuple[Collector, DisaggregatedFlow, RunOutcome]:
    """Replay ``sessions`` on a prefill pool and a decode pool (round robin on each);
    ``anonymous_prompts``: the decode ranks keep received prompts unnamed."""
    collector = Collector()
    admission = AdmissionQueue(sessions, concurrency=concurrency)
    ledger = Ledger(collector, admission, None)
    completions: list[tuple[float, Stage, int]] = []
    pools = [
        Pool(
            stage,
            [
                Worker(i, config, fast_forward=fast_forward, anonymous_prompts=anonymous)
                for i in range(count)
            ],
            completions,
        )
        for stage, config, count, anonymous in (
            (Stage.PREFILL, prefill, prefill_workers, False),
            (Stage.DECODE, decode, decode_workers, anonymous_prompts),
        )
    ]
    flow = DisaggregatedFlow(pools[0], pools[1], prefill, decode, ledger)
    outcome = Runtime(flow, admission, ledger, completions).run()
    return collector, flow, outcome


def sessions_of_ids(reqs: Sequence[tuple[Sequence[int], int, float]]) -> list[Session]:
    """One-turn sessions of (hash ids, output tokens, arrival ms): trace prompts of 8-token
    ids, each 2 tokens short of its ids' capacity."""
    cache = BlockContentCache()
    return [
        Session(
            turns=[
                RequestSpec(
                    prompt=TracePrompt(tuple(ids), 8, len(ids) * 8 - 2, cache), output_length=out
                )
            ],
            start_ms=arrival,
        )
        for ids, out, arrival in reqs
    ]


def write_trace(path: Path, rows: Sequence[tuple[float, int, int, Sequence[int]]]) -> Path:
    """Write a Mooncake JSONL trace, one (timestamp ms, input length, output length, hash ids) per row."""
    with path.open("w", encoding="utf-8") as handle:
        for timestamp, input_length, output_length, hash_ids in rows:
            row = {
                "timestamp": timestamp,
                "input_length": input_length,
                "output_length": output_length,
                "hash_ids": list(hash_ids),
            }
            handle.write(json.dumps(row) + "\n")
    return path


def replay_synthetic(
    inputs: int,
    outputs: int,
    count: int,
    engine: Mapping[str, object],
    *,
    exact_passes: bool = False,
    arrival_interval_ms: float | None = 0.0,
    **run_keys: Any,
) -> Report:
    """``count`` synthetic requests of ``inputs`` / ``outputs`` tokens on one worker, arriving
    ``arrival_interval_ms`` apart (all at 0 by default; None with a ``replay_concurrency``
    among ``run_keys``, the other :class:`RunConfig` fields)."""
    return run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=inputs,
                output_tokens=outputs,
                request_count=count,
                arrival_interval_ms=arrival_interval_ms,
            ),
            engine=parse_engine_args(dict(engine)),
            exact_passes=exact_passes,
            **run_keys,
        )
    )


class Schedule:
    """A scripted scaling policy: at each ``(time ms, {stage: target})`` it sets those pool sizes.

    Ticks come at the schedule's times only (the runtime skips those after
    the workload is done); it records each tick's snapshot of pool states.
    """

    def __init__(self, steps: Sequence[tuple[float, Mapping[Stage, int]]]) -> None:
        self._steps = sorted(steps, key=lambda step: step[0])
        self._next = 0
        self.seen: list[tuple[float, dict[Stage, list[str]]]] = []

    def initial_tick_ms(self) -> float:
        """See :class:`~servesim.cluster.runtime.ScalingPolicy`."""
        return self._steps[0][0] if self._steps else math.inf

    def on_tick(self, snapshot: ScalingSnapshot) -> ScaleDecision:
        """See :class:`~servesim.cluster.runtime.ScalingPolicy`."""
        at, targets = self._steps[self._next]
        assert at == snapshot.now_ms
        self.seen.append(
            (at, {s: [st.value for st in p.states] for s, p in snapshot.pools.items()})
        )
        self._next += 1
        after = self._steps[self._next][0] if self._next < len(self._steps) else math.inf
        return ScaleDecision(targets=dict(targets), next_tick_ms=after)


def paid_worker_seconds(transitions: list[dict[str, Any]], workers: int, end_ms: float) -> float:
    """Worker-seconds from the lifecycle log: each worker counts from its start (or 0) to
    its removal (or the end)."""
    changes = [(0.0, workers)]
    for t in transitions:
        if t["prior_state"] is None:
            changes.append((t["at_ms"], +1))
        elif t["state"] == "removed":
            changes.append((t["at_ms"], -1))
    changes.sort(key=lambda c: c[0])
    total, count, since = 0.0, 0, 0.0
    for at, delta in changes:
        total += count * (at - since)
        count, since = count + delta, at
    return (total + count * (end_ms - since)) / 1000.0


def state_at(transitions: list[dict[str, Any]], worker: int | None, at: float, initial: int) -> str:
    """A worker's state when a request arriving at ``at`` was routed (changes at that instant
    before arrivals: readiness; after them: a tick's scale-down)."""
    assert worker is not None
    state = "active" if worker < initial else "absent"
    for t in transitions:
        if t["worker_id"] != worker:
            continue
        if t["at_ms"] < at or (t["at_ms"] == at and t["state"] == "active"):
            state = t["state"]
    return state


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI; return (exit code, stdout, stderr), whether it returns or exits."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
