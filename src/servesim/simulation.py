"""The public entry point: build a cluster from a :class:`RunConfig`, replay, report."""

from __future__ import annotations

import functools
import gc
import math
import os
import random
import sys
import time  # only to report the host's wall time beside the simulated results (never the sim clock)
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim import __version__
from servesim.cluster.flows import AggregatedFlow, KvObserver
from servesim.cluster.runtime import Flow, Ledger, Pool, Runtime, ScalingPolicy, Stage
from servesim.config import Backend, EngineConfig, RouterConfig
from servesim.engine.vllm import NamedPromptsNeeded
from servesim.engine.worker import Worker
from servesim.errors import ConfigError
from servesim.metrics.collector import Collector, RequestRecord
from servesim.metrics.report import (
    document_json,
    parse_report_json,
    report_document,
    write_report_json,
    write_requests_jsonl,
)
from servesim.metrics.series import PoolShape, build_series
from servesim.metrics.stats import describe
from servesim.metrics.summary import Cost, Sla, summarize
from servesim.provenance import input_files, provenance
from servesim.router.affinity import MODES as AFFINITY_MODES
from servesim.router.affinity import SessionAffinity
from servesim.router.indexer import KvIndexer
from servesim.router.kv_router import KvRouter
from servesim.router.round_robin import RoundRobinRouter
from servesim.router.routing import KvPolicy, PlacementPolicy, RoundRobinPolicy
from servesim.workload.admission import Admission, AdmissionQueue
from servesim.workload.formats import (
    DEFAULT_TRACE_BLOCK_SIZE,
    TraceOptions,
    canonical_format,
    read_trace,
)
from servesim.workload.mooncake import STDIN
from servesim.workload.request import Session
from servesim.workload.sharing import mark_shared_blocks, names_any
from servesim.workload.synthetic import synthetic_sessions

