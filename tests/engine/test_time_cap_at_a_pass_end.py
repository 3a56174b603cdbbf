"""A time cap that falls exactly on a pass end shows that pass's tokens, fast-forwarded or not.

``--max-sim-time-seconds`` (servesim's own) stops the run at the first
timestamp past the cap; a pass ending *at* the cap still ends. One request of
100 in / 30 out, block size 64: its sixth token ends a pass at
46.750499999999995 ms (the reference's time for it). Capped there, the
request is incomplete with six tokens, in both modes; inside a decode
fast-forward window the tokens stamped at or before the cap are delivered.
"""

from __future__ import annotations

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run

SIXTH_TOKEN = 46.750499999999995
SEVENTH_TOKEN = 52.49596


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
@pytest.mark.parametrize(
    "cap", [SIXTH_TOKEN, SEVENTH_TOKEN - 1e-6], ids=["at_sixth", "before_seventh"]
)
def test_tokens_stamped_at_the_cap_are_delivered(exact_passes: bool, cap: float) -> None:
    """Capped at the sixth token's pass end, or just before the seventh's: six tokens, incomplete."""
    report = run(
        RunConfig(
            synthetic=SyntheticWorkload(
                input_tokens=100, output_tokens=30, request_count=1, arrival_interval_ms=0.0
            ),
            engine=parse_engine_args({"block_size": 64}),
            max_sim_time_ms=cap,
            exact_passes=exact_passes,
        )
    )
    (record,) = report.records
    assert report.time_limited
    assert record.terminal_status is None
    assert record.output_length == 6
    assert record.first_token_ms == 18.023974000000003
    assert record.last_token_ms == SIXTH_TOKEN
    assert report.summary["incomplete_requests"] == 1
