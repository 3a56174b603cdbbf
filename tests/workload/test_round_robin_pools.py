"""Blocks named per KV pool under round robin: the pools are predicted right, and naming
only what a request's own pool can match changes nothing in the replay."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servesim import EngineConfig, Role, RunConfig, run
from servesim import simulation as simulation_module
from servesim.metrics.collector import RequestRecord
from servesim.simulation import _round_robin_pools, _workload

TRACE = Path(__file__).resolve().parent.parent / "data" / "mooncake_conversation_head1500.jsonl"
# A KV cache that evicts, yet keeps some long prefixes until a later turn finds them
# (naming blocks by the wrong pools then changes the replay).
ENGINE = EngineConfig(block_size=64, num_gpu_blocks=5000)
SETTINGS: dict[str, dict[str, Any]] = {
    "open loop, 4 workers": {"num_workers": 4},
    "open loop sped up, 3 workers of 2 ranks": {
        "num_workers": 3,
        "engine": replace(ENGINE, dp_size=2),
        "arrival_speedup_ratio": 3.0,
    },
    "closed loop of 7, 5 workers": {"num_workers": 5, "replay_concurrency": 7},
    "disaggregated, 2 prefill workers of 2 ranks, 3 decode workers": {
        "prefill_engine": replace(ENGINE, dp_size=2, worker_type=Role.PREFILL),
        "decode_engine": replace(ENGINE, worker_type=Role.DECODE),
        "num_prefill_workers": 2,
        "num_decode_workers": 3,
    },
}


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trace's first 500 requests (many arrive at the same instant)."""
    path = tmp_path_factory.mktemp("trace") / "head500.jsonl"
    path.write_text("".join(TRACE.read_text().splitlines(keepends=True)[:500]))
    return path


def config_of(name: str, trace: Path) -> RunConfig:
    return replace(RunConfig(trace=trace, engine=ENGINE), **SETTINGS[name])


def facts(record: RequestRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in RequestRecord.__slots__}


@pytest.mark.parametrize("name", SETTINGS)
def test_blocks_named_per_pool_change_nothing(
    name: str, head: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The k-th request to arrive (by start time, then trace order; in trace order in a
    closed loop) runs (or prefills) on the pool predicted for its session, and the replay equals the
    one with blocks named over the whole workload, request by request and in every
    simulated figure of the summary."""
    config = config_of(name, head)
    sessions = _workload(config)
    assert isinstance(sessions, list)
    pools = _round_robin_pools(config, sessions)
    assert pools is not None
    order = list(range(len(sessions)))
    if config.replay_concurrency is None:
        order.sort(key=lambda i: (sessions[i].start_ms, i))
    per_pool = run(config)
    placed = [
        r.prefill_worker_idx if config.disaggregated else r.decode_worker_idx
        for r in per_pool.records
    ]
    assert placed == [pools[i] for i in order]
    assert per_pool.summary["prefix_cache_reused_ratio"] > 0  # prefixes were found

    monkeypatch.setattr(simulation_module, "_round_robin_pools", lambda config, sessions: None)
    whole = run(config)
    assert [facts(r) for r in per_pool.records] == [facts(r) for r in whole.records]
    host = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in per_pool.summary.items() if k not in host} == {
        k: v for k, v in whole.summary.items() if k not in host
    }


def test_no_prediction_where_routing_depends_on_the_replay() -> None:
    """The KV router and multi-turn sessions are not predicted."""
    config = config_of("open loop, 4 workers", TRACE)
    sessions = _workload(config)
    assert isinstance(sessions, list)
    assert _round_robin_pools(replace(config, router_mode="kv_router"), sessions) is None
    two_turns = [replace(sessions[0], turns=sessions[0].turns * 2), *sessions[1:]]
    assert _round_robin_pools(config, two_turns) is None
