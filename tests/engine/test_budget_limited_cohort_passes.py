"""A pass whose budget runs out on a prompt's chunk keeps the decode cohort lazy.

100 requests of 3,000 prompt tokens and 200 output tokens arrive 20 ms apart
on one worker with ``max_num_batched_tokens`` 2048: a new prompt needs two
chunks, so most passes run out of budget on a prompt's chunk while a hundred
requests decode beside it. vLLM's running loop serves requests in admission
order; every decoding member was admitted before the chunked prompt, so each
gets its one token and the prompt takes what is left (2,048 less the
members). Those passes used to materialise the whole cohort and schedule it
request by request; they now stay lazy, with every record as pass-by-pass
stepping gives it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from servesim.engine import vllm
from servesim.metrics.report import request_row
from tests.support import replay_synthetic

ENGINE = {"block_size": 64, "max_num_batched_tokens": 2048}
HOST_SPEED = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
# Stepping counts a pass's token gap once per request, the cohort once weighted by its
# members (docs/reference-differences.md): the moments agree to the last bit or so.
GAP_MOMENTS = {
    "mean_itl_ms",
    "std_itl_ms",
    "mean_output_token_throughput_per_user",
    "std_output_token_throughput_per_user",
}


def _replay(exact_passes: bool) -> Any:
    return replay_synthetic(
        3000, 200, 100, ENGINE, exact_passes=exact_passes, arrival_interval_ms=20.0
    )


def test_chunked_prompts_beside_a_cohort_keep_it_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    materialised: list[int] = []
    splits: list[tuple[int, list[int]]] = []  # (members, each other request's tokens)
    sync, schedule_cohort = vllm.VllmScheduler._sync, vllm.VllmScheduler._schedule_cohort

    def counting_sync(self: vllm.VllmScheduler, *args: Any, **kwargs: Any) -> None:
        if self._members:
            materialised.append(len(self._members))
        sync(self, *args, **kwargs)

    def recording_cohort(self: vllm.VllmScheduler) -> bool:
        members = len(self._members)
        lazy = schedule_cohort(self)
        if lazy:
            splits.append((members, [tokens for tokens, _, _ in self._scheduled.values()]))
        return lazy

    monkeypatch.setattr(vllm.VllmScheduler, "_sync", counting_sync)
    monkeypatch.setattr(vllm.VllmScheduler, "_schedule_cohort", recording_cohort)
    fast = _replay(exact_passes=False)
    assert materialised == []
    # Passes whose budget ran out on a chunk: the members' tokens and the chunk fill it.
    full = [(members, chunks) for members, chunks in splits if members + sum(chunks) == 2048]
    assert len(full) >= 40
    assert all(len(chunks) == 1 and chunks[0] < 3000 for _, chunks in full)
    assert max(members for members, _ in full) >= 90

    monkeypatch.undo()
    exact = _replay(exact_passes=True)
    assert [request_row(r) for r in fast.records] == [request_row(r) for r in exact.records]
    skip = HOST_SPEED | GAP_MOMENTS
    assert {k: v for k, v in fast.summary.items() if k not in skip} == {
        k: v for k, v in exact.summary.items() if k not in skip
    }
    for key in GAP_MOMENTS:  # (measured: 2.7e-16 at most)
        assert math.isclose(fast.summary[key], exact.summary[key], rel_tol=1e-15), key
