"""The KV router sees blocks on the workers' host tiers, as the reference (Dynamo 1.6.1) does.

Every scenario: block size 16 (trace blocks of 16), 6 GPU blocks, 1 MB per
block (62,500 bytes per token), fixed timing (10 ms a prefill pass, 1 ms a
decode pass), a host tier of 16 blocks at 1 GB/s each way (a block copies
in 1 ms). Prompts are 4 blocks, 2 tokens out.

One worker: A = blocks 1..4 at 0 ms, C = 5..8 at 50 ms, B = 1..4 again at
100 ms. A's blocks are stored to host after its prefill (10 → 14 ms). C's
passes evict A's GPU blocks 4, 3 and 2, so at 100 ms the GPU holds block 1
and the host all four. The router's effective overlap for B is
``1 + 0.75 x 3 = 3.25`` blocks (the host blocks after the GPU prefix, at
``host_cache_hit_weight``), reported rounded half away from zero: 3 blocks
(48 tokens). The engine reuses block 1 from the GPU and loads 2..4 from host
(admitted at 103 ms). Every number is the reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import parse_router_config
from servesim.engine.kv.block_pool import KvRemoved, KvStored
from servesim.metrics.collector import RequestRecord
from servesim.router.indexer import KvIndexer
from tests.support import write_trace

ENGINE: dict[str, Any] = {
    "block_size": 16,
    "num_gpu_blocks": 6,
    "kv_cache_bytes_per_token": 62500,
    "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
    "native_host_offload": {
        "num_host_blocks": 16,
        "d2h_bandwidth_gbps": 1.0,
        "h2d_bandwidth_gbps": 1.0,
    },
}

A, C, B = (0.0, 64, 2, [1, 2, 3, 4]), (50.0, 64, 2, [5, 6, 7, 8]), (100.0, 64, 2, [1, 2, 3, 4])


def replay(
    tmp_path: Path,
    rows: Sequence[tuple[float, int, int, Sequence[int]]],
    *,
    workers: int = 1,
    router: dict[str, Any] | None = None,
    seed: int = 42,
    **engine: Any,
) -> list[RequestRecord]:
    trace = write_trace(tmp_path / "trace.jsonl", rows)
    records = run(
        RunConfig(
            trace=trace,
            trace_block_size=16,
            num_workers=workers,
            router_mode="kv_router",
            router=parse_router_config(router or {}),
            engine=parse_engine_args({**ENGINE, **engine}),
            seed=seed,
        )
    ).records
    return sorted(records, key=lambda r: r.arrival_time_ms)


def test_host_blocks_after_the_gpu_prefix_count_at_their_weight(tmp_path: Path) -> None:
    """B sees 1 GPU block and 3 host blocks after it: 3.25 blocks, reported as 3."""
    *_, b = replay(tmp_path, [A, C, B])
    assert (b.selected_overlap_blocks, b.best_available_overlap_blocks) == (3, 3)
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (48, 32)
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (103.0, 113.0, 114.0)


def test_without_host_offload_only_the_gpu_prefix_counts(tmp_path: Path) -> None:
    """Without a host tier B sees block 1 only, and recomputes the rest."""
    *_, b = replay(tmp_path, [A, C, B], native_host_offload=None)
    assert (b.selected_overlap_blocks, b.reused_input_tokens) == (1, 16)
    assert (b.first_token_ms, b.last_token_ms) == (110.0, 111.0)


@pytest.mark.parametrize(
    ("weight", "blocks"),
    [(0.0, 1), (0.25, 2), (0.4966, 2), (0.5, 3), (0.75, 3), (0.9, 4), (1.0, 4)],
)
def test_the_reported_overlap_is_the_weighted_sum_rounded_half_away(
    tmp_path: Path, weight: float, blocks: int
) -> None:
    """round(1 + 3w): 1.75 -> 2, 2.4898 -> 2, 2.5 -> 3, 3.7 -> 4; the engine's reuse is unchanged."""
    *_, b = replay(tmp_path, [A, C, B], router={"host_cache_hit_weight": weight})
    assert (b.selected_overlap_blocks, b.best_available_overlap_blocks) == (blocks, blocks)
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (48, 32)


def test_a_worker_with_no_gpu_prefix_walks_its_host_tier_from_the_first_block(
    tmp_path: Path,
) -> None:
    """C (5 blocks) evicts all of A's GPU blocks: B sees 0 + 0.75 x 4 = 3 blocks, all loaded."""
    *_, b = replay(tmp_path, [A, (50.0, 80, 2, [5, 6, 7, 8, 9]), B])
    assert (
        b.selected_overlap_blocks,
        b.reused_input_tokens,
        b.first_admission_host_reused_input_tokens,
    ) == (3, 48, 48)
    assert (b.first_admit_ms, b.first_token_ms) == (104.0, 114.0)


