"""Timing models: how long a pass's prefill and decode parts take, in ms.

A pass lasts ``prefill + decode`` (sequential, not overlapped). Prefill is
priced on the batch reduction the reference uses: ``batch`` prompts with mean
computed-through length ``isl`` and mean already-present prefix ``prefix``
(both floored means), so ``batch * (isl - prefix)`` new tokens. Decode is
priced on the decoding requests' logical context. The models give unscaled
times; speed-up ratios (``speedup`` for both parts, times ``decode_speedup``
for decode) divide each part once it is rounded to the nanosecond, as the
reference does (:func:`pass_duration`).
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from servesim.config import EngineConfig
from servesim.errors import ConfigError

if TYPE_CHECKING:
    from servesim.aic import AicSpec


class TimingModel(Protocol):
    """Prices the two parts of a pass (unscaled: see ``prefill_divisor`` and ``decode_divisor``)."""

    prefill_divisor: float
    """What a rounded prefill time is divided by (the speed-up ratio)."""
    decode_divisor: float
    """What a rounded decode time is divided by (speed-up x decode speed-up)."""

    def prefill_ms(self, batch: int, isl: int, prefix: int) -> float:
        """Prefill time of ``batch`` prompts computed through ``isl`` after ``prefix`` cached tokens."""
        ...

    def decode_ms(self, batch: int, active_kv_tokens: int, context: int) -> float:
        """Decode time of one step over ``batch`` requests holding ``active_kv_tokens`` in total."""
        ...

    def decode_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """Decode times of ``passes`` consecutive steps over a fixed batch.

        Step j prices ``first_total + j * batch`` context tokens (each request
        grows by one token a step); every element equals what
        :meth:`decode_ms` returns for that step, to the last bit.
        """
        ...


class PolynomialTiming:
    """The reference's default fitted polynomials.

    prefill = 4.209989e-07 t^2 + 1.518344e-02 t + 16.50142, t = batch * (isl - prefix)
    decode  = max(-25.74 p^2 + 54.01 p + 5.74, 1.0), p = min(active KV tokens / capacity, 1)

    Evaluated with the reference's float operations (``p`` by division, the
    squares first), so that durations agree to the last bit: many durations
    lie exactly on half a nanosecond, where a last-bit difference decides the
    rounding (see :func:`pass_duration`).
    """

    __slots__ = ("_durations", "_total", "decode_divisor", "prefill_divisor")

    def __init__(self, total_kv_tokens: int, speedup: float, decode_speedup: float) -> None:
        self._total = float(total_kv_tokens)
        self.prefill_divisor = speedup if speedup > 0 else 1.0
        self.decode_divisor = self.prefill_divisor * (decode_speedup if decode_speedup > 0 else 1.0)
        # Rounded decode pass durations by total context tokens, shared by every live
        # model of the same capacity and divisor (see pass_series).
        key = (total_kv_tokens, self.decode_divisor)
        table = _DURATION_TABLES.get(key)
        if table is None:
            table = _DURATION_TABLES[key] = _DurationTable()
        self._durations = table

    def prefill_ms(self, batch: int, isl: int, prefix: int) -> float:
        """See :class:`TimingModel`."""
        new = isl - prefix
        t = batch * new if new > 0 else 0
        if batch == 0 or t == 0:
            return 0.0
        ms = 4.209989e-07 * (t * t) + 1.518344e-02 * t + 16.50142
        return 0.0 if ms < 0.0 else ms

    def decode_ms(self, batch: int, active_kv_tokens: int, context: int) -> float:
        """See :class:`TimingModel`."""
        if batch == 0:
            return 0.0
        # Shared blocks count once in the pool but in every request's context: clamp at full.
        p = active_kv_tokens / self._total if self._total else 1.0
        if p > 1.0:
            p = 1.0
        ms = -25.74 * (p * p) + 54.01 * p + 5.74
        return 1.0 if ms < 1.0 else ms

    def decode_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """See :class:`TimingModel`; the same operations as :meth:`decode_ms`, element-wise."""
        if not self._total:
            return np.full(passes, max(-25.74 + 54.01 + 5.74, 1.0))
        if batch < 1 or first_total < 0:
            totals = np.arange(passes, dtype=np.float64) * batch + first_total
            p = np.minimum(totals / self._total, 1.0)
            return np.maximum(-25.74 * (p * p) + 54.01 * p + 5.74, 1.0)
        # The operations of decode_ms, in its order, in as few numpy calls as they take
        # (their per-call cost dominates: windows are short). The totals are integers
        # below 2^53, so arange's start + i * step is exact, as the products were.
        p = np.arange(first_total, first_total + passes * batch, batch, dtype=np.float64)
        p /= self._total
        if first_total + (passes - 1) * batch > self._total:
            np.minimum(p, 1.0, out=p)
        ms: np.ndarray = p * p
        ms *= -25.74
        p *= 54.01
        ms += p
        ms += 5.74
        # p is in [0, 1], where the polynomial is at least 5.74: the 1 ms floor never binds.
        return ms

    def pass_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """:func:`pass_durations` of :meth:`decode_series` (``batch`` >= 1, ``first_total``
        >= 0), sliced from the shared table of durations by total context, read-only."""
        last = first_total + (passes - 1) * batch
        capacity = int(self._total)
        table = self._durations.upto(min(last, capacity), self)
        if last <= capacity:
            return table[first_total : last + 1 : batch]
        # Steps past the capacity all cost what a full cache does.
        out = np.full(passes, table[capacity])
        if first_total <= capacity:
            within = (capacity - first_total) // batch + 1
            out[:within] = table[first_total : capacity + 1 : batch]
        out.flags.writeable = False
        return out


class _DurationTable:
    """A polynomial model's rounded decode pass durations for totals 0, 1, 2, ... tokens
    of context, computed as far as asked (by doubling) with :meth:`PolynomialTiming.decode_series`
    and :func:`pass_durations`, element by element the same values.

    A decode step's duration depends on its total context alone, so every window's
    durations are a strided slice of this one array (up to the capacity, past which
    the fraction ``p`` stays at 1).
    """

    __slots__ = ("__weakref__", "values")

    def __init__(self) -> None:
        self.values = np.empty(0)

    def upto(self, total: int, model: PolynomialTiming) -> np.ndarray:
        """The durations of totals ``0..total`` (and maybe more), read-only, computing
        those missing with ``model`` (any of the models sharing the table)."""
        have = len(self.values)
        if total >= have:
            grown = max(total + 1, 2 * have, 1024)
            more = pass_durations(model.decode_series(1, have, grown - have), model.decode_divisor)
            values = np.concatenate((self.values, more))
            values.flags.writeable = False
            self.values = values
        return self.values


# The tables of the models alive (a sweep in one process frees each run's).
_DURATION_TABLES: weakref.WeakValueDictionary[tuple[int, float], _DurationTable] = (
    weakref.WeakValueDictionary()
)


def decode_durations(timing: TimingModel, batch: int, first_total: int, passes: int) -> np.ndarray:
    """Rounded durations of ``passes`` decode steps over a fixed batch: :func:`pass_durations`
    of :meth:`TimingModel.decode_series`, read-only.

    The polynomial model reads them from its table (a window costs one slice instead
    of some twenty array operations); the others compute them.
    """
    if isinstance(timing, PolynomialTiming) and batch >= 1 and first_total >= 0:
        return timing.pass_series(batch, first_total, passes)
    return pass_durations(timing.decode_series(batch, first_total, passes), timing.decode_divisor)


class FixedTiming:
    """A constant price per pass part: ``prefill_ms`` if the pass prefills anything,
    ``decode_ms`` if it decodes anything, whatever the batch (the reference's ``fixed``)."""

    __slots__ = ("_decode", "_prefill", "decode_divisor", "prefill_divisor")

    def __init__(
        self, prefill_ms: float, decode_ms: float, speedup: float, decode_speedup: float
    ) -> None:
        self._prefill = prefill_ms
        self._decode = decode_ms
        self.prefill_divisor = speedup if speedup > 0 else 1.0
        self.decode_divisor = self.prefill_divisor * (decode_speedup if decode_speedup > 0 else 1.0)

    def prefill_ms(self, batch: int, isl: int, prefix: int) -> float:
        """See :class:`TimingModel`."""
        return self._prefill if batch else 0.0

    def decode_ms(self, batch: int, active_kv_tokens: int, context: int) -> float:
        """See :class:`TimingModel`."""
        return self._decode if batch else 0.0

    def decode_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """See :class:`TimingModel`."""
        return np.full(passes, self._decode if batch else 0.0)


class InterpolatedTiming:
    """Measured profile (NPZ): linear prefill and bilinear decode, both extrapolating.

    Arrays: ``prefill_isl``, ``prefill_ttft_ms`` (1-D, same length);
    ``decode_active_kv_tokens`` (rows), ``decode_context_length`` (cols),
    ``decode_itl`` (rows x cols). Prefill is floored at 0 ms, decode at 1 ms.
    """

    __slots__ = ("_ctx", "_itl", "_kv", "_pre_t", "_pre_x", "decode_divisor", "prefill_divisor")

    def __init__(self, path: str, speedup: float, decode_speedup: float) -> None:
        arrays = _load_profile(path)
        self._pre_x, self._pre_t = arrays["prefill_isl"], arrays["prefill_ttft_ms"]
        self._kv, self._ctx = arrays["decode_active_kv_tokens"], arrays["decode_context_length"]
        self._itl = arrays["decode_itl"]
        if self._pre_x.ndim != 1 or self._pre_x.shape != self._pre_t.shape:
            raise ConfigError(
                f"timing profile {path}: prefill_isl and prefill_ttft_ms must be 1-D arrays of "
                f"the same length, got shapes {self._pre_x.shape} and {self._pre_t.shape}"
            )
        if self._itl.shape != (self._kv.size, self._ctx.size):
            raise ConfigError(
                f"timing profile {path}: decode_itl has shape {self._itl.shape}, expected "
                f"{(self._kv.size, self._ctx.size)} (decode_active_kv_tokens x "
                "decode_context_length)"
            )
        for name in ("prefill_isl", "decode_active_kv_tokens", "decode_context_length"):
            _check_axis(path, name, arrays[name])
        for name, array in arrays.items():
            if not np.isfinite(array).all():
                raise ConfigError(f"timing profile {path}: {name} holds a NaN or infinity")
        self.prefill_divisor = speedup if speedup > 0 else 1.0
        self.decode_divisor = self.prefill_divisor * (decode_speedup if decode_speedup > 0 else 1.0)

    def prefill_ms(self, batch: int, isl: int, prefix: int) -> float:
        """See :class:`TimingModel`."""
        x = batch * max(isl - prefix, 0)
        if batch == 0 or x == 0:
            return 0.0
        return max(_interp1(self._pre_x, self._pre_t, float(x)), 0.0)

    def decode_ms(self, batch: int, active_kv_tokens: int, context: int) -> float:
        """See :class:`TimingModel`."""
        if batch == 0:
            return 0.0
        i, fi = _segment(self._kv, float(active_kv_tokens))
        j, fj = _segment(self._ctx, float(context))
        g = self._itl
        top = g[i, j] + (g[i, j + 1] - g[i, j]) * fj
        bottom = g[i + 1, j] + (g[i + 1, j + 1] - g[i + 1, j]) * fj
        return max(float(top + (bottom - top) * fi), 1.0)

    def decode_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """See :class:`TimingModel`: :meth:`decode_ms`'s float operations, element-wise."""
        if batch < 1:  # not a decode batch; step by step, as the per-pass path would
            totals_ = range(first_total, first_total + passes * batch, batch)
            return np.fromiter(
                (self.decode_ms(batch, t, t // batch) for t in totals_), np.float64, passes
            )
        totals = np.arange(first_total, first_total + passes * batch, batch, dtype=np.int64)
        i, fi = _segments(self._kv, totals.astype(np.float64))
        j, fj = _segments(self._ctx, (totals // batch).astype(np.float64))
        g = self._itl
        top = g[i, j] + (g[i, j + 1] - g[i, j]) * fj
        bottom = g[i + 1, j] + (g[i + 1, j + 1] - g[i + 1, j]) * fj
        ms: np.ndarray = np.maximum(top + (bottom - top) * fi, 1.0)
        return ms


_PROFILE_ARRAYS = (
    "prefill_isl",
    "prefill_ttft_ms",
    "decode_active_kv_tokens",
    "decode_context_length",
    "decode_itl",
)


def _load_profile(path: str) -> dict[str, np.ndarray]:
    """The arrays of an interpolated profile, as float64.

    Raises:
        ConfigError: the file is not an NPZ, or an array is missing or not numeric.
    """
    try:
        with np.load(path) as data:
            missing = [name for name in _PROFILE_ARRAYS if name not in data.files]
            if missing:
                raise ConfigError(
                    f"timing profile {path}: missing array(s) {', '.join(missing)} (an "
                    f"interpolated profile holds {', '.join(_PROFILE_ARRAYS)})"
                )
            return {name: np.asarray(data[name], dtype=np.float64) for name in _PROFILE_ARRAYS}
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"timing profile {path}: cannot load ({exc})") from None


def _check_axis(path: str, name: str, axis: np.ndarray) -> None:
    """An interpolation axis: 1-D, at least 2 points, strictly increasing."""
    if axis.ndim != 1 or axis.size < 2:
        raise ConfigError(
            f"timing profile {path}: {name} must be a 1-D array of at least 2 points, "
            f"got shape {axis.shape}"
        )
    steps = np.diff(axis)
    if not (steps > 0).all():
        at = int(np.argmin(steps > 0))
        raise ConfigError(
            f"timing profile {path}: {name} must be strictly increasing, but point {at + 1} "
            f"({axis[at + 1]:g}) follows {axis[at]:g}"
        )


class AicTiming:
    """AIConfigurator's kernel-level estimate of a pass, from its perf database.

    Prefill of ``batch`` prompts computed through ``isl`` after ``prefix`` present
    tokens is ``predict_prefill_latency(batch, isl, prefix)``: GEMMs over
    ``batch * (isl - prefix)`` new tokens, attention of those tokens over the whole
    ``isl`` (the cached prefix is read, not recomputed). Decode is one generation
    step of ``batch`` requests at the mean context, ``predict_decode_latency(batch,
    context, 2)``, floored at 1 ms as the reference floors it.

    Each AIC call costs microseconds, more than the rest of a pass's pricing, and a
    fast-forward window prices hundreds of steps at once. So every price is
    memoised for the run, and the long token axes are bucketed: decode contexts
    below 64 are exact, above they lie on a grid of 64 nodes per octave (spacing at
    most 1/64 of the value, see :func:`_node`); prefill prefixes on 16 per octave;
    a price between two nodes is the linear interpolation between them. The batch is
    exact. New prefill tokens are bucketed (64 per octave) only where AIC's prefill
    is smooth in them (see ``_SMOOTH_GEMM_TOKENS``): elsewhere it jumps between
    adjacent token counts where its GEMM tables change tile (by 17% from 1,024 to
    1,025 tokens for Qwen3-32B on H100), which interpolation would smear, so they are
    exact. Measured against direct AIC calls on thousands of random shapes for three
    engines, the largest error is 0.79% (decode) and 0.33% (prefill);
    ``tests/engine/test_aic_timing.py`` holds it under 1%.

    One model is shared by every worker of a run that asks for the same engine (see
    :func:`make_timing`), so the memo fills once for the whole cluster.
    """

    __slots__ = ("_decode", "_engine", "_prefill", "decode_divisor", "prefill_divisor")

    def __init__(self, engine: Any, speedup: float, decode_speedup: float) -> None:
        self._engine = engine
        self._prefill: dict[tuple[int, int, int], float] = {}
        self._decode: dict[tuple[int, int], float] = {}
        self.prefill_divisor = speedup if speedup > 0 else 1.0
        self.decode_divisor = self.prefill_divisor * (decode_speedup if decode_speedup > 0 else 1.0)

    def prefill_ms(self, batch: int, isl: int, prefix: int) -> float:
        """See :class:`TimingModel`."""
        new = isl - prefix
        if batch == 0 or new <= 0:
            return 0.0
        n0, step = _node(new)
        if (
            n0 == new
            or not _SMOOTH_GEMM_TOKENS[0]
            < batch * n0
            < batch * (n0 + step)
            <= (_SMOOTH_GEMM_TOKENS[1])
        ):
            return max(self._prefill_at(batch, new, prefix), 0.0)
        ms = self._prefill_at(batch, n0, prefix)
        ms += (self._prefill_at(batch, n0 + step, prefix) - ms) * ((new - n0) / step)
        return max(ms, 0.0)

    def _prefill_at(self, batch: int, new: int, prefix: int) -> float:
        """Prefill of exactly ``new`` tokens, interpolated between prefix nodes."""
        p0, step = _node(prefix, _PREFIX_BITS)
        ms = self._prefill_node(batch, new, p0)
        if prefix != p0:
            ms += (self._prefill_node(batch, new, p0 + step) - ms) * ((prefix - p0) / step)
        return ms

    def _prefill_node(self, batch: int, new: int, prefix: int) -> float:
        key = (batch, new, prefix)
        ms = self._prefill.get(key)
        if ms is None:
            ms = self._prefill[key] = _ask_aic(
                self._engine.predict_prefill_latency, batch, new + prefix, prefix
            )
        return ms

    def decode_ms(self, batch: int, active_kv_tokens: int, context: int) -> float:
        """See :class:`TimingModel` (AIC prices the mean context; the pool's use does not count)."""
        if batch == 0:
            return 0.0
        context = max(context, 1)
        c0, step = _node(context)
        lo = self._decode_node(batch, c0)
        hi = self._decode_node(batch, c0 + step)
        return max(lo + (hi - lo) * ((context - c0) / step), 1.0)

    def _decode_node(self, batch: int, context: int) -> float:
        key = (batch, context)
        ms = self._decode.get(key)
        if ms is None:
            ms = self._decode[key] = _ask_aic(
                self._engine.predict_decode_latency, batch, context, 2
            )
        return ms

    def decode_series(self, batch: int, first_total: int, passes: int) -> np.ndarray:
        """See :class:`TimingModel`: :meth:`decode_ms`'s float operations, element-wise.

        Step j's mean context is ``(first_total + j * batch) // batch``, which is
        ``first_total // batch + j``: the window walks the context grid one token a step.
        """
        if batch < 1:
            totals = range(first_total, first_total + passes * batch, batch)
            return np.fromiter(
                (self.decode_ms(batch, t, t // batch) for t in totals), np.float64, passes
            )
        first = first_total // batch
        # The grid nodes the window spans, in order (each segment's upper node is the
        # next one's lower node), then each step's segment.
        starts, context = [], max(first, 1)  # decode_ms prices a context of 0 as 1
        while context < first + passes:
            node, step = _node(context)
            starts.append(node)
            context = node + step
        node_ms = np.array([self._decode_node(batch, c) for c in (*starts, context)])
        nodes = np.array((*starts, context), dtype=np.int64)
        contexts = np.maximum(np.arange(first, first + passes, dtype=np.int64), 1)
        segment = np.searchsorted(nodes, contexts, side="right") - 1
        lo, hi = nodes[segment], nodes[segment + 1]
        lo_ms, hi_ms = node_ms[segment], node_ms[segment + 1]
        fraction = (contexts - lo).astype(np.float64) / (hi - lo).astype(np.float64)
        ms: np.ndarray = np.maximum(lo_ms + (hi_ms - lo_ms) * fraction, 1.0)
        return ms


def _ask_aic(predict: Any, *args: int) -> float:
    """One AIC prediction; its failures (the package raises several kinds, e.g. a kernel
    table the database lacks for this model and GPU) become one :class:`ConfigError`."""
    try:
        return float(predict(*args))
    except Exception as exc:  # any failure inside the package is about this engine's data
        raise ConfigError(f"AIC cannot price {predict.__name__}{args}: {exc}") from None


_EXACT_BELOW_BITS = 7
"""Token counts below ``2 ** (_EXACT_BELOW_BITS - 1)`` (64) are AIC grid nodes
themselves; above, an octave holds 64 nodes."""


_SMOOTH_GEMM_TOKENS = (4352, 32768)
"""Where AIC's prefill is smooth in the GEMM token count ``batch x new tokens``: it jumps
(by up to 17%) as that count crosses a multiple of 256 up to 4,352, and again (up to
5%, Llama-3.1-70B on B200) past 32,768; between them it has no step above 0.2%
(scanned for Llama-3.1-8B, Qwen3-32B and Llama-3.1-70B, batches 1 and 2). New tokens
are bucketed only in cells wholly inside this range; elsewhere they are exact."""

_PREFIX_BITS = 5
"""Prefill prefixes are bucketed more coarsely, 16 nodes per octave (exact below 16):
prefill is smooth in the prefix (the attention over it is linear in its length), and
each prefix node costs an AIC call of tens to hundreds of microseconds."""


def _node(tokens: int, bits: int = _EXACT_BELOW_BITS) -> tuple[int, int]:
    """The AIC grid node at or below ``tokens`` (>= 0) and the grid spacing there: exact
    below ``2 ** (bits - 1)``, ``2 ** (bits - 1)`` nodes per octave above."""
    step = 1 << max(tokens.bit_length() - bits, 0)
    return tokens - tokens % step, step


def _segment(axis: np.ndarray, x: float) -> tuple[int, float]:
    """Index of the axis segment used for x (edge segments extrapolate) and the fraction along it."""
    i = int(axis.searchsorted(x, side="right")) - 1
    i = min(max(i, 0), axis.size - 2)
    lo, hi = float(axis[i]), float(axis[i + 1])
    return i, (x - lo) / (hi - lo) if hi != lo else 0.0


def _segments(axis: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_segment` element-wise."""
    i = np.searchsorted(axis, xs, side="right") - 1
    np.clip(i, 0, axis.size - 2, out=i)
    lo, hi = axis[i], axis[i + 1]
    width = hi - lo
    fraction = np.zeros_like(xs)
    np.divide(xs - lo, width, out=fraction, where=hi != lo)
    return i, fraction


def _interp1(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    i, f = _segment(xs, x)
    return float(ys[i] + (ys[i + 1] - ys[i]) * f)


def pass_duration(ms: float, divisor: float = 1.0) -> float:
    """A pass part's duration as the reference's clock advances it: whole nanoseconds.

    The reference turns a modelled duration into a ``Duration`` from
    ``ms / 1000`` seconds, rounded to the nearest nanosecond on that float's
    exact value; a speed-up ratio then divides that ``Duration`` (its float
    seconds, rounded to the nanosecond again); the clock reads it back as
    float seconds x 1000. The float product ``s * 1e9`` settles each rounding
    except within a hair of a half nanosecond, where the exact value decides.
    Matching this keeps pass ends, and so same-instant ties with arrivals,
    identical to the last bit.
    """
    if not ms:
        return 0.0  # a pass without that part (the common case on the per-pass path)
    ns = _round_ns(ms / 1000.0)
    if divisor != 1.0:
        ns = _round_ns(_seconds(ns) / divisor)
    return _seconds(ns) * 1000.0


def _round_ns(seconds: float) -> int:
    scaled = seconds * 1e9
    if abs(scaled - math.floor(scaled) - 0.5) < _NEAR_HALF:
        return _exact_ns(seconds)
    return math.floor(scaled + 0.5)


def _exact_ns(seconds: float) -> int:
    """``seconds`` in whole nanoseconds, rounded on the float's exact value (half to even).

    What ``round(Fraction(seconds) * 10**9)`` gives, in integer arithmetic
    (a tenth of its cost: windows meet a few such values each).
    """
    num, den = seconds.as_integer_ratio()
    whole, rest = divmod(num * 1_000_000_000, den)
    twice = 2 * rest
    if twice > den or (twice == den and whole & 1):
        return whole + 1
    return whole


def _seconds(ns: int) -> float:
    whole, sub_ns = divmod(ns, 1_000_000_000)
    return whole + sub_ns / 1e9


def pass_durations(ms: np.ndarray, divisor: float = 1.0) -> np.ndarray:
    """:func:`pass_duration` element-wise, with the same float operations.

    Whole nanoseconds are carried as float64 (exact below 2^53 ns, about 104
    days); this runs once per fast-forward window, so it avoids numpy calls
    where it can (see :func:`_seconds_array`).
    """
    ns = _round_ns_array(ms / 1000.0)
    if divisor != 1.0:
        ns = _round_ns_array(_seconds_array(ns) / divisor)
    out = _seconds_array(ns)
    out *= 1000.0
    return out


def _round_ns_array(seconds: np.ndarray) -> np.ndarray:
    """:func:`_round_ns` element-wise: whole nanoseconds, as float64."""
    scaled = seconds * 1e9
    near = scaled - np.floor(scaled)
    near -= 0.5
    np.abs(near, out=near)
    exact = (near < _NEAR_HALF).nonzero()[0]  # flatnonzero, without its overhead
    if len(exact):
        decided = _exact_ns_array(seconds[exact], scaled[exact])
    ns = scaled
    ns += 0.5
    np.floor(ns, out=ns)
    if len(exact):
        ns[exact] = decided
    return ns


def _exact_ns_array(seconds: np.ndarray, scaled: np.ndarray) -> np.ndarray:
    """:func:`_exact_ns` element-wise, for values whose product ``scaled = seconds * 1e9``
    lies within :data:`_NEAR_HALF` of a half: as float64 whole nanoseconds.

    The exact product is ``scaled + error``, the error found exactly by Dekker's
    two-product (Veltkamp splits, no fused operations). With ``whole =
    floor(scaled)``, ``scaled - whole - 0.5`` is exact (a fraction near one half), and
    the sign of a float sum is the sign of the exact sum: so ``(scaled - whole - 0.5) +
    error`` tells above, below or exactly on the half, and a half goes to the even
    neighbour. (A divisor of 2 puts every odd nanosecond count here: a Python loop over
    them took 0.5 s for a million-entry duration table.)
    """
    high, low = _split(seconds)
    error = low * _GIGA_LOW - (((scaled - high * _GIGA_HIGH) - low * _GIGA_HIGH) - high * _GIGA_LOW)
    whole: np.ndarray = np.floor(scaled)
    above = ((scaled - whole) - 0.5) + error
    up = (above > 0.0) | ((above == 0.0) & (np.fmod(whole, 2.0) != 0.0))
    whole += up
    return whole


def _split(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp's split: ``values = high + low`` exactly, each half the mantissa's bits."""
    spread = values * 134217729.0  # 2**27 + 1
    high = spread - (spread - values)
    return high, values - high


_GIGA_HIGH, _GIGA_LOW = (float(part[0]) for part in _split(np.array([1e9])))


def _seconds_array(ns: np.ndarray) -> np.ndarray:
    """:func:`_seconds` element-wise, from whole nanoseconds held as float64.

    Below one second (every decode step) the whole part is 0 and
    ``0.0 + ns / 1e9`` is ``ns / 1e9`` exactly: the integer split is skipped.
    """
    if len(ns) and ns.min() >= 0.0 and ns.max() < 1e9:
        return ns / 1e9
    whole, sub_ns = np.divmod(ns.astype(np.int64), 1_000_000_000)
    return whole.astype(np.float64) + sub_ns / 1e9


_NEAR_HALF = 1e-3
"""How close (ns) to a half nanosecond the float product must be for the exact value to decide."""


def make_timing(config: EngineConfig) -> TimingModel:
    """The timing model an engine config asks for (a measured profile's is shared, see below)."""
    tm = config.timing_model
    if tm.type == "interpolated":
        return shared_profile_timing(
            tm.profile_path, config.speedup_ratio, config.decode_speedup_ratio
        )
    if tm.type == "fixed":
        return FixedTiming(
            tm.prefill_ms, tm.decode_ms, config.speedup_ratio, config.decode_speedup_ratio
        )
    if tm.type == "aic":
        assert tm.aic is not None
        return shared_aic_timing(tm.aic, config.speedup_ratio, config.decode_speedup_ratio)
    return PolynomialTiming(
        config.total_kv_tokens, config.speedup_ratio, config.decode_speedup_ratio
    )


def shared_profile_timing(path: str, speedup: float, decode_speedup: float) -> InterpolatedTiming:
    """The :class:`InterpolatedTiming` of a profile file, read once per version of the file.

    Every worker builds its own timing model, and reading a profile takes
    milliseconds and holds its arrays: 10,000 workers would read it 10,000
    times. The model is immutable (its arrays are made read-only), so every
    worker asking for the same file and speed-ups gets the same one. The
    file's modification time and size are part of the key: a profile
    rewritten between runs is read again. (Building the model once per pool
    and handing it to the workers would need no cache; workers build their
    own today.)

    Raises:
        ConfigError: the file cannot be read or is not a valid profile.
    """
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"timing profile {path}: cannot load ({exc})") from None
    return _profile_timing(
        path, os.path.abspath(path), stat.st_mtime_ns, stat.st_size, speedup, decode_speedup
    )


@functools.lru_cache(maxsize=16)
def _profile_timing(
    path: str, _where: str, _mtime_ns: int, _size: int, speedup: float, decode_speedup: float
) -> InterpolatedTiming:
    """Cached by every argument (failures are not cached: they raise)."""
    timing = InterpolatedTiming(path, speedup, decode_speedup)
    for array in (timing._pre_x, timing._pre_t, timing._kv, timing._ctx, timing._itl):
        array.flags.writeable = False
    return timing


@functools.lru_cache(maxsize=32)
def shared_aic_timing(spec: AicSpec, speedup: float, decode_speedup: float) -> AicTiming:
    """The :class:`AicTiming` of an AIC engine, compiled once and shared by every worker
    asking for it (its memo then serves the whole cluster).

    Raises:
        ConfigError: the package is missing or AIC cannot build the engine.
    """
    from servesim.aic import compile_engine  # (loads with the first AIC engine)

    timing = AicTiming(compile_engine(spec), speedup, decode_speedup)
    # Price one small prefill and decode now: a database without the kernel tables this
    # engine needs then fails before the run starts, not in the middle of it.
    timing.prefill_ms(1, 128, 0)
    timing.decode_ms(1, 128, 128)
    return timing
