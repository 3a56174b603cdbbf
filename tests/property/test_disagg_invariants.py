"""Disaggregated replay over random workloads (Hypothesis).

Every handoff ends exactly once and retires; no KV block, reservation or
queued destination stays behind on either side; round robin places prefills
worker-major over the DP ranks; fast-forward changes no record. The pools
vary in DP ranks, decode ``max_num_seqs`` (reservations wait for a running
slot), KV sizes (preemption on decode), transfer timing (fixed or priced,
full prompt or only the blocks the destination lacks) and host KV tiers on
either pool.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from servesim.config import Backend, EngineConfig, HostOffloadConfig, Role
from servesim.engine.roles import DestinationRole, SourceRole
from servesim.metrics.collector import Terminal
from servesim.workload.sharing import mark_shared_blocks
from tests.support import replay_disaggregated, sessions_of_ids

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=5),  # hash ids (shared prefixes)
        st.integers(0, 40),  # output tokens (0: finishes at its prefill)
        st.floats(0, 300, allow_nan=False),  # arrival
    ),
    min_size=1,
    max_size=20,
)


def servable(reqs: list[tuple[list[int], int, float]], decode: EngineConfig) -> bool:
    """Whether every request is sure to finish on the decode pool.

    An SGLang decode rank reserves a destination's prompt pages whatever runs;
    when those reservations leave a lone running request no page to grow
    into, nothing can be retracted and the run reaches a dead end (as the
    reference would stall). Such workloads are left out for SGLang: all its
    requests must fit a decode rank at once.
    """
    if decode.backend is not Backend.SGLANG:
        return True
    pages = sum(-(-(len(ids) * 8 - 2 + out) // 4) for ids, out, _ in reqs)
    return pages <= decode.num_gpu_blocks


def host_tier(backend: Backend, blocks: int | None) -> HostOffloadConfig | None:
    """A host KV tier (vLLM only) slow enough for copies to overlap passes: a 4-token
    block is 1 MB; 0.5 GB/s out, 2 GB/s back."""
    if blocks is None or backend is not Backend.VLLM:
        return None
    return HostOffloadConfig(num_host_blocks=blocks, d2h_bandwidth_gbps=0.5, h2d_bandwidth_gbps=2.0)


configs = st.builds(
    lambda blocks, budget, bandwidth, link, mode, prefill_dp, decode_dp, seqs, backend, hosts: (
        EngineConfig(
            backend=backend,
            block_size=4,
            num_gpu_blocks=blocks,
            max_num_batched_tokens=budget,
            worker_type=Role.PREFILL,
            dp_size=prefill_dp,
            kv_transfer_bandwidth=bandwidth,
            kv_transfer_bytes_per_token=None if bandwidth is None else 1e6,
            kv_transfer_link_model=link,
            kv_transfer_timing_mode=mode,
            kv_cache_bytes_per_token=250_000,
            native_host_offload=host_tier(backend, hosts[0]),
        ),
        EngineConfig(
            backend=backend,
            block_size=4,
            num_gpu_blocks=blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=seqs,
            worker_type=Role.DECODE,
            dp_size=decode_dp,
            kv_transfer_bandwidth=bandwidth,
            kv_cache_bytes_per_token=250_000,
            native_host_offload=host_tier(backend, hosts[1]),
        ),
    ),
    st.integers(25, 60),
    st.integers(8, 64),
    st.one_of(st.none(), st.floats(0.5, 20)),
    st.sampled_from(["shared", "independent"]),
    st.sampled_from(["full_prompt", "destination_missing"]),
    st.integers(1, 2),
    st.integers(1, 2),
    st.one_of(st.none(), st.integers(1, 4)),
    st.sampled_from(list(Backend)),
    st.tuples(*[st.one_of(st.none(), st.integers(1, 40))] * 2),  # host tiers: prefill, decode
)


@settings(max_examples=60, deadline=None)
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
    """Each request ends once, completed with all its tokens; no handoff, KV block or reservation outlives the run."""
    prefill, decode = engines
    assume(servable(reqs, decode))
    sessions = sessions_of_ids(reqs)
    mark_shared_blocks(sessions, 4)
    collector, flow, _ = replay_disaggregated(
        sessions, prefill, decode, prefill_workers=prefill_workers, decode_workers=decode_workers
    )
    assert len(collector.records) == len(reqs)
    targets = prefill_workers * prefill.dp_size
    for record in collector.records:
        assert record.terminal_status is Terminal.COMPLETED
        assert record.output_length == record.requested_output_length
        assert record.source_held_ms is not None and record.source_released_ms is not None
        assert record.destination_reserved_ms is not None
        assert record.destination_activated_ms is not None and record.decode_admit_ms is not None
        assert record.destination_activated_ms <= record.source_released_ms
        assert record.destination_activated_ms <= record.decode_admit_ms
        if prefill.backend is Backend.SGLANG:  # destination first
            assert record.prefill_admit_ms is not None
            assert (
                record.destination_reserved_ms
                <= record.prefill_admit_ms
                <= record.source_held_ms
                <= record.destination_activated_ms
            )
        else:
            assert (
                record.source_held_ms
                <= record.destination_reserved_ms
                <= record.destination_activated_ms
            )
            # Round robin walks the prefill ranks worker-major, in arrival order.
            assert record.prefill_worker == (record.uid % targets) // prefill.dp_size
        # A reservation reports no reuse, whatever it reused (as the reference); only a
        # re-admission after a preemption on the decode rank does, whole blocks of the
        # sequence it had.
        reused = record.decode_reused_input_tokens
        assert reused is not None and reused % 4 == 0
        assert reused < record.input_length + record.output_length
        assert record.dp_rank is not None and 0 <= record.dp_rank < decode.dp_size
    assert not flow._handoffs, "a handoff never retired"
    for pool in flow.pools:
        for worker in pool.workers:
            for rank in worker.ranks:
                assert not rank.waiting and not rank.running
                role = rank.role
                if isinstance(role, SourceRole):
                    assert not role.held
                if isinstance(role, DestinationRole):
                    assert not role.pending and not role.in_transfer and not role._order
                rank.check()  # no request holds KV: every block or page is free or cached


@settings(max_examples=40, deadline=None)
@given(
    reqs=requests,
    engines=configs,
    prefill_workers=st.integers(1, 2),
    decode_workers=st.integers(1, 3),
)
def test_fast_forward_changes_no_disaggregated_record(
    reqs: list[tuple[list[int], int, float]],
    engines: tuple[EngineConfig, EngineConfig],
    prefill_workers: int,
    decode_workers: int,
) -> None:
    """Every handoff timestamp, placement and token time agrees with pass-by-pass stepping."""
    prefill, decode = engines
    assume(servable(reqs, decode))
    runs = []
    for fast in (True, False):
        sessions = sessions_of_ids(reqs)
        if fast:
            mark_shared_blocks(sessions, 4)
        collector, _, _ = replay_disaggregated(
            sessions,
            prefill,
            decode,
            prefill_workers=prefill_workers,
            decode_workers=decode_workers,
            fast_forward=fast,
        )
        runs.append(
            [
                (
                    r.first_token_ms,
                    r.second_token_ms,
                    r.last_token_ms,
                    r.output_length,
                    r.source_held_ms,
                    r.destination_reserved_ms,
                    r.destination_activated_ms,
                    r.decode_admit_ms,
                    r.source_released_ms,
                    r.prefill_worker,
                    r.worker,
                    r.dp_rank,
                    r.reused_input_tokens,
                    r.terminal_time_ms,
                )
                for r in collector.records
            ]
        )
    assert runs[0] == runs[1]