# What only some replays use loads when one does (the KV tiers, the planner, telemetry,
# agentic graphs, streamed traces, the HTML page): a start-up costs what it uses.
if TYPE_CHECKING:
    from servesim.cluster.planner import PlannerConfig
    from servesim.engine.kv.disk_tier import DiskTier
    from servesim.engine.kv.host_tier import HostTier
    from servesim.workload.agentic import AgenticGraph, AgenticQueue
    from servesim.workload.stream import StreamPlan


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
    fast-forward is tested against). ``telemetry_interval_ms`` turns on
    telemetry samples (:mod:`servesim.metrics.telemetry`) into the report's
    ``telemetry`` section. ``planner`` runs the planner in the loop
    (:mod:`servesim.cluster.planner`), reported in the ``planner`` section
    (with every tick's input and decision when ``planner_details``).
    ``keep_records`` False keeps only what the summary
    needs of each ended request (no per-request records in the report).
    ``stream`` reads a one-turn Mooncake trace as the replay goes (see
    :mod:`servesim.workload.stream`): None = when the file is larger than
    :data:`STREAM_BYTES`.
    """

    trace: str | os.PathLike[str] | None = None
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
    telemetry_interval_ms: float | None = None
    planner: PlannerConfig | None = None
    planner_details: bool = False
    keep_records: bool = True
    stream: bool | None = None

    def __post_init__(self) -> None:
        if self.trace is not None and not isinstance(self.trace, Path):
            # A str or any path-like names the trace as well as a Path does.
            object.__setattr__(self, "trace", Path(self.trace))

    @property
    def trace_path(self) -> Path | None:
        """The trace as a :class:`~pathlib.Path` (None: a synthetic workload)."""
        return None if self.trace is None else Path(self.trace)

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run on separate pools."""
        return self.prefill_engine is not None or self.decode_engine is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A finished replay: the summary, what was simulated, the plotted series and the records.

    Attributes:
        summary: the reference's summary keys (``docs/report.md``).
        run: the cluster and workload that were simulated (:func:`describe_run`).
        series: what the HTML page plots, derived from the records
            (:mod:`servesim.metrics.series`).
        records: one record per request that arrived, in arrival order.
        time_limited: the run stopped at ``max_sim_time_ms``.
    """

    summary: dict[str, Any]
    run: dict[str, Any]
    series: dict[str, Any]
    records: list[RequestRecord]
    time_limited: bool
    sections: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> Report:
        """A report from the text :meth:`to_json` wrote (or ``--report-json`` saved).

        The file holds no per-request records (the JSONL does): ``records`` is
        empty. ``to_json``, ``table`` and ``to_html`` give what the original gave.

        Raises:
            ReportError: the text is not JSON or lacks a section.
        """
        document = parse_report_json(text, source="report")
        return cls(
            summary=document["summary"],
            run=document["run"],
            series=document["series"],
            records=[],
            time_limited=bool(document["run"].get("time_limited", False)),
            sections={k: v for k, v in document.items() if k not in ("summary", "run", "series")},
        )

    def document(self) -> dict[str, Any]:
        """The report file's content: ``summary``, ``run``, ``series`` and the other sections."""
        return report_document(
            self.summary, run=self.run, series=self.series, sections=self.sections
        )

    def to_json(self) -> str:
        """The report file's text (what ``--report-json`` writes): sorted keys, indent 2."""
        return document_json(self.document())

    def table(self, *, width: int = 100, color: bool = False) -> str:
        """The terminal report as plain text (ANSI colours with ``color``)."""
        from servesim.metrics.terminal import render_text

        return render_text(self.document(), width=width, color=color)

    def to_html(self) -> str:
        """The self-contained HTML page of this run (what ``--html`` writes)."""
        from servesim.metrics.html import render_html

        return render_html(self.document())

    def save(
        self,
        *,
        json_path: str | os.PathLike[str] | None = None,
        jsonl_path: str | os.PathLike[str] | None = None,
        html_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Write any of the report JSON, the per-request JSONL and the HTML page, each whole.

        Raises:
            OSError: a path cannot be written.
        """
        if json_path is not None:
            write_report_json(Path(json_path), self.document())
        if jsonl_path is not None:
            write_requests_jsonl(Path(jsonl_path), self.records)
        if html_path is not None:
            from servesim.metrics.html import write_html

            write_html(Path(html_path), self.document())


def _workload(config: RunConfig) -> list[Session] | AgenticGraph:
    if (config.trace is None) == (config.synthetic is None):
        raise ConfigError("give either a trace file or a synthetic workload, not both or neither")
    if config.trace_path is not None:
        workload = read_trace(
            [config.trace_path, *config.trace_shards],
            TraceOptions(
                trace_format=config.trace_format,
                trace_block_size=config.trace_block_size,
                shared_prefix_ratio=config.trace_shared_prefix_ratio,
                num_prefix_groups=config.trace_num_prefix_groups,
                closed_loop=config.replay_concurrency is not None,
            ),
        )
        if not isinstance(workload, list):  # an agentic graph, not sessions
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


def _round_robin_pools(config: RunConfig, sessions: list[Session]) -> list[int] | None:
    """The KV pool (worker x dp_size + rank) of each session's one request on the pool
    that places it as it arrives (the aggregated pool, or a disaggregated run's prefill
    pool), when that is known before the replay starts (None otherwise).

    It is when round robin places every request on a fixed pool as it is released,
    and every session has one turn: then the release order is the order of start
    times (open loop) or of sessions (closed loop), whatever the timing of the
    replay, and the router's rotation is a function of that order. The same
    admission and rotation as the replay's give it here. (A disaggregated run places
    its decode side when a prefill completes: in an order the replay decides.)
    """
    if (
        config.router_mode != "round_robin"
        or config.planner is not None
        or any(len(session.turns) != 1 for session in sessions)
    ):
        return None
    if config.disaggregated:
        assert config.prefill_engine is not None
        # vLLM and TRT-LLM submit the prefill first, as the request arrives (SGLang, which
        # reserves the destination first, names every block anyway).
        dp_size, workers = config.prefill_engine.dp_size, config.num_prefill_workers
        rotation = RoundRobinRouter([dp_size] * workers, worker_major=True)
    else:
        dp_size = config.engine.dp_size
        rotation = RoundRobinRouter([dp_size] * config.num_workers)
    admission = _admission(config, sessions)
    pools = [0] * len(sessions)
    now = -math.inf
    while not admission.drained():
        now = max(now, admission.ready_ms)
        for released in admission.release(now):
            worker, rank = rotation.place()
            pools[released.session] = worker * dp_size + rank
            admission.on_finished(released, now)
    return pools


def _admission(config: RunConfig, workload: list[Session] | AgenticGraph) -> Admission:
    if isinstance(workload, list):
        return AdmissionQueue(
            workload, concurrency=config.replay_concurrency, speedup=config.arrival_speedup_ratio
        )
    from servesim.workload.agentic import AgenticQueue

    return AgenticQueue(workload, lanes=config.agentic_lanes, speedup=config.arrival_speedup_ratio)


def _agentic_queue(admission: Admission) -> AgenticQueue | None:
    """``admission`` if it replays an agentic graph (there is none unless the agentic
    module has loaded: asking does not load it)."""
    agentic = sys.modules.get("servesim.workload.agentic")
    queue: type[AgenticQueue] | None = None if agentic is None else agentic.AgenticQueue
    return admission if queue is not None and isinstance(admission, queue) else None


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


def run(
    config: RunConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    scaling: ScalingPolicy | None = None,
) -> Report:
    """Replay the workload on the configured cluster and summarise what users would see.

    ``progress``, when given, is called as ``progress(ended, total)`` each time
    a request ends (completed or rejected), ``total`` being the requests the
    workload holds. ``scaling`` resizes the pools at its ticks (see
    :class:`~servesim.cluster.runtime.ScalingPolicy`); the report then lists
    every worker's lifecycle transitions under ``lifecycle_transitions``.

    Python's cyclic garbage collector is paused for the replay (and resumed
    as it was found): see :func:`_collector_paused`.

    Raises:
        ServesimError: bad configuration or workload (ConfigError, TraceError),
            or a simulation that cannot finish (SimulationError).
    """
    _validate(config)
    if config.planner is not None:
        from servesim.cluster.planner import check_planner_fits  # (a planner run's own module)

        if scaling is not None:
            raise ConfigError("a run takes a planner config or a scaling policy, not both")
        if config.prefill_engine is not None and config.decode_engine is not None:
            pools = {Stage.PREFILL: config.prefill_engine, Stage.DECODE: config.decode_engine}
        else:
            pools = {Stage.AGGREGATED: config.engine}
        check_planner_fits(config.planner, pools)
    with _collector_paused():
        return _replay(config, progress, scaling)


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
    trace = config.trace_path
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
    from servesim.workload.stream import stream_plan

    return stream_plan(trace, closed_loop=config.replay_concurrency is not None)


def _replay(
    config: RunConfig,
    progress: Callable[[int, int], None] | None,
    scaling: ScalingPolicy | None = None,
) -> Report:
    plan = _stream_plan(config)
    if plan is not None:
        from servesim.workload.stream import StreamQueue

        return _replay_once_or_twice(
            config,
            functools.partial(
                StreamQueue,
                plan,
                trace_block_size=config.trace_block_size or DEFAULT_TRACE_BLOCK_SIZE,
                concurrency=config.replay_concurrency,
                speedup=config.arrival_speedup_ratio,
            ),
            (plan.rows, plan.rows),
            progress,
            scaling,
            ends_unobserved=config.replay_concurrency is None,  # one-turn requests
            repeatable=config.trace_path != STDIN,
        )
    workload = _workload(config)
    engine = config.prefill_engine or config.engine
    if engine.backend is not Backend.SGLANG:
        # The vLLM block pool hashes only blocks another request could match (the
        # radix cache keys every page by its content, so SGLang needs no such look-ahead).
        if not isinstance(workload, list):  # an agentic graph
            mark_shared_blocks([Session(turns=[n.spec for n in workload.nodes])], engine.block_size)
        else:
            predictable = names_any(workload) and scaling is None
            pools = _round_robin_pools(config, workload) if predictable else None
            if config.disaggregated:
                # The prefill side names what its rank may match; the decode side, placed
                # as the replay goes, what any request may.
                mark_shared_blocks(workload, engine.block_size, prefill_pools=pools)
            else:
                mark_shared_blocks(workload, engine.block_size, pools=pools)
    if isinstance(workload, list):
        counts = (len(workload), sum(len(s.turns) for s in workload))
        # An open loop of one-turn sessions releases nothing when a request ends.
        ends_unobserved = config.replay_concurrency is None and counts[0] == counts[1]
    else:  # an agentic graph
        counts = (len(workload.plays), len(workload.nodes))
        ends_unobserved = False
    return _replay_once_or_twice(
        config,
        lambda: _admission(config, workload),
        counts,
        progress,
        scaling,
        ends_unobserved=ends_unobserved,
        repeatable=isinstance(workload, list),  # (not an agentic graph)
    )


def _replay_once_or_twice(
    config: RunConfig,
    admission: Callable[[], Admission],
    counts: tuple[int, int],
    progress: Callable[[int, int], None] | None,
    scaling: ScalingPolicy | None,
    *,
    ends_unobserved: bool,
    repeatable: bool,
) -> Report:
    """:func:`_replay_with` on a fresh ``admission()``, with the decode ranks keeping
    received prompts unnamed where nothing reads their cache; run again with them named
    if one of those ranks runs short of KV (see :mod:`servesim.engine.vllm`): the
    same replay, and a faster one while their KV suffices. ``repeatable``: the
    workload can be replayed twice (not one streamed from stdin, nor an agentic
    graph, into whose requests its queue writes their lanes as it runs)."""
    anonymous = repeatable and _decode_cache_unread(config, scaling)
    first = time.perf_counter()

    def attempt(*, anonymous_prompts: bool, began: float | None) -> Report:
        return _replay_with(
            config,
            admission(),
            counts,
            progress,
            scaling,
            ends_unobserved=ends_unobserved,
            anonymous_prompts=anonymous_prompts,
            began=began,
        )

    try:
        return attempt(anonymous_prompts=anonymous, began=None)
    except NamedPromptsNeeded:
        assert anonymous
    return attempt(anonymous_prompts=False, began=first)  # (the wall time counts both runs)


def _decode_cache_unread(config: RunConfig, scaling: ScalingPolicy | None) -> bool:
    """Whether nothing but a shortage of KV on a decode rank shows what it keeps cached.

    Its reused prefixes change no transfer (``full_prompt`` timing) and are reported
    nowhere (no telemetry, planner or scaling reads its counts); it publishes no KV
    events, routing is round robin, and a plain vLLM engine (no host or disk tier, no
    speculative decoding) caches nothing else.
    """
    prefill, decode = config.prefill_engine, config.decode_engine
    return (
        config.disaggregated
        and prefill is not None
        and decode is not None
        and prefill.kv_transfer_timing_mode == "full_prompt"
        and config.router_mode == "round_robin"
        and config.telemetry_interval_ms is None
        and config.planner is None
        and scaling is None
        and decode.backend is Backend.VLLM
        and decode.enable_prefix_caching
        and decode.native_host_offload is None
        and decode.g3_offload is None
        and decode.aic_nextn is None
    )


def _replay_with(
    config: RunConfig,
    admission: Admission,
    counts: tuple[int, int],
    progress: Callable[[int, int], None] | None,
    scaling: ScalingPolicy | None,
    *,
    ends_unobserved: bool = False,
    anonymous_prompts: bool = False,
    began: float | None = None,
) -> Report:
    """Replay ``admission``'s requests; ``counts``: the workload's sessions (or plays) and
    requests; ``ends_unobserved``: the admission releases nothing when a request ends;
    ``anonymous_prompts``: the decode ranks keep received prompts unnamed; ``began``:
    the ``perf_counter`` time an earlier run of the same replay began (its wall time
    counts too)."""
    sessions, total = counts
    hook = None if progress is None else functools.partial(_report_progress, progress, total)
    engine = config.prefill_engine or config.engine
    collector = Collector(keep_records=config.keep_records)
    ledger = Ledger(collector, admission, hook)
    completions: list[tuple[float, Stage, int]] = []
    disk = None
    if engine.g3_offload is not None:
        from servesim.engine.kv.disk_tier import DiskTier  # (the KV tiers load when used)

        assert engine.kv_cache_bytes_per_token is not None
        disk = DiskTier(engine.g3_offload, engine.block_size * engine.kv_cache_bytes_per_token)
    shared_host = _shared_host_tier(config)
    flow, cost_of = _flow(
        config,
        ledger,
        completions,
        disk,
        shared_host,
        ends_unobserved=ends_unobserved and scaling is None,
        anonymous_prompts=anonymous_prompts,
    )
    telemetry = None
    if config.telemetry_interval_ms is not None:
        from servesim.metrics.telemetry import Telemetry, TrafficWindow

        ledger.windows.append(TrafficWindow())
        telemetry = Telemetry(config.telemetry_interval_ms, ledger.windows[-1])
    planner = None
    if config.planner is not None:
        from servesim.cluster.planner import Planner
        from servesim.metrics.telemetry import TrafficWindow

        ledger.windows.append(TrafficWindow())
        engines = {pool.stage: pool.workers[0].config for pool in flow.pools}
        planner = scaling = Planner(
            config.planner, engines, ledger.windows[-1], details=config.planner_details
        )
    runtime = Runtime(
        flow, admission, ledger, completions, telemetry, scaling, split_at_ticks=planner is not None
    )
    started = time.perf_counter() if began is None else began
    outcome = runtime.run(config.max_sim_time_ms)
    wall_ms = (time.perf_counter() - started) * 1000.0
    cost = cost_of(outcome.worker_seconds)
    facts = collector.facts()
    summary = summarize(collector, facts, cost=cost, sla=config.sla, wall_time_ms=wall_ms)
    if disk is not None:
        summary["g3_offload"] = disk.summary()
    if shared_host is not None:
        summary["g2_domains"] = [shared_host.occupancy()]
    agentic = _agentic_queue(admission)
    if agentic is not None:
        assert config.execution_model is not None
        summary.update(_trajectory_summary(agentic, config.execution_model))
    sections: dict[str, Any] = {"telemetry": telemetry.section()} if telemetry is not None else {}
    if planner is not None:
        sections["planner"] = planner.section(runtime.transitions())
    sections["provenance"] = provenance(config, version=__version__, inputs=input_files(config))
    if scaling is not None:
        sections["lifecycle_transitions"] = [
            {
                "at_ms": t.at_ms,
                "pool": "agg" if t.stage is Stage.AGGREGATED else t.stage.name.lower(),
                "worker_id": t.worker_id,
                "prior_state": None if t.prior is None else t.prior.value,
                "state": t.state.value,
            }
            for t in runtime.transitions()
        ]
    return Report(
        summary=summary,
        run=describe_run(
            config, sessions=sessions, requests=total, time_limited=outcome.time_limited
        ),
        series=build_series(facts, pool_shapes(config, [len(p.workers) for p in flow.pools])),
        records=collector.records,
        time_limited=outcome.time_limited,
        sections=sections,
    )


def _timing(engine: EngineConfig) -> str:
    tm = engine.timing_model
    if tm.type == "interpolated":
        return f"measured profile {Path(tm.profile_path).name}"
    if tm.type == "fixed":
        return f"fixed: prefill {tm.prefill_ms:g} ms, decode {tm.decode_ms:g} ms per pass"
    return "polynomial (the reference's default fit)"


def _pool_info(role: str, workers: int, engine: EngineConfig) -> dict[str, Any]:
    return {
        "role": role,
        "workers": workers,
        "backend": str(engine.backend),
        "dp_size": engine.dp_size,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "gpus_per_worker": engine.gpus_per_worker,
        "block_size": engine.block_size,
        "num_gpu_blocks": engine.num_gpu_blocks,
        "kv_capacity_tokens_per_rank": engine.total_kv_tokens,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "timing_model": _timing(engine),
        "speedup_ratio": engine.speedup_ratio,
        "decode_speedup_ratio": engine.decode_speedup_ratio,
        "host_offload": engine.native_host_offload is not None,
        "disk_offload": engine.g3_offload is not None,
    }


def describe_run(
    config: RunConfig, *, sessions: int, requests: int, time_limited: bool
) -> dict[str, Any]:
    """The report's ``run`` section: the cluster and workload simulated (``docs/report.md``)."""
    if config.disaggregated:
        assert config.prefill_engine is not None and config.decode_engine is not None
        pools = [
            _pool_info("prefill", config.num_prefill_workers, config.prefill_engine),
            _pool_info("decode", config.num_decode_workers, config.decode_engine),
        ]
    else:
        pools = [_pool_info("aggregated", config.num_workers, config.engine)]
    workload: dict[str, Any]
    if config.trace is not None:
        workload = {
            "kind": "trace",
            "trace": "<stdin>" if config.trace_path == STDIN else str(config.trace),
            "trace_block_size": config.trace_block_size,
            "arrival_speedup_ratio": config.arrival_speedup_ratio,
        }
    else:
        assert config.synthetic is not None
        workload = {"kind": "synthetic", **asdict(config.synthetic)}
    workload["sessions"] = sessions
    workload["requests"] = requests
    workload["replay_concurrency"] = config.replay_concurrency
    router: dict[str, Any] = {"mode": config.router_mode}
    if config.router_mode == "kv_router":
        router["session_affinity"] = config.session_affinity
        router["kv_event_lag_ms"] = config.kv_event_lag_ms
        router["config"] = asdict(config.router)
    return {
        "servesim_version": __version__,
        "disaggregated": config.disaggregated,
        "pools": pools,
        "router": router,
        "workload": workload,
        "sla": {k: v for k, v in asdict(config.sla).items() if v is not None},
        "seed": config.seed,
        "max_sim_time_ms": config.max_sim_time_ms,
        "time_limited": time_limited,
    }


