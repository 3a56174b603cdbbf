"""Speculative decoding (MTP/Eagle): bursts of tokens per decode step, as the reference's probes show."""

from __future__ import annotations

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.engine.speculative import SpeculativeSampler
from servesim.metrics.collector import RequestRecord
from servesim.workload.rng import StdRng

FIXED = {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0}


def _one_request(**engine: object) -> RequestRecord:
    config = RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=1000, output_tokens=10, request_count=1, arrival_interval_ms=1
        ),
        engine=parse_engine_args({"timing_model": FIXED, **engine}),
    )
    (record,) = run(config).records
    return record


def test_the_prefill_pass_decodes_too_and_emits_a_whole_burst() -> None:
    """nextn 2, every draft accepted: passes at 6, 7, 8 and 9 ms emit 3, 3, 3 and 1 tokens.

    The first pass costs its prefill and one decode step (TTFT 6, not 5), and its
    three tokens share one time (TTST 0).
    """
    record = _one_request(aic_nextn=2, aic_nextn_accept_rates="1,1")
    assert record.first_token_ms == 6.0
    assert record.second_token_ms == 6.0
    assert record.last_token_ms == 9.0
    assert record.output_length == 10


def test_with_no_draft_accepted_every_step_emits_one_token() -> None:
    """Rates 0: one token a pass, but the prefill pass still pays a decode step (E2E 15, not 14)."""
    record = _one_request(aic_nextn=2, aic_nextn_accept_rates="0,0")
    assert record.first_token_ms == 6.0
    assert record.last_token_ms == 15.0


def test_a_burst_stops_at_the_first_rejected_draft_and_at_the_output_left() -> None:
    """Draws follow the reference's generator: a rate-1 draft draws nothing, others one u64 each."""
    rng = StdRng(7)
    draws = [rng.next_u64() for _ in range(3)]
    cut = int(0.5 * 2.0**64)
    sampler = SpeculativeSampler((1.0, 0.5, 0.5), 7)
    # Draft 1 is always accepted; drafts 2 and 3 compare the first two draws with 2^63.
    expected = 2 + (draws[0] < cut) + (draws[0] < cut and draws[1] < cut)
    assert sampler.burst(10) == expected
    assert SpeculativeSampler((1.0, 1.0, 1.0), 7).burst(2) == 2  # capped by the output left
    assert SpeculativeSampler((1.0,), 7).burst(0) == 0


def test_on_sglang_the_prefill_pass_emits_one_token_and_decode_passes_emit_bursts() -> None:
    """The reference's SGLang core: TTFT 5 (no decode step, no burst in the prefill pass),
    then bursts of three at 6, 7 and 8 ms (TTST 1, E2E 8)."""
    record = _one_request(
        backend="sglang", block_size=16, aic_nextn=2, aic_nextn_accept_rates="1,1"
    )
    assert record.first_token_ms == 5.0
    assert record.second_token_ms == 6.0
    assert record.last_token_ms == 8.0
