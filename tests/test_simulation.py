"""The public entry point's own promises: no reference cycles, and the collector left as found.

:func:`servesim.run` pauses Python's cyclic garbage collector for the replay
(its full collections walk every worker's state, a cost that grows with the
cluster). That is only sound while a replay makes no reference cycles: the
tests below replay each kind of cluster with the collector off and require
that a collection afterwards finds nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from servesim import RunConfig, TraceError, parse_engine_args, run
from servesim.config import Role, parse_router_config

DATA = Path(__file__).parent / "data"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """The first 300 requests of the Mooncake conversation trace."""
    path = tmp_path / "head300.jsonl"
    with (DATA / "mooncake_conversation_head1500.jsonl").open() as source:
        path.write_text("".join(islice(source, 300)))
    return path


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    """Start with the collector on, and leave it on."""
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    if not was_enabled:
        gc.disable()


def small_engine() -> dict[str, object]:
    # Few blocks for these prompts (up to 1,900 blocks): evictions, preemptions and recomputation happen.
    return {"block_size": 64, "num_gpu_blocks": 2500, "max_num_seqs": 16}


CLUSTERS: dict[str, dict[str, object]] = {
    "aggregated": {"num_workers": 3},
    "time cap": {"num_workers": 3, "max_sim_time_ms": 60_000.0},
    "kv router with queue": {
        "num_workers": 3,
        "router_mode": "kv_router",
        "router": {"router_queue_threshold": 0.5, "router_queue_policy": "wspt"},
        "session_affinity": "hrw",
    },
    "disaggregated": {"num_prefill_workers": 2, "num_decode_workers": 3, "disaggregated": True},
    "disaggregated, kv router": {
        "num_prefill_workers": 2,
        "num_decode_workers": 3,
        "disaggregated": True,
        "router_mode": "kv_router",
    },
}


def config_of(trace: Path, cluster: dict[str, object]) -> RunConfig:
    keys = dict(cluster)
    if "router" in keys:
        keys["router"] = parse_router_config(keys["router"])
    if keys.pop("disaggregated", False):
        transfer = {"kv_transfer_bandwidth": 64, "kv_transfer_bytes_per_token": 131072}
        keys["prefill_engine"] = parse_engine_args(
            {**small_engine(), **transfer}, role=Role.PREFILL
        )
        keys["decode_engine"] = parse_engine_args({**small_engine(), **transfer}, role=Role.DECODE)
    else:
        keys["engine"] = parse_engine_args(small_engine())
    return RunConfig(trace=trace, **keys)  # type: ignore[arg-type]


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS.keys())
def test_a_replay_makes_no_reference_cycles(
    trace: Path, cluster: dict[str, object], collector_enabled: None
) -> None:
    """With the collector off throughout, a collection after the replay finds no cyclic garbage."""
    config = config_of(trace, cluster)
    # A first run imports the modules a replay loads lazily: defining a slotted dataclass
    # leaves its first class object behind as cyclic garbage, once.
    run(config)
    gc.collect()
    gc.disable()
    report = run(config)
    assert report.records
    del report
    assert gc.collect() == 0


def test_the_collector_is_off_during_the_replay_and_back_on_after(
    trace: Path, collector_enabled: None
) -> None:
    """Progress callbacks run inside the replay: they see the collector off."""
    seen: list[bool] = []
    run(
        config_of(trace, CLUSTERS["aggregated"]),
        progress=lambda _ended, _total: seen.append(gc.isenabled()),
    )
    assert seen and not any(seen)
    assert gc.isenabled()


def test_a_collector_already_off_stays_off(trace: Path, collector_enabled: None) -> None:
    gc.disable()
    run(config_of(trace, CLUSTERS["aggregated"]))
    assert not gc.isenabled()


def test_the_collector_comes_back_when_the_replay_fails(
    tmp_path: Path, collector_enabled: None
) -> None:
    """A workload that fails to load, inside the pause, still resumes the collector."""
    with pytest.raises(TraceError):
        run(config_of(tmp_path / "missing.jsonl", CLUSTERS["aggregated"]))
    assert gc.isenabled()
