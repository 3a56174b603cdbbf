"""Invariants with KV offload tiers over random small workloads (Hypothesis).

After every pass each tier keeps its own books (GPU blocks owned by the
requests holding them; host entries within capacity, the host LRU exactly
its resident unpinned blocks, every pending entry a store or disk read under
way; disk pools within capacity, their pins and pending entries matching the
jobs under way); every request ends exactly once and is completed; and once
the replay is over, no request holds a GPU block and no load is left.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from servesim.config import DiskOffloadConfig, EngineConfig, HostOffloadConfig
from servesim.engine.kv.disk_tier import DiskTier
from servesim.engine.vllm import VllmScheduler
from servesim.engine.worker import Worker
from servesim.metrics.collector import Terminal
from tests.property.test_invariants import (
    BLOCK,
    MAX_OUTPUT,
    MAX_PROMPT_IDS,
    TRACE_BLOCK,
    CheckedWorker,
    one_turn_sessions,
    requests,
)
from tests.support import replay_aggregated

BYTES_PER_TOKEN = 250_000  # a block of 4 tokens is 1 MB: 1 ms per block at 1 GB/s


@settings(max_examples=60, deadline=None)
# Two workers over one disk pool. A worker waiting on a disk read must be woken when
# another worker's look completes it (once lost its wake-up: a dead end), and a
# deadline already passed means now (once it sent the clock back).
@example(
    reqs=[([0], 4, 0, 35.0), ([0, 0], 1, 0, 0.0)],
    num_workers=2,
    dp_size=1,
    budget=4,
    concurrency=None,
    host_blocks=1,
    bandwidths=(0.0, 0.0),
    latency=0.5,
    disk=("cluster_shared", 1),
)
@example(
    reqs=[([0], 4, 0, 89.875), ([0, 0, 0, 0, 0, 0], 4, 2, 26.0)],
    num_workers=2,
    dp_size=1,
    budget=22,
    concurrency=None,
    host_blocks=5,
    bandwidths=(0.0, 0.0),
    latency=0.0,
    disk=("cluster_shared", 5),
)
@given(
    reqs=requests,
    num_workers=st.integers(1, 2),
    dp_size=st.integers(1, 2),
    budget=st.integers(4, 64),
    concurrency=st.one_of(st.none(), st.integers(1, 6)),
    host_blocks=st.integers(1, 24),
    bandwidths=st.tuples(st.sampled_from([0.0, 0.25, 1.0, 4.0]), st.sampled_from([0.0, 0.5, 2.0])),
    latency=st.sampled_from([0.0, 0.5]),
    disk=st.one_of(
        st.none(),
        st.tuples(st.sampled_from(["worker_local", "cluster_shared"]), st.integers(1, 30)),
    ),
)
def test_offload_tiers_keep_their_books(
    reqs: list[tuple[list[int], int, int, float]],
    num_workers: int,
    dp_size: int,
    budget: int,
    concurrency: int | None,
    host_blocks: int,
    bandwidths: tuple[float, float],
    latency: float,
    disk: tuple[str, int] | None,
) -> None:
    longest = MAX_PROMPT_IDS * TRACE_BLOCK + MAX_OUTPUT
    config = EngineConfig(
        block_size=BLOCK,
        num_gpu_blocks=-(-longest // BLOCK) + 2,
        max_num_batched_tokens=budget,
        dp_size=1 if disk is not None else dp_size,
        kv_cache_bytes_per_token=BYTES_PER_TOKEN,
        native_host_offload=HostOffloadConfig(
            num_host_blocks=host_blocks,
            d2h_bandwidth_gbps=bandwidths[0],
            h2d_bandwidth_gbps=bandwidths[1],
            latency_to_first_byte_ms=latency,
        ),
        g3_offload=None
        if disk is None
        else DiskOffloadConfig(
            scope=disk[0], num_g3_blocks=disk[1], read_bandwidth_gbps=0.5, write_bandwidth_gbps=1.0
        ),
    )
    tier = None
    if config.g3_offload is not None:
        tier = DiskTier(config.g3_offload, BLOCK * BYTES_PER_TOKEN)
    sessions = one_turn_sessions(reqs)
    workers: list[Worker] = [CheckedWorker(i, config, disk=tier) for i in range(num_workers)]
    collector, _ = replay_aggregated(sessions, config, workers, concurrency=concurrency)
    records = collector.records
    assert len(records) == len(reqs)
    assert all(r.terminal_status is Terminal.COMPLETED for r in records)
    assert all(r.output_length == r.requested_output_length for r in records)
    for r in records:
        # Every admission says where its prefix came from; host tokens are part of the reuse.
        assert (
            r.first_admission_host_reused_input_tokens is not None
            and 0
            <= r.first_admission_host_reused_input_tokens
            <= r.first_admission_reused_input_tokens
        )
    for worker in workers:
        assert worker.in_flight() == 0
        for rank in worker.ranks:
            assert isinstance(rank, VllmScheduler)
            rank.check()
            assert rank.pool.num_active == 0, "a block is still held after every request ended"