def pool_shapes(config: RunConfig, workers: Sequence[int] | None = None) -> list[PoolShape]:
    """Each pool's ranks and their KV capacity, for the report's series.

    ``workers``: each pool's workers over the run (a scaled pool adds some), in
    the order aggregated, or prefill then decode; by default the configured ones.
    """
    if not config.disaggregated:
        e = config.engine
        count = config.num_workers if workers is None else workers[0]
        return [
            PoolShape(
                name="aggregated",
                num_ranks=count * e.dp_size,
                kv_capacity_tokens=e.total_kv_tokens,
            )
        ]
    p, d = config.prefill_engine, config.decode_engine
    assert p is not None and d is not None
    prefill, decode = (
        (config.num_prefill_workers, config.num_decode_workers) if workers is None else workers
    )
    return [
        PoolShape(
            name="prefill",
            num_ranks=prefill * p.dp_size,
            kv_capacity_tokens=p.total_kv_tokens,
        ),
        PoolShape(
            name="decode",
            num_ranks=decode * d.dp_size,
            kv_capacity_tokens=d.total_kv_tokens,
        ),
    ]


def _report_progress(progress: Callable[[int, int], None], total: int, ended: int) -> None:
    progress(ended, total)


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
    interval = config.telemetry_interval_ms
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise ConfigError(
            f"--telemetry-interval-ms must be a positive finite number of ms, got {interval}"
        )
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


