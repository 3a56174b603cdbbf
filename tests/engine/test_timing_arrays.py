"""The vectorised timing paths agree with the per-pass ones to the last bit.

A fast-forward window prices its passes with :func:`pass_durations` over
:meth:`PolynomialTiming.decode_series`; pass-by-pass stepping uses
:func:`pass_duration` over :meth:`PolynomialTiming.decode_ms`. Any last-bit
difference would move a pass end, so they are compared bit for bit.
"""

from __future__ import annotations

import weakref
from fractions import Fraction
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine.timing import (
    InterpolatedTiming,
    PolynomialTiming,
    _exact_ns,
    _round_ns,
    _round_ns_array,
    decode_durations,
    pass_duration,
    pass_durations,
)

# Durations in ms: ordinary decode steps, values on or a hair off half a
# nanosecond (where the exact value decides the rounding), and passes of a
# second or more (whose whole seconds are split off).
HALF_NS = st.integers(0, 10**10).map(lambda n: (n + 0.5) / 1e6)
DURATIONS = st.one_of(
    st.floats(0.0, 100.0),
    HALF_NS,
    HALF_NS.map(lambda ms: float(np.nextafter(ms, 0.0))),
    HALF_NS.map(lambda ms: float(np.nextafter(ms, np.inf))),
    st.floats(999.0, 5e6),
)
DIVISORS = st.sampled_from([1.0, 0.5, 1.5, 2.0, 3.0, 7.0])


@given(
    st.one_of(
        st.floats(-1e6, 1e6),
        HALF_NS.map(lambda ms: ms / 1000.0),
        # Dyadic values: n / 2^k seconds times 10^9 is often exactly half a nanosecond.
        st.builds(lambda n, k: n / 2.0**k, st.integers(-(2**30), 2**30), st.integers(0, 45)),
    )
)
def test_exact_rounding_is_the_fractions_rounding(seconds: float) -> None:
    """Integer rounding on the float's exact value equals Fraction's, ties to even included."""
    assert _exact_ns(seconds) == round(Fraction(seconds) * 1_000_000_000)


@given(
    st.lists(
        st.one_of(
            st.floats(-1e6, 1e6),
            HALF_NS.map(lambda ms: ms / 1000.0),
            HALF_NS.map(lambda ms: float(np.nextafter(ms / 1000.0, -np.inf))),
            HALF_NS.map(lambda ms: float(np.nextafter(ms / 1000.0, np.inf))),
            st.builds(lambda n, k: n / 2.0**k, st.integers(-(2**30), 2**30), st.integers(0, 45)),
        ),
        max_size=30,
    )
)
def test_array_rounding_is_the_scalar_rounding(seconds: list[float]) -> None:
    """Values near a half nanosecond are decided element-wise on their exact products
    (two-product, no Python loop), as the scalar path decides them in integers."""
    assert _round_ns_array(np.array(seconds, dtype=np.float64)).tolist() == [
        float(_round_ns(s)) for s in seconds
    ]


def test_array_rounding_breaks_ties_to_even() -> None:
    """Exact halves, of either parity and sign, and their neighbours a float away."""
    halves = [1 / 1024, 3 / 1024, -1 / 1024, -3 / 1024, 5 / 1024]
    values = halves + [float(np.nextafter(h, np.inf)) for h in halves]
    values += [float(np.nextafter(h, -np.inf)) for h in halves]
    assert _round_ns_array(np.array(values)).tolist() == [float(_exact_ns(v)) for v in values]
    assert _round_ns_array(np.array(halves)).tolist() == [
        976_562.0,
        2_929_688.0,
        -976_562.0,
        -2_929_688.0,
        4_882_812.0,
    ]


def test_exact_rounding_breaks_ties_to_even() -> None:
    """1/1024 s is exactly 976,562.5 ns and 3/1024 s 2,929,687.5 ns: ties go to the even neighbour."""
    assert _exact_ns(1 / 1024) == 976_562
    assert _exact_ns(3 / 1024) == 2_929_688
    assert _exact_ns(-1 / 1024) == -976_562


