"""The public entry point: build a cluster from a :class:`RunConfig`, replay, report."""

from __future__ import annotations

import gc
import math
import random
import time  # only to report the host's wall time beside the simulated results (never the sim clock)
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servesim.cluster.flows import AggregatedFlow, KvObserver
from servesim.cluster.runtime import Flow, Ledger, Pool, Runtime, Stage
from servesim.config import Backend, EngineConfig, RouterConfig
from servesim.engine.kv.disk_tier import DiskTier
from servesim.engine.worker import Worker
from servesim.errors import ConfigError
from servesim.metrics.collector import Collector, RequestRecord
from servesim.metrics.stats import describe
from servesim.metrics.summary import Cost, Sla, summarize
from servesim.router.affinity import MODES as AFFINITY_MODES
from servesim.router.affinity import SessionAffinity
from servesim.router.indexer import KvIndexer
from servesim.router.kv_router import KvRouter
from servesim.router.routing import KvPolicy, PlacementPolicy, RoundRobinPolicy
from servesim.workload.admission import Admission, AdmissionQueue
from servesim.workload.agentic import AgenticGraph, AgenticQueue
from servesim.workload.formats import (
    DEFAULT_TRACE_BLOCK_SIZE,
    TraceOptions,
    canonical_format,
    read_trace,
)
from servesim.workload.mooncake import STDIN
from servesim.workload.request import Session
from servesim.workload.sharing import mark_shared_blocks
from servesim.workload.stream import StreamPlan, StreamQueue, stream_plan
from servesim.workload.synthetic import synthetic_sessions


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticWorkload:
    """Fixed-length requests with unique prompts, or sessions of turns with shared prefixes.

    Exactly one of ``arrival_interval_ms``, ``request_rate`` and the run's
    ``replay_concurrency`` sets the pace. ``arrival_seed`` seeds the Poisson
    arrivals (``request_rate``); without it, the run's seed does. Any of
    ``turns_per_session > 1``, ``inter_turn_delay_ms > 0``,
    ``shared_prefix_ratio > 0`` or ``num_prefix_groups > 0`` makes
    ``request_count`` sessions (see :mod:`servesim.workload.synthetic`).
    """

    input_tokens: int
    output_tokens: int
    request_count: int
    arrival_interval_ms: float | None = None
    request_rate: float | None = None
    arrival_seed: int | None = None
    turns_per_session: int = 1
    inter_turn_delay_ms: float = 0.0
    shared_prefix_ratio: float = 0.0
    num_prefix_groups: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Everything one replay needs.

    Exactly one of ``trace`` and ``synthetic`` describes the workload; a
    ``dynamo`` trace may have more shards in ``trace_shards``.
    ``trace_block_size`` None means the format's own (512 for Mooncake-like
    formats; the records' or header's for ``dynamo`` and ``agentic_mooncake``).
    Agentic traces replay against ``execution_model``, with at most
    ``agentic_lanes`` plays in flight when set. The
    run is disaggregated when ``prefill_engine`` and ``decode_engine`` are
    given (with ``num_prefill_workers`` and ``num_decode_workers``);
    otherwise ``num_workers`` aggregated workers run ``engine``.
    ``exact_passes`` steps every engine pass as its own event instead of
    fast-forwarding decode-only stretches (same results, slower; the oracle
    fast-forward is tested against). ``keep_records`` False keeps only
    what the summary needs of each ended request (no per-request records
    in the report). ``stream`` reads a one-turn Mooncake trace as the
    replay goes (see :mod:`servesim.workload.stream`): None = when the file
    is larger than :data:`STREAM_BYTES`.
    """

    trace: Path | None = None
    trace_shards: tuple[Path, ...] = ()
    trace_format: str = "mooncake"
    synthetic: SyntheticWorkload | None = None
    trace_block_size: int | None = None
    trace_shared_prefix_ratio: float = 0.0
    trace_num_prefix_groups: int = 0
    execution_model: str | None = None
    agentic_lanes: int | None = None
    arrival_speedup_ratio: float = 1.0
    replay_concurrency: int | None = None
    num_workers: int = 1
    router_mode: str = "round_robin"
    engine: EngineConfig = field(default_factory=EngineConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    session_affinity: str = "disabled"
    kv_event_lag_ms: float = 0.0
    prefill_engine: EngineConfig | None = None
    decode_engine: EngineConfig | None = None
    num_prefill_workers: int = 1
    num_decode_workers: int = 1
    sla: Sla = field(default_factory=Sla)
    max_sim_time_ms: float | None = None
    seed: int = 42
    exact_passes: bool = False
    keep_records: bool = True
    stream: bool | None = None

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run on separate pools."""
        return self.prefill_engine is not None or self.decode_engine is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A finished replay: the summary and the per-request records."""

    summary: dict[str, Any]
    records: list[RequestRecord]
    time_limited: bool


def _workload(config: RunConfig) -> list[Session] | AgenticGraph:
    if (config.trace is None) == (config.synthetic is None):
        raise ConfigError("give either a trace file or a synthetic workload, not both or neither")
    if config.trace is not None:
        workload = read_trace(
            [config.trace, *config.trace_shards],
            TraceOptions(
                trace_format=config.trace_format,
                trace_block_size=config.trace_block_size,
                shared_prefix_ratio=config.trace_shared_prefix_ratio,
                num_prefix_groups=config.trace_num_prefix_groups,
                closed_loop=config.replay_concurrency is not None,
            ),
        )
        if isinstance(workload, AgenticGraph):
            _check_agentic(config)
        elif config.agentic_lanes is not None:
            raise ConfigError("--agentic-lanes applies to agentic traces only")
        return workload
    syn = config.synthetic
    assert syn is not None
    paces = [
        flag
        for flag, value in (
            ("--replay-concurrency", config.replay_concurrency),
            ("--request-rate", syn.request_rate),
            ("--arrival-interval-ms", syn.arrival_interval_ms),
        )
        if value is not None
    ]
    if len(paces) != 1:
        raise ConfigError(
            "synthetic replay needs exactly one of --replay-concurrency, --request-rate and "
            f"--arrival-interval-ms, got {' and '.join(paces) if paces else 'none'}"
        )
    return synthetic_sessions(
        input_tokens=syn.input_tokens,
        output_tokens=syn.output_tokens,
        request_count=syn.request_count,
        # The reference refuses prefill and decode pools with different block sizes (so does _validate).
        block_size=(config.prefill_engine or config.engine).block_size,
        arrival_interval_ms=syn.arrival_interval_ms,
        request_rate=syn.request_rate,
        seed=config.seed if syn.arrival_seed is None else syn.arrival_seed,
        turns_per_session=syn.turns_per_session,
        inter_turn_delay_ms=syn.inter_turn_delay_ms,
        shared_prefix_ratio=syn.shared_prefix_ratio,
        num_prefix_groups=syn.num_prefix_groups,
    )


def _check_agentic(config: RunConfig) -> None:
    """The reference's rules for replaying an agentic graph."""
    if config.replay_concurrency is not None:
        raise ConfigError(
            "agentic traces replay on their own schedule: --replay-concurrency does not apply "
            "(use --agentic-lanes to cap plays in flight)"
        )
    if not config.execution_model:
        raise ConfigError(
            "agentic execution requires a configured target model: give --execution-model NAME"
        )


