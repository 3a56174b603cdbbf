"""The ``fixed`` timing model: a constant per pass part, as the reference's probes show it."""

from __future__ import annotations

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.metrics.collector import RequestRecord


def _records(count: int, interval: float, prompt: int, **engine: object) -> list[RequestRecord]:
    timing = {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0}
    config = RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=prompt, output_tokens=10, request_count=count, arrival_interval_ms=interval
        ),
        engine=parse_engine_args({"timing_model": timing, **engine}),
    )
    return run(config).records


def test_a_pass_costs_prefill_ms_if_it_prefills_and_decode_ms_if_it_decodes() -> None:
    """One 1,000/10 request: TTFT 5 (prefill, plus the first token's decode step), TTST 1, E2E 14."""
    (record,) = _records(1, 10.0, 1000)
    assert record.first_token_ms == 5.0
    assert record.second_token_ms == 6.0
    assert record.last_token_ms == 14.0


def test_a_pass_with_a_prefill_and_decodes_costs_both() -> None:
    """A second request at 2 ms is admitted at 5; its pass (its prefill and the first's
    decode) lasts 6 ms, so its first token comes at 11."""
    first, second = _records(2, 2.0, 1000)
    assert first.first_token_ms == 5.0
    assert second.first_token_ms == 11.0


def test_a_chunked_prompt_pays_the_prefill_of_every_pass() -> None:
    """3,000 tokens on a 1,024 budget take three passes: TTFT 15."""
    (record,) = _records(1, 10.0, 3000, max_num_batched_tokens=1024)
    assert record.first_token_ms == 15.0


def test_the_speedup_ratio_divides_both_parts() -> None:
    (record,) = _records(1, 10.0, 1000, speedup_ratio=2.0)
    assert record.first_token_ms == pytest.approx(2.5, abs=1e-12)
    assert record.last_token_ms == pytest.approx(7.0, abs=1e-12)
