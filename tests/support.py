"""Building small aggregated replays for tests, without the CLI."""

from __future__ import annotations

from servesim.cluster.flows import AggregatedFlow
from servesim.cluster.runtime import Ledger, Pool, RunOutcome, Runtime, Stage
from servesim.config import EngineConfig
from servesim.engine.worker import Worker
from servesim.metrics.collector import Collector
from servesim.router.round_robin import RoundRobinRouter
from servesim.workload.admission import AdmissionQueue
from servesim.workload.request import Session


def replay_aggregated(
    sessions: list[Session],
    config: EngineConfig,
    workers: list[Worker],
    *,
    concurrency: int | None = None,
    max_sim_time_ms: float | None = None,
) -> tuple[Collector, RunOutcome]:
    """Replay ``sessions`` on ``workers`` behind a round-robin router."""
    collector = Collector()
    admission = AdmissionQueue(sessions, concurrency=concurrency)
    ledger = Ledger(collector, admission, None)
    completions: list[tuple[float, int, int]] = []
    flow = AggregatedFlow(
        Pool(Stage.AGGREGATED, workers, completions),
        RoundRobinRouter([config.dp_size] * len(workers)),
        ledger,
    )
    outcome = Runtime(flow, admission, ledger, completions).run(max_sim_time_ms)
    return collector, outcome
