"""Disaggregated replay over random workloads (Hypothesis).

Every handoff ends exactly once and retires; no KV block stays held on
either side afterwards; fast-forward changes no record.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.config import EngineConfig
from servesim.metrics.collector import Terminal
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt
from servesim.workload.sharing import mark_shared_blocks
from tests.support import replay_disaggregated

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=5),  # hash ids (shared prefixes)
        st.integers(0, 40),  # output tokens (0: finishes at its prefill)
        st.floats(0, 300, allow_nan=False),  # arrival
    ),
    min_size=1,
    max_size=20,
)


def sessions_of(reqs: list[tuple[list[int], int, float]]) -> list[Session]:
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


configs = st.builds(
    lambda blocks, budget, bandwidth, link: (
        EngineConfig(
            block_size=4,
            num_gpu_blocks=blocks,
            max_num_batched_tokens=budget,
            worker_type="prefill",
            kv_transfer_bandwidth=bandwidth,
            kv_transfer_bytes_per_token=None if bandwidth is None else 1e6,
            kv_transfer_link_model=link,
        ),
        EngineConfig(
            block_size=4,
            num_gpu_blocks=blocks,
            max_num_batched_tokens=budget,
            worker_type="decode",
            kv_transfer_bandwidth=bandwidth,
        ),
    ),
    st.integers(25, 60),
    st.integers(8, 64),
    st.one_of(st.none(), st.floats(0.5, 20)),
    st.sampled_from(["shared", "independent"]),
)


@settings(max_examples=50, deadline=None)
@given(
    reqs=requests,
    engines=configs,
    prefill_workers=st.integers(1, 2),
    decode_workers=st.integers(1, 3),
)
def test_every_handoff_ends_once_and_frees_its_kv(
    reqs: list[tuple[list[int], int, float]],
    engines: tuple[EngineConfig, EngineConfig],
    prefill_workers: int,
    decode_workers: int,
) -> None:
    """Each request ends once, completed with all its tokens; no handoff or KV block outlives the run."""
    sessions = sessions_of(reqs)
    mark_shared_blocks(sessions, 4)
    prefill, decode = engines
    collector, flow, _ = replay_disaggregated(
        sessions, prefill, decode, prefill_workers=prefill_workers, decode_workers=decode_workers
    )
    assert len(collector.records) == len(reqs)
    for record in collector.records:
        assert record.terminal is Terminal.COMPLETED
        assert record.num_tokens == record.requested_output
        assert record.source_held_ms is not None and record.source_released_ms is not None
        assert record.source_held_ms <= record.source_released_ms
    assert not flow._handoffs, "a handoff never retired"
    for pool in flow.pools:
        for worker in pool.workers:
            for rank in worker.ranks:
                assert rank.pool.num_active == 0 and not rank.held and not rank.pending_reservations
                rank.pool.check([])  # no table holds a block: every block is free or evictable


@settings(max_examples=30, deadline=None)
@given(reqs=requests, engines=configs, decode_workers=st.integers(1, 3))
def test_fast_forward_changes_no_disaggregated_record(
    reqs: list[tuple[list[int], int, float]],
    engines: tuple[EngineConfig, EngineConfig],
    decode_workers: int,
) -> None:
    """Every handoff timestamp and token time agrees with pass-by-pass stepping."""
    prefill, decode = engines
    runs = []
    for fast in (True, False):
        sessions = sessions_of(reqs)
        if fast:
            mark_shared_blocks(sessions, 4)
        collector, _, _ = replay_disaggregated(
            sessions,
            prefill,
            decode,
            prefill_workers=1,
            decode_workers=decode_workers,
            fast_forward=fast,
        )
        runs.append(
            [
                (
                    r.first_token_ms,
                    r.last_token_ms,
                    r.num_tokens,
                    r.source_held_ms,
                    r.destination_reserved_ms,
                    r.destination_activated_ms,
                    r.decode_admit_ms,
                    r.source_released_ms,
                    r.worker,
                    r.terminal_ms,
                )
                for r in collector.records
            ]
        )
    assert runs[0] == runs[1]
