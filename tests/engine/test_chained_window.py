"""A fast-forward window may follow a stepped pass in the same busy period (``chain``).

Request A (6-token prompt, 6 output tokens, block size 4) is alone on a
worker. Pass 1 computes its prompt and emits its first token; passes 2-6 are
decode steps of A alone. Stepping ends pass 1, delivers the token and starts
the window at the same instant; when nothing but that token sees the pass end
(round robin, no telemetry, planner or time cap), the worker plans the window
at once and delivers pass 1's outputs first (``PassOutputs.prelude``). A
request arriving by pass 1's end drops the window (it joins pass 2); one
arriving later cuts the window as usual.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import EngineConfig
from servesim.engine.request import EngineRequest
from servesim.engine.worker import Worker
from servesim.metrics.collector import RequestRecord
from servesim.workload.request import BlockContentCache, TracePrompt
from tests.support import write_trace

CONFIG = EngineConfig(block_size=4, num_gpu_blocks=16)


def make_request(uid: int) -> EngineRequest:
    return EngineRequest(uid, TracePrompt((7, 8), 4, 6, BlockContentCache()), 6, shared_blocks=2)


def stepped_pass_ends() -> list[float]:
    """A's six pass ends, stepping every pass (the oracle)."""
    worker = Worker(0, CONFIG, fast_forward=False)
    worker.submit(0, make_request(0), 0.0)
    now, ends = 0.0, []
    while worker.can_start():
        begun = worker.start_pass(now)
        assert begun is not None
        now = begun[0]
        worker.finish_pass()
        ends.append(now)
    return ends


ENDS = stepped_pass_ends()


def chained_worker() -> tuple[Worker, EngineRequest]:
    """A's worker, chaining, with A's first pass and its window started at 0."""
    worker = Worker(0, CONFIG, chain=True, deferred_ends=True)
    a = make_request(0)
    worker.submit(0, a, 0.0)
    begun = worker.start_pass(0.0, math.inf)  # nothing else will arrive
    assert begun is not None
    end, admitted = begun
    assert admitted == [(a, 0)]
    assert end == ENDS[-1]  # one busy period: the prefill pass, then the window to A's end
    return worker, a


def test_the_window_follows_the_prefill_pass_and_its_outputs_come_after() -> None:
    """Pass 1's first token is the prelude, at pass 1's end; the window's tokens follow."""
    assert len(ENDS) == 6
    worker, a = chained_worker()
    outputs = worker.finish_pass()
    assert outputs.prelude is not None
    head, at = outputs.prelude
    assert (head.emitted, head.finished, at) == ([a], [], ENDS[0])
    assert outputs.emitted == []
    assert outputs.finished == [a]
    ((prev_end, members, times),) = outputs.cohorts
    assert (prev_end, members) == (ENDS[0], 1)
    assert times is not None and times.tolist() == ENDS[1:]


@pytest.mark.parametrize("arrival", [ENDS[0] / 2, ENDS[0]], ids=["during", "at_its_end"])
def test_a_request_arriving_by_the_prefill_pass_end_drops_the_window(arrival: float) -> None:
    """The window never began: the worker is busy until pass 1's end, with its outputs alone."""
    worker, a = chained_worker()
    assert worker.submit(0, make_request(1), arrival) == ENDS[0]
    assert worker.busy_until == ENDS[0]
    outputs = worker.finish_pass()
    assert outputs.prelude is None
    assert (outputs.emitted, outputs.cohorts) == ([a], [])


def test_a_request_arriving_in_the_window_cuts_it_at_the_pass_in_flight() -> None:
    """Pass 2 is in flight: the busy period ends with it, after the prelude."""
    worker, a = chained_worker()
    arrival = (ENDS[0] + ENDS[1]) / 2
    assert worker.submit(0, make_request(1), arrival) == ENDS[1]
    outputs = worker.finish_pass()
    assert outputs.prelude is not None
    assert outputs.prelude[0].emitted == [a]
    ((_, _, times),) = outputs.cohorts
    assert times is not None and times.tolist() == ENDS[1:2]


# End to end: request A (100 in / 30 out, block size 64) emits its first token at
# 18.023974 ms (test_arrival_at_a_pass_end.py); B arrives during that pass, at its
# end or in the window after it. Each request's record must be stepping's.
FIRST_TOKEN_OF_A = 18.023974000000003


@pytest.mark.parametrize(
    "arrival",
    [FIRST_TOKEN_OF_A / 2, FIRST_TOKEN_OF_A, FIRST_TOKEN_OF_A + 1.0],
    ids=["during", "at_its_end", "in_the_window"],
)
def test_chained_windows_give_the_records_stepping_gives(tmp_path: Path, arrival: float) -> None:
    """Every record field of A and B agrees with ``exact_passes``, bit for bit."""
    trace = write_trace(tmp_path / "trace.jsonl", [(0.0, 100, 30, [1]), (arrival, 100, 5, [2])])
    engine = parse_engine_args({"block_size": 64})
    fast, exact = (
        [
            {name: getattr(record, name) for name in RequestRecord.__slots__}
            for record in run(RunConfig(trace=trace, engine=engine, exact_passes=mode)).records
        ]
        for mode in (False, True)
    )
    assert fast[0]["first_token_ms"] == FIRST_TOKEN_OF_A
    assert fast == exact
