"""Invariants over random small workloads (Hypothesis).

Blocks are conserved and reference counts never go negative after every
pass; every request ends exactly once; time never goes backwards.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.config import Backend, EngineConfig
from servesim.engine.request import EngineRequest
from servesim.engine.worker import Worker
from servesim.metrics.collector import Terminal
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt
from servesim.workload.sharing import mark_shared_blocks
from tests.support import replay_aggregated

BLOCK = 4
TRACE_BLOCK = 8
MAX_PROMPT_IDS = 6
MAX_OUTPUT = 12


class CheckedWorker(Worker):
    """A worker that checks its pools and its clock after every pass."""

    last_start = 0.0

    def start_pass(
        self, now: float, quiet_until: float | None = None
    ) -> tuple[float, list[tuple[EngineRequest, int]]] | None:
        assert now >= self.last_start, "time went backwards"
        self.last_start = now
        started = super().start_pass(now, quiet_until)
        if started is not None:
            assert started[0] >= now
        for rank in self.ranks:
            # Every block or page a rank's KV counts belongs to some request it holds.
            rank.check()
        return started


requests = st.lists(
    st.tuples(
        # Hash ids from a small alphabet, so prompts share prefixes.
        st.lists(st.integers(0, 3), min_size=1, max_size=MAX_PROMPT_IDS),
        st.integers(1, TRACE_BLOCK),  # tokens cut from the last id
        st.integers(0, MAX_OUTPUT),  # output length
        st.floats(0, 200, allow_nan=False),  # arrival
    ),
    min_size=1,
    max_size=25,
)


def one_turn_sessions(reqs: list[tuple[list[int], int, int, float]]) -> list[Session]:
    """One single-turn session per drawn request (hash ids, cut of the last id, output, arrival)."""
    cache = BlockContentCache()
    sessions = []
    for ids, cut, output, arrival in reqs:
        length = (len(ids) - 1) * TRACE_BLOCK + cut
        prompt = TracePrompt(tuple(ids), TRACE_BLOCK, length, cache)
        sessions.append(
            Session(turns=[RequestSpec(prompt=prompt, output_length=output)], start_ms=arrival)
        )
    return sessions


@settings(max_examples=60, deadline=None)
@given(
    reqs=requests,
    num_workers=st.integers(1, 3),
    dp_size=st.integers(1, 2),
    budget=st.integers(4, 64),
    preemption=st.sampled_from(["lifo", "fifo"]),
    concurrency=st.one_of(st.none(), st.integers(1, 6)),
    backend=st.sampled_from(list(Backend)),
    speculative=st.booleans(),
)
def test_random_workloads_keep_the_invariants(
    reqs: list[tuple[list[int], int, int, float]],
    num_workers: int,
    dp_size: int,
    budget: int,
    preemption: str,
    concurrency: int | None,
    backend: Backend,
    speculative: bool,
) -> None:
    """Every request ends exactly once, KV stays consistent, token times never decrease (each engine)."""
    longest = MAX_PROMPT_IDS * TRACE_BLOCK + MAX_OUTPUT
    # Speculative bursts: a sampled 1 to 3 tokens per decode step.
    mtp = speculative
    config = EngineConfig(
        backend=backend,
        aic_nextn=2 if mtp else None,
        aic_nextn_accept_rates=(0.8, 0.5) if mtp else None,
        block_size=BLOCK,
        # Tight: forces eviction and preemption, but every request fits.
        num_gpu_blocks=-(-longest // BLOCK) + 2,
        max_num_batched_tokens=budget,
        preemption_mode=preemption,
        dp_size=dp_size,
    )
    sessions = one_turn_sessions(reqs)
    mark_shared_blocks(sessions, BLOCK)
    # vLLM workers chain a window after a stepped pass when nothing can reach them first.
    chain = backend is Backend.VLLM
    workers: list[Worker] = [CheckedWorker(i, config, chain=chain) for i in range(num_workers)]
    collector, outcome = replay_aggregated(sessions, config, workers, concurrency=concurrency)
    records = collector.records
    assert len(records) == len(reqs)
    # Every request fits, so none is rejected.
    assert all(r.terminal_status is Terminal.COMPLETED for r in records)
    for r in records:
        assert r.terminal_time_ms is not None and r.terminal_time_ms <= outcome.final_ms
        if r.output_length:
            assert r.first_token_ms is not None and r.last_token_ms is not None
            assert r.arrival_time_ms <= r.first_token_ms <= r.last_token_ms == r.terminal_time_ms
        assert r.output_length == r.requested_output_length
    for worker in workers:
        assert worker.in_flight() == 0
        for rank in worker.ranks:
            rank.check()  # no request holds KV: every block or page is free or cached