def _shared_host_tier(config: RunConfig) -> HostTier | None:
    """The deployment's cluster-shared host tier, if any engine selects one.

    Every engine that joins it must agree on its contract (layout id, block
    size and bytes, capacity, shared bandwidths), as the reference requires;
    their own link rates may differ.
    """
    engines = (
        [config.prefill_engine, config.decode_engine] if config.disaggregated else [config.engine]
    )
    joining = [
        e
        for e in engines
        if e is not None
        and e.native_host_offload is not None
        and e.native_host_offload.scope == "cluster_shared"
    ]
    if not joining:
        return None
    contracts = [_host_contract(e) for e in joining]
    for other in contracts[1:]:
        if other != contracts[0]:
            raise ConfigError(
                "cluster_shared host_offload participants are incompatible: "
                f"{_describe(contracts[0])} vs {_describe(other)}"
            )
    first = joining[0]
    assert first.native_host_offload is not None and first.kv_cache_bytes_per_token is not None
    from servesim.engine.kv.host_tier import HostTier

    return HostTier(first.native_host_offload, first.block_size * first.kv_cache_bytes_per_token)


def _host_contract(engine: EngineConfig) -> dict[str, object]:
    host = engine.native_host_offload
    assert host is not None and engine.kv_cache_bytes_per_token is not None
    return {
        "kv_layout_id": host.kv_layout_id,
        "block_size": engine.block_size,
        "block_bytes": engine.block_size * engine.kv_cache_bytes_per_token,
        "capacity_blocks": host.num_host_blocks,
        "shared_d2h_bandwidth_gbps": host.shared_d2h_bandwidth_gbps,
        "shared_h2d_bandwidth_gbps": host.shared_h2d_bandwidth_gbps,
    }