def _admission(config: RunConfig, workload: list[Session] | AgenticGraph) -> Admission:
    if isinstance(workload, AgenticGraph):
        return AgenticQueue(
            workload, lanes=config.agentic_lanes, speedup=config.arrival_speedup_ratio
        )
    return AdmissionQueue(
        workload, concurrency=config.replay_concurrency, speedup=config.arrival_speedup_ratio
    )


def _trajectory_summary(queue: AgenticQueue, target_model: str) -> dict[str, Any]:
    """The report's trajectory keys, as the reference names them."""
    latencies = queue.trajectory_latencies()
    total = len(queue.plays)
    out: dict[str, Any] = {
        "total_trajectories": total,
        "completed_trajectories": len(latencies),
        "incomplete_trajectories": total - len(latencies),
    }
    stats = describe(latencies)
    for stat, value in stats.items():
        out[f"{stat}_trajectory_e2e_latency_ms"] = value
    out["p50_trajectory_e2e_latency_ms"] = stats["median"]
    graph = queue.graph.summary()
    out["agentic_graph"] = graph
    out["agentic_play_outcomes"] = queue.play_outcomes()
    out["agentic_lifecycle_event_count"] = queue.lifecycle_event_count()
    out["agentic_model_projection"] = {
        "policy": "project_to_configured_target",
        "source_models": graph["source_models"],
        "target_model": target_model,
    }
    return out


def run(config: RunConfig, *, progress: Callable[[int], None] | None = None) -> Report:
    """Replay the workload on the configured cluster and summarise what users would see.

    Python's cyclic garbage collector is paused for the replay (and resumed
    as it was found): see :func:`_collector_paused`.

    Raises:
        ServesimError: bad configuration or workload (ConfigError, TraceError),
            or a simulation that cannot finish (SimulationError).
    """
    _validate(config)
    with _collector_paused():
        return _replay(config, progress)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector, then restore its state.

    A replay allocates millions of small objects (requests, block tables,
    records) and every few thousand allocations the collector runs; each
    full collection walks every live object, the idle workers' included, so
    its cost grows with the cluster: a third of the run on 10,000 workers.
    It finds nothing: a replay makes no reference cycles (a test checks), and
    reference counting frees the rest as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


