"""Token gaps fold into the ITL and per-user sketches by their position in one sequence.

However the loop reports the same gaps (a whole window, a window split in two
with a pass stepped between, single gaps), the run reports the same moments,
bit for bit: a planner tick that only splits windows changes nothing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.metrics.collector import _GAP_CHUNK, TokenGaps
from servesim.metrics.stats import GapSketch


def summary(gaps: TokenGaps) -> tuple[dict[str, float], dict[str, float]]:
    gaps.fold()
    return gaps.itl.describe(), gaps.per_user.describe()


def reported_whole(prev_end: float, count: int, times: np.ndarray) -> TokenGaps:
    gaps = TokenGaps()
    gaps.add_window(prev_end, count, times)
    return gaps


def reported_split(prev_end: float, count: int, times: np.ndarray, cuts: list[int]) -> TokenGaps:
    """The window cut at ``cuts``; the token after each cut is a stepped pass's single gap."""
    gaps = TokenGaps()
    before = prev_end
    start = 0
    for cut in [*sorted(set(cuts)), len(times)]:
        if cut > start:
            gaps.add_window(before, count, times[start:cut])
            before = float(times[cut - 1])
        if cut < len(times):
            gaps.add(float(times[cut]) - before, count)
            before = float(times[cut])
        start = cut + 1
    return gaps


def test_a_window_split_by_a_stepped_pass_folds_as_the_whole_window() -> None:
    # Irregular pass times over more than one chunk, so that Welford or per-batch
    # folding would round differently.
    rng = np.random.default_rng(7)
    times = 100.0 + np.cumsum(rng.uniform(5.0, 9.0, _GAP_CHUNK + 5000))
    whole = summary(reported_whole(100.0, 3, times))
    for cuts in ([10], [_GAP_CHUNK - 1], [_GAP_CHUNK], [0, 1, 2, 40_000, _GAP_CHUNK + 4999]):
        assert summary(reported_split(100.0, 3, times, cuts)) == whole, cuts
    itl, per_user = whole
    steps = np.diff(np.concatenate(([100.0], times)))
    assert (itl["min"], itl["max"]) == (float(steps.min()), float(steps.max()))
    assert per_user["min"] == 1000.0 / itl["max"]


def test_single_gaps_only_and_a_zero_gap() -> None:
    gaps = TokenGaps()
    for gap, count in ((4.0, 1), (0.0, 2), (2.0, 1)):
        gaps.add(gap, count)
    itl, per_user = summary(gaps)
    # 4, 0, 0, 2: mean 1.5, population variance (6.25 + 2.25 * 2 + 0.25) / 4 = 2.75.
    assert (itl["mean"], itl["min"], itl["max"]) == (1.5, 0.0, 4.0)
    assert itl["std"] == 2.75**0.5
    # The zero gap has no rate: 1000 / 4 and 1000 / 2.
    assert (per_user["mean"], per_user["min"], per_user["max"]) == (375.0, 250.0, 500.0)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=1, max_size=60),
    st.integers(1, 8),
    st.lists(st.integers(0, 59), max_size=8),
)
def test_any_split_of_a_window_reports_the_same_moments(
    steps: list[float], count: int, cuts: list[int]
) -> None:
    times = 1000.0 + np.cumsum(np.array(steps))
    cuts = [c for c in cuts if c < len(times)]
    assert summary(reported_split(1000.0, count, times, cuts)) == summary(
        reported_whole(1000.0, count, times)
    )


def test_chunks_hold_exactly_the_chunk_size() -> None:
    gaps = TokenGaps()
    gaps.add_window(0.0, 1, np.arange(1.0, _GAP_CHUNK + 11.0))
    # One whole chunk folded; the ten gaps past it wait for the next chunk or the end.
    assert gaps.itl.count == _GAP_CHUNK
    gaps.fold()
    assert gaps.itl.count == _GAP_CHUNK + 10
    alone = GapSketch()
    alone.add_many(np.ones(_GAP_CHUNK + 10))
    assert gaps.itl.describe() == alone.describe()
