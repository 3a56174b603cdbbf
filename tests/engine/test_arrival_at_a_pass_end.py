"""A request arriving exactly at a pass end joins the next pass, also inside a fast-forward window.

Request A (100 in / 30 out, block size 64) decodes alone from 18.023974 ms;
its sixth token ends a pass at 46.750499999999995 ms. Request B arrives at
exactly that instant. The pass end is settled first, then the arrival, then
the next pass starts with B in it: B is admitted at its arrival. With decode
fast-forward, A's passes run as one window, which B cuts *at* that pass end
(the pass ending at the arrival is in the past, the one starting then is
not). Every number is the reference's (``refcheck.py reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from tests.support import write_trace

SIXTH_TOKEN_OF_A = 46.750499999999995


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
def test_an_arrival_at_a_pass_end_is_admitted_at_once(tmp_path: Path, exact_passes: bool) -> None:
    """B is admitted at 46.7505 ms; the reference's token times, to the bit."""
    trace = write_trace(
        tmp_path / "trace.jsonl", [(0.0, 100, 30, [1]), (SIXTH_TOKEN_OF_A, 100, 5, [2])]
    )
    report = run(
        RunConfig(
            trace=trace, engine=parse_engine_args({"block_size": 64}), exact_passes=exact_passes
        )
    )
    a, b = report.records
    assert b.arrival_time_ms == SIXTH_TOKEN_OF_A
    assert b.first_admit_ms == SIXTH_TOKEN_OF_A
    assert (a.first_token_ms, a.last_token_ms) == (18.023974000000003, 202.700838)
    assert (b.first_token_ms, b.last_token_ms) == (70.51993399999999, 93.523404)