def _describe(contract: dict[str, object]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in contract.items()) + "}"


class _Clients:
    """Numbers the ranks that join a shared host tier, in the order their workers are built."""

    def __init__(self, tier: HostTier | None) -> None:
        self._tier = tier
        self._next = 0

    def joined(self, engine: EngineConfig) -> bool:
        """Whether workers of this engine join the shared tier."""
        host = engine.native_host_offload
        return self._tier is not None and host is not None and host.scope == "cluster_shared"

    def of(self, engine: EngineConfig) -> tuple[HostTier, int] | None:
        """The tier and the first client number of a new worker's ranks (None: it does not join)."""
        if self._tier is None or not self.joined(engine):
            return None
        first = self._next
        self._next += engine.dp_size
        return self._tier, first


def _flow(
    config: RunConfig,
    ledger: Ledger,
    completions: list[tuple[float, Stage, int]],
    disk: DiskTier | None,
    shared_host: HostTier | None,
    *,
    ends_unobserved: bool = False,
    anonymous_prompts: bool = False,
) -> tuple[Flow, CostOf]:
    """The flow the config asks for, and how to price its worker-seconds (``disk``: the
    deployment's disk KV tier, under its aggregated workers' host tiers)."""
    fast = not config.exact_passes
    clients = _Clients(shared_host)
    gauges = config.telemetry_interval_ms is not None
    fpm = config.planner is not None
    if not config.disaggregated:
        engine = config.engine
        kv = config.router_mode == "kv_router"
        # A window may follow a stepped pass in one busy period when nothing but the
        # tokens it delivers sees the pass end: round robin (no state, no queue), no
        # telemetry, planner or time cap (which read or cut the run at pass ends), and a
        # plain vLLM engine (no copies completing at pass ends). A request's end may then
        # wait for the window it falls in too, when the admission releases nothing then.
        chain = (
            fast
            and not kv
            and not gauges
            and not fpm
            and config.max_sim_time_ms is None
            and engine.backend is Backend.VLLM
            and engine.native_host_offload is None
            and disk is None
        )
        deferred = chain and ends_unobserved

        def aggregated(i: int) -> Worker:
            return Worker(
                i,
                engine,
                fast_forward=fast,
                kv_events=kv,
                disk=disk,
                gauges=gauges,
                fpm=fpm,
                shared_host=clients.of(engine),
                deferred_ends=deferred,
                chain=chain,
            )

        pool = Pool(
            Stage.AGGREGATED,
            [aggregated(i) for i in range(config.num_workers)],
            completions,
            factory=aggregated,
        )
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
        if observer is not None and clients.joined(engine):
            assert shared_host is not None
            observer.follow(shared_host, list(range(config.num_workers * engine.dp_size)))
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

    def prefill_worker(i: int) -> Worker:
        return Worker(
            i,
            prefill,
            fast_forward=fast,
            kv_events=kv,
            gauges=gauges,
            fpm=fpm,
            shared_host=clients.of(prefill),
        )

    def decode_worker(i: int) -> Worker:
        return Worker(
            i,
            decode,
            fast_forward=fast,
            gauges=gauges,
            fpm=fpm,
            shared_host=clients.of(decode),
            anonymous_prompts=anonymous_prompts,
        )

    prefill_pool = Pool(
        Stage.PREFILL,
        [prefill_worker(i) for i in range(config.num_prefill_workers)],
        completions,
        factory=prefill_worker,
    )
    decode_pool = Pool(
        Stage.DECODE,
        [decode_worker(i) for i in range(config.num_decode_workers)],
        completions,
        factory=decode_worker,
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
    if observer is not None and clients.joined(prefill):
        assert shared_host is not None
        observer.follow(shared_host, list(range(config.num_prefill_workers * prefill.dp_size)))
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
