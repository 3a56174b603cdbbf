"""A cluster-shared host KV tier (``scope: cluster_shared``), against the reference (Dynamo 1.6.1).

Aggregated workers, round robin; block size 16 (trace blocks of 16), 1 MB per
block (62,500 bytes per token), fixed timing (10 ms a prefill pass, 1 ms a
decode pass), 6 GPU blocks, one host pool of 16 blocks for the deployment;
each rank's links copy at 1 GB/s (a block a millisecond) unless a test says
otherwise. Prompts are 4 blocks, 2 tokens out. Every number is the
reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import Role
from servesim.errors import ConfigError
from servesim.simulation import Report
from tests.support import write_trace


def shared(**links: Any) -> dict[str, Any]:
    return {
        "num_host_blocks": 16,
        "d2h_bandwidth_gbps": 1.0,
        "h2d_bandwidth_gbps": 1.0,
        "scope": "cluster_shared",
        "kv_layout_id": "L",
        **links,
    }


def engine(host: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "block_size": 16,
        "num_gpu_blocks": 6,
        "kv_cache_bytes_per_token": 62500,
        "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
        "native_host_offload": shared() if host is None else host,
        **more,
    }


def replay(
    tmp_path: Path,
    rows: Sequence[tuple[float, int, int, Sequence[int]]],
    *,
    workers: int = 2,
    exact_passes: bool = False,
    **settings: Any,
) -> Report:
    return run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", rows),
            trace_block_size=16,
            num_workers=workers,
            engine=parse_engine_args(engine(**settings)),
            exact_passes=exact_passes,
        )
    )


A = (0.0, 64, 2, [1, 2, 3, 4])

modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])


@modes
def test_a_worker_loads_a_prefix_another_worker_stored(tmp_path: Path, exact_passes: bool) -> None:
    """A runs on worker 0, which stores its prompt (10 → 14 ms). B, the same prompt at
    100 ms on worker 1 (nothing on its GPU), loads all 4 blocks (100 → 104 ms)."""
    report = replay(tmp_path, [A, (100.0, 64, 2, [1, 2, 3, 4])], exact_passes=exact_passes)
    a, b = report.records
    assert (a.worker, b.worker) == (0, 1)
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (104.0, 114.0, 115.0)
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (48, 48)
    capacity = {"capacity_blocks": 16, "resident_blocks": 4, "used_blocks": 4}
    assert report.summary["g2_domains"] == [capacity]


def test_the_ranks_of_one_worker_share_it_too(tmp_path: Path) -> None:
    """One worker of two DP ranks: B on rank 1 loads what A's rank 0 stored."""
    _, b = replay(tmp_path, [A, (100.0, 64, 2, [1, 2, 3, 4])], workers=1, dp_size=2).records
    assert (b.dp_rank, b.first_admit_ms, b.first_admission_host_reused_input_tokens) == (
        1,
        104.0,
        48,
    )


def test_copies_at_once_share_the_pools_bandwidth(tmp_path: Path) -> None:
    """Two loads of 4 blocks start together on two workers; the pool's 1 GB/s host-to-GPU
    cap gives each 0.5 GB/s: both end at 108 ms (each alone would at 104)."""
    rows = [
        A,
        (1.0, 64, 2, [9, 10, 11, 12]),
        (100.0, 64, 2, [9, 10, 11, 12]),
        (100.0, 64, 2, [1, 2, 3, 4]),
    ]
    *_, c, d = replay(tmp_path, rows, host=shared(shared_h2d_bandwidth_gbps=1.0)).records
    assert (c.first_admit_ms, d.first_admit_ms) == (108.0, 108.0)
    assert (c.first_token_ms, d.first_token_ms) == (118.0, 118.0)


def test_a_store_holds_its_gpu_blocks_until_its_copy_completes(tmp_path: Path) -> None:
    """At 0.25 GB/s A's store copies 10 → 26 ms and keeps A's 4 GPU blocks in use: C
    (11.5 ms) cannot get its 4 blocks from the 2 free ones and is admitted when the copy
    completes (26 ms). A private tier would admit it at once and fence its pass instead."""
    _, c = replay(
        tmp_path, [A, (11.5, 64, 2, [5, 6, 7, 8])], workers=1, host=shared(d2h_bandwidth_gbps=0.25)
    ).records
    assert (c.first_admit_ms, c.first_token_ms, c.last_token_ms) == (26.0, 36.0, 37.0)