STREAM_BYTES = 64 << 20
"""One-turn Mooncake traces larger than this are streamed (``RunConfig.stream`` None)."""


def _stream_plan(config: RunConfig) -> StreamPlan | None:
    trace = config.trace
    if (
        trace is None
        or config.stream is False
        or config.trace_shards
        or canonical_format(config.trace_format) != "mooncake"
    ):
        return None
    if config.stream is None:
        try:
            if trace == STDIN or trace.stat().st_size <= STREAM_BYTES:
                return None
        except OSError:
            return None  # reading it reports the problem
    return stream_plan(trace, closed_loop=config.replay_concurrency is not None)


def _replay(config: RunConfig, progress: Callable[[int], None] | None) -> Report:
    plan = _stream_plan(config)
    if plan is not None:
        admission: Admission = StreamQueue(
            plan,
            trace_block_size=config.trace_block_size or DEFAULT_TRACE_BLOCK_SIZE,
            concurrency=config.replay_concurrency,
            speedup=config.arrival_speedup_ratio,
        )
        return _replay_with(config, admission, progress)
    workload = _workload(config)
    engine = config.prefill_engine or config.engine
    if engine.backend is not Backend.SGLANG:
        # The vLLM block pool hashes only blocks another request could match (the
        # radix cache keys every page by its content, so SGLang needs no such look-ahead).
        sessions = (
            [Session(turns=[n.spec for n in workload.nodes])]
            if isinstance(workload, AgenticGraph)
            else workload
        )
        mark_shared_blocks(sessions, engine.block_size)
    return _replay_with(config, _admission(config, workload), progress)


def _replay_with(
    config: RunConfig, admission: Admission, progress: Callable[[int], None] | None
) -> Report:
    engine = config.prefill_engine or config.engine
    collector = Collector(keep_records=config.keep_records)
    ledger = Ledger(collector, admission, progress)
    completions: list[tuple[float, int, int]] = []
    disk = None
    if engine.g3_offload is not None:
        assert engine.kv_cache_bytes_per_token is not None
        disk = DiskTier(engine.g3_offload, engine.block_size * engine.kv_cache_bytes_per_token)
    flow, cost_of = _flow(config, ledger, completions, disk)
    runtime = Runtime(flow, admission, ledger, completions)
    started = time.perf_counter()
    outcome = runtime.run(config.max_sim_time_ms)
    wall_ms = (time.perf_counter() - started) * 1000.0
    cost = cost_of(outcome.worker_seconds)
    summary = summarize(collector, cost=cost, sla=config.sla, wall_time_ms=wall_ms)
    if disk is not None:
        summary["g3_offload"] = disk.summary()
    if isinstance(admission, AgenticQueue):
        assert config.execution_model is not None
        summary.update(_trajectory_summary(admission, config.execution_model))
    return Report(summary=summary, records=collector.records, time_limited=outcome.time_limited)


def _validate(config: RunConfig) -> None:
    if config.router_mode not in ("round_robin", "kv_router"):
        raise ConfigError(
            f"router mode must be 'round_robin' or 'kv_router', got '{config.router_mode}'"
        )
    if config.session_affinity not in AFFINITY_MODES:
        raise ConfigError(
            f"session affinity must be one of {', '.join(AFFINITY_MODES)}, got '{config.session_affinity}'"
        )
    if config.session_affinity != "disabled" and config.router_mode != "kv_router":
        raise ConfigError("session affinity needs --router-mode kv_router")
    lag = config.kv_event_lag_ms
    if not math.isfinite(lag) or lag < 0:
        raise ConfigError(f"kv event lag must be finite and non-negative, got {lag}")
    if lag and config.router_mode != "kv_router":
        raise ConfigError("--kv-event-lag-ms only applies to --router-mode kv_router")
    if config.max_sim_time_ms is not None and config.max_sim_time_ms < 0:
        raise ConfigError(f"max sim time must be non-negative, got {config.max_sim_time_ms}")
    if not config.disaggregated:
        if config.num_workers < 1:
            raise ConfigError(f"number of workers must be at least 1, got {config.num_workers}")
        return
    prefill, decode = config.prefill_engine, config.decode_engine
    if prefill is None or decode is None:
        raise ConfigError("disaggregated replay needs both prefill and decode engine args")
    for name, count in (
        ("prefill", config.num_prefill_workers),
        ("decode", config.num_decode_workers),
    ):
        if count < 1:
            raise ConfigError(f"number of {name} workers must be at least 1, got {count}")
    if prefill.backend != decode.backend:
        raise ConfigError(
            f"prefill and decode pools must use the same backend, got '{prefill.backend}' and '{decode.backend}'"
        )
    if prefill.block_size != decode.block_size:
        raise ConfigError(
            f"prefill and decode pools must use the same block_size, got {prefill.block_size} and {decode.block_size}"
        )


