"""Engine limits at their exact boundaries, against the reference (Dynamo 1.6.1).

Each case is one small synthetic run probed on the reference
(``refcheck.py reference``); every number below is the reference's. Block
size 64, polynomial timing, all requests arriving at once.

- ``max_model_len``: a prompt of exactly that length is rejected; one token
  shorter, it runs and stops after one token (its length then reaches the
  limit). Generation stops when the sequence reaches the limit.
- ``num_gpu_blocks``: a prompt that fills every block exactly still runs; one
  token more and it can never fit (rejected).
- A budget of one token left still admits a one-token chunk of the next
  prompt. Without chunked prefill, a prompt of exactly ``max_num_batched_tokens``
  runs in one pass; it waits while a running decode takes a token of the
  budget.
"""

from __future__ import annotations

import pytest

from servesim.metrics.collector import Terminal
from servesim.simulation import Report
from tests.support import replay_synthetic

modes = pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])


def _tokens(report: Report) -> list[tuple[float | None, float | None, int]]:
    return [(r.first_token_ms, r.last_token_ms, r.output_length) for r in report.records]


@modes
def test_a_prompt_of_exactly_max_model_len_is_rejected(exact_passes: bool) -> None:
    """100 tokens with ``max_model_len`` 100: the reference rejects it before admission."""
    report = replay_synthetic(
        100, 5, 1, {"block_size": 64, "max_model_len": 100}, exact_passes=exact_passes
    )
    (record,) = report.records
    assert record.terminal_status is Terminal.REJECTED
    assert record.first_admit_ms is None
    assert report.summary["completed_requests"] == 0
    assert report.summary["rejected_requests"] == 1
    assert report.summary["committed_prefill_tokens"] == 0


@modes
def test_a_prompt_one_short_of_max_model_len_gets_one_token(exact_passes: bool) -> None:
    """99 tokens with ``max_model_len`` 100, asking for 5: the first token reaches 100 and ends it."""
    report = replay_synthetic(
        99, 5, 1, {"block_size": 64, "max_model_len": 100}, exact_passes=exact_passes
    )
    assert _tokens(report) == [(18.008706999999998, 18.008706999999998, 1)]
    assert report.records[0].terminal_status is Terminal.COMPLETED
    assert report.summary["total_output_tokens"] == 1


@modes
def test_generation_stops_when_the_sequence_reaches_max_model_len(exact_passes: bool) -> None:
    """100 tokens asking for 50 with ``max_model_len`` 110: ten tokens, the last at 69.732648 ms."""
    report = replay_synthetic(
        100, 50, 1, {"block_size": 64, "max_model_len": 110}, exact_passes=exact_passes
    )
    assert _tokens(report) == [(18.023974000000003, 69.732648, 10)]
    assert report.summary["total_output_tokens"] == 10


@modes
def test_a_prompt_that_fills_every_block_runs(exact_passes: bool) -> None:
    """128 tokens on 2 blocks of 64, one token out: it fits exactly (first token 18.451798 ms)."""
    report = replay_synthetic(
        128, 1, 1, {"block_size": 64, "num_gpu_blocks": 2}, exact_passes=exact_passes
    )
    assert _tokens(report) == [(18.451798, 18.451798, 1)]
    assert report.summary["rejected_requests"] == 0
    assert report.summary["committed_prefill_tokens"] == 128


@modes
def test_a_prompt_one_token_over_every_block_is_rejected(exact_passes: bool) -> None:
    """129 tokens on 2 blocks of 64 need 3 blocks: the reference rejects it."""
    report = replay_synthetic(
        129, 1, 1, {"block_size": 64, "num_gpu_blocks": 2}, exact_passes=exact_passes
    )
    assert report.records[0].terminal_status is Terminal.REJECTED
    assert report.summary["rejected_requests"] == 1


@modes
def test_without_chunking_a_prompt_of_exactly_the_budget_runs(exact_passes: bool) -> None:
    """Two prompts of 100 tokens, budget 100, chunked prefill off, 3 tokens each.

    The first runs alone; the second needs the whole budget, so it waits
    while the first decodes (one token of the budget) and is admitted when
    the first finishes, at 29.51443 ms.
    """
    engine = {"enable_chunked_prefill": False, "max_num_batched_tokens": 100}
    report = replay_synthetic(100, 3, 2, {"block_size": 64, **engine}, exact_passes=exact_passes)
    first, second = report.records
    assert first.first_admit_ms == 0.0
    assert second.first_admit_ms == 29.51443
    assert _tokens(report) == [(18.023974000000003, 29.51443, 3), (47.538404, 59.02886, 3)]


@modes
def test_the_last_token_of_the_budget_still_admits_a_chunk(exact_passes: bool) -> None:
    """Two prompts of 100 tokens with a budget of 101: the second is admitted at once, for one token.

    It prefills one token in the first pass and the other 99 in the next,
    beside the first request's decode.
    """
    report = replay_synthetic(
        100, 3, 2, {"block_size": 64, "max_num_batched_tokens": 101}, exact_passes=exact_passes
    )
    assert [r.first_admit_ms for r in report.records] == [0.0, 0.0]
    assert _tokens(report) == [
        (18.023974000000003, 47.528338, 3),
        (41.777882999999996, 53.273592, 3),
    ]
    assert report.summary["committed_prefill_tokens"] == 200