def test_a_copy_completing_wakes_a_request_waiting_on_another_worker(tmp_path: Path) -> None:
    """At 0.25 GB/s A's store (worker 0) runs 10 → 26 ms. B, A's prompt on worker 1 at
    12 ms, finds it still being stored and waits; the copy's completion wakes it: it loads
    the 4 blocks (26 → 30 ms)."""
    _, b = replay(
        tmp_path, [A, (12.0, 64, 2, [1, 2, 3, 4])], host=shared(d2h_bandwidth_gbps=0.25)
    ).records
    assert (
        b.worker,
        b.first_admit_ms,
        b.first_token_ms,
        b.first_admission_host_reused_input_tokens,
    ) == (
        1,
        30.0,
        40.0,
        48,
    )


def test_one_pool_of_num_host_blocks_for_the_whole_deployment(tmp_path: Path) -> None:
    """A pool of 8 blocks: A (worker 0), X (worker 1) and Y (worker 0) each store 4 blocks,
    so Y's store evicts A's, and B (A's prompt on worker 1) finds nothing."""
    rows = [
        A,
        (50.0, 64, 2, [5, 6, 7, 8]),
        (60.0, 64, 2, [20, 21, 22, 23]),
        (100.0, 64, 2, [1, 2, 3, 4]),
    ]
    report = replay(tmp_path, rows, host=shared(num_host_blocks=8))
    *_, b = report.records
    assert (b.reused_input_tokens, b.first_token_ms) == (0, 110.0)
    assert report.summary["g2_domains"] == [
        {"capacity_blocks": 8, "resident_blocks": 8, "used_blocks": 8}
    ]


def test_the_prefill_and_decode_pools_join_the_same_tier(tmp_path: Path) -> None:
    """P/D, both pools in the tier, decode copies at 0.25 GB/s: the decode worker finds A's
    prompt already stored by the prefill worker, stores nothing and holds nothing, so C's
    reservation (at its prefill's end, 22 ms) is granted at once."""
    report = run(
        RunConfig(
            trace=write_trace(tmp_path / "trace.jsonl", [A, (12.0, 64, 2, [5, 6, 7, 8])]),
            trace_block_size=16,
            prefill_engine=parse_engine_args(
                engine(host=shared(d2h_bandwidth_gbps=0.25), num_gpu_blocks=16), role=Role.PREFILL
            ),
            decode_engine=parse_engine_args(
                engine(host=shared(d2h_bandwidth_gbps=0.25)), role=Role.DECODE
            ),
        )
    )
    _, c = report.records
    assert (c.source_held_ms, c.destination_reserved_ms, c.first_token_ms) == (22.0, 22.0, 23.0)
    assert report.summary["g2_domains"] == [
        {"capacity_blocks": 16, "resident_blocks": 8, "used_blocks": 8}
    ]


def test_participants_must_agree_on_the_pool(tmp_path: Path) -> None:
    """Prefill and decode pools naming pools of different sizes: the reference's error."""
    rows = [A]
    with pytest.raises(
        ConfigError, match="cluster_shared host_offload participants are incompatible"
    ):
        run(
            RunConfig(
                trace=write_trace(tmp_path / "trace.jsonl", rows),
                trace_block_size=16,
                prefill_engine=parse_engine_args(
                    engine(host=shared(num_host_blocks=8)), role=Role.PREFILL
                ),
                decode_engine=parse_engine_args(engine(), role=Role.DECODE),
            )
        )


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"kv_layout_id": None}, "requires a nonempty kv_layout_id"),
        ({"scope": "worker_local"}, "worker_local is a g3_offload scope"),
    ],
)
def test_a_shared_tier_needs_a_layout_id_and_a_host_scope(
    host: dict[str, Any], message: str
) -> None:
    settings = shared(**host)
    if settings["kv_layout_id"] is None:
        del settings["kv_layout_id"]
    with pytest.raises(ConfigError, match=message):
        parse_engine_args(engine(host=settings))