CostOf = Callable[[dict[Stage, float]], Cost]


def _flow(
    config: RunConfig,
    ledger: Ledger,
    completions: list[tuple[float, int, int]],
    disk: DiskTier | None,
) -> tuple[Flow, CostOf]:
    """The flow the config asks for, and how to price its worker-seconds (``disk``: the
    deployment's disk KV tier, under its aggregated workers' host tiers)."""
    fast = not config.exact_passes
    if not config.disaggregated:
        engine = config.engine
        kv = config.router_mode == "kv_router"
        workers = [
            Worker(i, engine, fast_forward=fast, kv_events=kv, disk=disk)
            for i in range(config.num_workers)
        ]
        pool = Pool(Stage.AGGREGATED, workers, completions)
        indexer = KvIndexer() if kv else None
        policy: PlacementPolicy = RoundRobinPolicy([engine.dp_size] * config.num_workers)
        if kv:
            targets = config.num_workers * engine.dp_size
            router = KvRouter(
                config.router,
                targets,
                engine.block_size,
                random.Random(config.seed),
                indexer=indexer,
            )
            policy = KvPolicy(
                router,
                engine.dp_size,
                config.router,
                engine.max_num_batched_tokens,
                affinity=SessionAffinity(config.session_affinity, targets),
            )
        observer = (
            KvObserver(indexer, engine.dp_size, lag_ms=config.kv_event_lag_ms)
            if indexer is not None
            else None
        )
        flow: Flow = AggregatedFlow(
            pool, policy, ledger, block_size=engine.block_size, observer=observer
        )
        return flow, lambda ws: Cost(
            decode_worker_seconds=ws[Stage.AGGREGATED],
            decode_gpus_per_worker=engine.gpus_per_worker,
        )
    prefill, decode = config.prefill_engine, config.decode_engine
    assert prefill is not None and decode is not None
    kv = config.router_mode == "kv_router"
    prefill_pool = Pool(
        Stage.PREFILL,
        [
            Worker(i, prefill, fast_forward=fast, kv_events=kv)
            for i in range(config.num_prefill_workers)
        ],
        completions,
    )
    decode_pool = Pool(
        Stage.DECODE,
        [Worker(i, decode, fast_forward=fast) for i in range(config.num_decode_workers)],
        completions,
    )
    indexer = KvIndexer() if kv else None
    policies: dict[str, PlacementPolicy] = {}
    if kv:
        rng = random.Random(config.seed)
        # Each router's targets are its pool's (worker, rank) pairs, worker-major.
        # The prefill router sees KV events and prefill load; the decode router balances decode load only.
        prefill_router = replace(config.router, router_track_active_blocks=False)
        decode_router = replace(
            config.router,
            overlap_score_credit=0.0,
            router_assume_kv_reuse=False,
            router_track_prefill_tokens=False,
        )
        policies = {
            "prefill_policy": KvPolicy(
                KvRouter(
                    prefill_router,
                    config.num_prefill_workers * prefill.dp_size,
                    prefill.block_size,
                    rng,
                    indexer=indexer,
                ),
                prefill.dp_size,
                prefill_router,
                prefill.max_num_batched_tokens,
                affinity=SessionAffinity(
                    config.session_affinity, config.num_prefill_workers * prefill.dp_size
                ),
            ),
            "decode_policy": KvPolicy(
                KvRouter(
                    decode_router,
                    config.num_decode_workers * decode.dp_size,
                    decode.block_size,
                    rng,
                    indexer=None,
                ),
                decode.dp_size,
                decode_router,
                decode.max_num_batched_tokens,
            ),
        }
    observer = (
        KvObserver(indexer, prefill.dp_size, lag_ms=config.kv_event_lag_ms)
        if indexer is not None
        else None
    )
    # Imported here: the handoff machinery is a fifth of servesim's import time, and an
    # aggregated replay (most of a sweep's short runs) never needs it.
    from servesim.cluster.disagg import DisaggregatedFlow

    flow = DisaggregatedFlow(
        prefill_pool, decode_pool, prefill, decode, ledger, observer=observer, **policies
    )
    return flow, lambda ws: Cost(
        prefill_worker_seconds=ws[Stage.PREFILL],
        decode_worker_seconds=ws[Stage.DECODE],
        prefill_gpus_per_worker=prefill.gpus_per_worker,
        decode_gpus_per_worker=decode.gpus_per_worker,
    )


def count_requests(config: RunConfig) -> int | None:
    """How many requests the workload holds, when known cheaply (for progress bars)."""
    syn = config.synthetic
    if syn is not None:
        return syn.request_count * syn.turns_per_session
    return None