@given(st.lists(DURATIONS, min_size=1, max_size=40), DIVISORS)
def test_pass_durations_is_pass_duration_element_wise(ms: list[float], divisor: float) -> None:
    """Every element rounds, divides and rounds again exactly as one pass does."""
    got = pass_durations(np.array(ms), divisor).tolist()
    assert got == [pass_duration(x, divisor) for x in ms]


def test_pass_durations_on_exact_half_nanoseconds() -> None:
    """Exact halves round by their exact value, below and above one second."""
    ms = np.array([0.0000005, 0.0000015, 6.6666665, 1000.0000005, 2.5e-7, 3.0])
    assert pass_durations(ms).tolist() == [pass_duration(x) for x in ms]
    assert pass_durations(ms, 3.0).tolist() == [pass_duration(x, 3.0) for x in ms]


@given(
    st.integers(1, 64),
    st.integers(0, 3_000_000),
    st.integers(2, 300),
    st.sampled_from([0, 1000, 1 << 20, 1_048_576 * 3 + 7]),
)
def test_decode_series_is_decode_ms_step_by_step(
    batch: int, first_total: int, passes: int, capacity: int
) -> None:
    """Step j prices first_total + j * batch tokens, to the last bit (full pool clamped)."""
    timing = PolynomialTiming(capacity, 1.0, 1.0)
    series = timing.decode_series(batch, first_total, passes).tolist()
    expected = [
        timing.decode_ms(batch, first_total + j * batch, (first_total + j * batch) // batch)
        for j in range(passes)
    ]
    assert series == expected


@settings(deadline=None)  # the first example of a capacity grows its table to a million values
@given(
    st.integers(1, 64),
    st.integers(0, 3_000_000),
    st.integers(1, 300),
    st.sampled_from([0, 1000, 1 << 20, 1_048_576 * 3 + 7]),
    DIVISORS,
)
def test_decode_durations_from_the_table_are_the_computed_ones(
    batch: int, first_total: int, passes: int, capacity: int, divisor: float
) -> None:
    """A window's durations, sliced from the polynomial's shared table (grown as asked,
    clamped past the capacity), are pass_durations of decode_series to the last bit."""
    timing = PolynomialTiming(capacity, divisor, 1.0)
    got = decode_durations(timing, batch, first_total, passes)
    assert not got.flags.writeable
    computed = pass_durations(timing.decode_series(batch, first_total, passes), divisor)
    assert got.tolist() == computed.tolist()


def test_models_of_one_capacity_and_speed_share_their_table() -> None:
    """Sixteen workers of one engine config hold one table, not sixteen; it goes with
    the last model using it (a sweep in one process keeps no run's table)."""
    a, b = PolynomialTiming(4096, 2.0, 1.0), PolynomialTiming(4096, 2.0, 1.0)
    assert a._durations is b._durations
    assert PolynomialTiming(4096, 1.0, 1.0)._durations is not a._durations
    decode_durations(a, 3, 0, 100)
    table = weakref.ref(a._durations)
    del a
    assert decode_durations(b, 3, 0, 2000).tolist() == (
        pass_durations(b.decode_series(3, 0, 2000), 2.0).tolist()
    )
    del b
    assert table() is None


PROFILE = InterpolatedTiming(
    str(Path(__file__).parent.parent / "data" / "h200_llama31_8b_fp8_tp1.npz"), 1.0, 1.0
)


@given(
    st.integers(1, 300),
    st.one_of(st.integers(0, 20_000), st.integers(0, 2_000_000), st.integers(0, 10**9)),
    st.integers(1, 400),
)
def test_profile_decode_series_is_decode_ms_step_by_step(
    batch: int, first_total: int, passes: int
) -> None:
    """The bilinear lookups, vectorised, inside the profile's axes and extrapolated beyond them."""
    series = PROFILE.decode_series(batch, first_total, passes).tolist()
    expected = [
        PROFILE.decode_ms(batch, first_total + j * batch, (first_total + j * batch) // batch)
        for j in range(passes)
    ]
    assert series == expected