@pytest.mark.parametrize(("arrival", "blocks"), [(60.0, 2), (61.0, 1), (100.0, 1)])
def test_host_evictions_are_seen_at_the_end_of_the_pass_that_prepares_the_store(
    tmp_path: Path, arrival: float, blocks: int
) -> None:
    """A host tier of 4 blocks: C's store, prepared in its prefill pass (50 → 60 ms), evicts
    A's host blocks. From 60 ms the router sees only the GPU prefix: 2 blocks, then 1 once
    the next pass (to 61 ms) evicts block 2; never a host extension."""
    host = {**ENGINE["native_host_offload"], "num_host_blocks": 4}
    *_, b = replay(tmp_path, [A, C, (arrival, 64, 2, [1, 2, 3, 4])], native_host_offload=host)
    assert (
        b.selected_overlap_blocks,
        b.reused_input_tokens,
        b.first_admission_host_reused_input_tokens,
    ) == (blocks, 16, 0)


@pytest.mark.parametrize(("arrival", "blocks"), [(20.0, 4), (36.9, 4), (37.0, 3)])
def test_host_blocks_are_seen_once_their_copy_has_completed(
    tmp_path: Path, arrival: float, blocks: int
) -> None:
    """At 0.25 GB/s A's store runs 10 → 26 ms; C arrives at 11 ms and its prefill pass waits
    for the copy of the GPU blocks it reuses (26 → 36 ms), evicting A's blocks 4 and 3, and
    the next pass (to 37 ms) block 2. At 36.9 ms the router sees 2 GPU blocks and 2 host
    blocks (3.5 -> 4), from 37 ms 1 and 3 (3.25 -> 3)."""
    host = {**ENGINE["native_host_offload"], "d2h_bandwidth_gbps": 0.25}
    rows = [A, (11.0, 64, 2, [5, 6, 7, 8]), (arrival, 64, 2, [1, 2, 3, 4])]
    *_, b = replay(tmp_path, rows, native_host_offload=host)
    assert b.selected_overlap_blocks == blocks
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (48, 32)
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (56.0, 66.0, 67.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_fractional_overlap_decides_between_workers(tmp_path: Path, seed: int) -> None:
    """Two workers. A (1..4) takes X; E (1, 2, 3, 22, 20 tokens out) goes to the idle Y; C
    (5..8) to X, evicting A's GPU blocks but block 1. For B (1..4), X holds 1 GPU block and
    host blocks 2..4 (3.25), Y 3 GPU blocks (3): B goes to X, as in every reference run."""
    rows = [A, (1.0, 64, 20, [1, 2, 3, 22]), (12.0, 64, 2, [5, 6, 7, 8]), B]
    a, e, c, b = replay(tmp_path, rows, workers=2, seed=seed)
    assert e.worker != a.worker and c.worker == a.worker
    assert b.worker == a.worker
    assert (b.selected_overlap_blocks, b.best_available_overlap_blocks) == (3, 3)
    assert (b.reused_input_tokens, b.first_admission_host_reused_input_tokens) == (48, 32)
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (103.0, 113.0, 114.0)


def test_the_host_extension_continues_the_device_prefix() -> None:
    """Host blocks count from where the GPU prefix ends, consecutively; a gap stops them."""
    index = KvIndexer()
    index.apply(0, [KvStored(None, (1,))])
    index.apply(0, [KvStored(None, (1, 2, 3, 4), host=True)])  # 1 is on the GPU too
    index.apply(1, [KvStored(None, (1, 2), host=True)])  # no GPU block: from the first
    index.apply(2, [KvStored(None, (1, 2, 3)), KvStored(None, (3, 4), host=True)])
    index.apply(3, [KvStored(None, (2, 3), host=True)])  # no first block: nothing
    hashes = [1, 2, 3, 4, 5]
    device = index.overlaps(hashes)
    assert device == {0: 1, 2: 3}
    assert index.host_extensions(hashes, device) == {0: 3, 1: 2, 2: 1}
    index.apply(0, [KvRemoved((3,), host=True)])
    assert index.host_extensions(hashes, index.overlaps(hashes)) == {0: 1, 1: 2, 2: 1}
    assert index.overlaps(hashes) == device  # host events leave the GPU index alone
