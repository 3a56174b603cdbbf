"""The planner in the loop: it resizes the pools at ticks of virtual time.

A run with ``--planner-config`` ticks every ``load_adjustment_interval_seconds``
(5 s) of virtual time, once that instant has settled and telemetry sampled it
(:mod:`servesim.cluster.runtime`). Each tick takes one step, as the
reference's planner (Dynamo 1.6.1) takes it:

1. **Inventory.** Per pool: *ready* workers (active), *current* ones (active
   plus starting: what a target counts) and the *expected* count (the last
   target until the pool reaches it). While expected and ready differ (a
   started worker is not ready yet) the planner only observes.
2. **Forward-pass metrics.** The latest FPM of each active (worker, rank)
   (:class:`~servesim.engine.scheduler.ForwardPass`, published at its pass
   end); a (worker, rank) silent for a second or more publishes zeros, its
   last-publish time moving on by whole seconds. The planner decides only
   when the FPMs cover every ready worker and all its ranks.
3. **Decision**, by ``optimization_target``:

   - ``throughput`` / ``latency`` / ``load`` (the reference's easy targets):
     a prefill engine's load is ``queued prompt tokens / max_model_len``
     (``load``: the queued tokens against ``prefill_scale_up_queue_tokens``
     and ``prefill_scale_down_queue_tokens``); a decode engine's is its KV
     utilisation ``(scheduled + queued decode KV tokens) / KV capacity``,
     an aggregated one's adds its queued prompt tokens. One more worker if
     ANY engine is over the up threshold; one fewer if ALL are under the
     down threshold and the survivors would not be over the up threshold
     (``max load x N / (N - 1)``). Thresholds: throughput prefill >= 1.0 up,
     < 0.1 down, decode > 1.0 up, < 0.6 down; latency prefill >= 0.1 up,
     <= 0 down, decode > 0.4 up, < 0.1 down; load: the configured rates.
   - ``sla`` (servesim's own, see ``docs/planner.md``): size the pools from
     predicted demand and the engines' own timing model.

4. **Floors and budget.** At least ``min_endpoint`` workers per pool; the
   GPUs (``workers x tensor parallel x DP``) within ``max_gpu_budget`` (and
   ``min_gpu_budget`` when set) without reversing the decision's direction:
   a scale-up at the ceiling is held (``gpu_budget_guard_hold``).

The targets go back to the runtime, which adds workers (starting for the
engine's ``startup_time``), cancels startups, or drains the highest ids.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from servesim.cluster.runtime import (
    Pool,
    ScaleDecision,
    ScalingSnapshot,
    Stage,
    Transition,
    WorkerState,
)
from servesim.config import Backend, EngineConfig
from servesim.engine.scheduler import ForwardPass
from servesim.engine.timing import make_timing, pass_duration
from servesim.errors import ConfigError
from servesim.metrics.telemetry import TrafficWindow

MODES = ("agg", "disagg")
TARGETS = ("throughput", "latency", "load", "sla")
PREDICTORS = ("constant", "moving_average")
IDLE_FPM_MS = 1000.0
"""A (worker, rank) that published no FPM for this long publishes zeros."""

# Easy targets' thresholds: (prefill up, prefill down, decode up, decode down).
_THRESHOLDS = {
    "throughput": (1.0, 0.1, 1.0, 0.6),
    "latency": (0.1, 0.0, 0.4, 0.1),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    """The reference's ``PlannerConfig`` keys servesim reads (others are ignored, as there).

    ``load_predictor`` and ``load_predictor_window`` drive the ``sla``
    target's demand prediction (``constant``: the last window;
    ``moving_average``: the mean of the last ``load_predictor_window``).
    """

    mode: str = "disagg"
    optimization_target: str = "throughput"
    load_adjustment_interval_seconds: int = 5
    throughput_adjustment_interval_seconds: int = 180
    max_gpu_budget: int = 8
    min_gpu_budget: int = -1
    min_endpoint: int = 1
    prefill_min_endpoint: int | None = None
    decode_min_endpoint: int | None = None
    prefill_scale_up_queue_tokens: int | None = None
    prefill_scale_down_queue_tokens: int | None = None
    decode_scale_up_kv_rate: float | None = None
    decode_scale_down_kv_rate: float | None = None
    ttft_ms: float = 500.0
    itl_ms: float = 50.0
    load_predictor: str = "moving_average"
    load_predictor_window: int = 5

    def min_endpoints(self, stage: Stage) -> int:
        """The floor of a pool's workers (a role's own key, else ``min_endpoint``)."""
        own = self.prefill_min_endpoint if stage is Stage.PREFILL else self.decode_min_endpoint
        return self.min_endpoint if own is None else own

    @property
    def tick_interval_s(self) -> int:
        """Seconds between ticks: the ``sla`` target's throughput interval, else the load one."""
        if self.optimization_target == "sla":
            return self.throughput_adjustment_interval_seconds
        return self.load_adjustment_interval_seconds

    def as_dict(self) -> dict[str, Any]:
        """Every key and its effective value (the report's ``metadata.planner_config``)."""
        return asdict(self)


def _integer(key: str, value: Any, *, low: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(f"planner config: '{key}' must be an integer, got {value!r}")
    number = int(value)
    if low is not None and number < low:
        raise ConfigError(f"planner config: '{key}' must be at least {low}, got {number}")
    return number


def _number(key: str, value: Any, *, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"planner config: '{key}' must be a finite number, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise ConfigError(f"planner config: '{key}' must be {bound}, got {value!r}")
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(
            f"planner config: '{key}' must be one of {', '.join(choices)}, got {value!r}"
        )
    return str(value)


REFERENCE_KEYS = frozenset(
    (
        "advisory",
        "aic_interpolation",
        "ais_perf_model",
        "backend",
        "control_api_port",
        "decode_engine_num_gpu",
        "decode_min_endpoint",
        "decode_scale_down_kv_rate",
        "decode_scale_up_kv_rate",
        "enable_load_scaling",
        "enable_power_awareness",
        "enable_throughput_scaling",
        "environment",
        "fpm_sample_bucket_size",
        "global_planner_namespace",
        "itl_ms",
        "kalman_min_points",
        "kalman_q_level",
        "kalman_q_trend",
        "kalman_r",
        "live_dashboard_port",
        "load_adjustment_interval_seconds",
        "load_min_observations",
        "load_predictor",
        "load_predictor_log1p",
        "load_predictor_warmup_trace",
        "load_scaling_down_sensitivity",
        "log_dir",
        "max_gpu_budget",
        "max_num_fpm_samples",
        "max_throughput_scaling_replicas",
        "metric_pulling_prometheus_ca_bundle",
        "metric_pulling_prometheus_endpoint",
        "metric_pulling_prometheus_extra_query_params",
        "metric_pulling_prometheus_request_timeout_seconds",
        "metric_pulling_prometheus_ssl_verify",
        "metric_pulling_prometheus_token",
        "metric_pulling_prometheus_token_file",
        "metric_reporting_prometheus_port",
        "min_endpoint",
        "min_gpu_budget",
        "mode",
        "model_name",
        "namespace",
        "optimization_target",
        "plugin_registration",
        "pre_deployment_sweeping_mode",
        "prefill_engine_num_gpu",
        "prefill_min_endpoint",
        "prefill_scale_down_queue_tokens",
        "prefill_scale_up_queue_tokens",
        "profile_results_dir",
        "prophet_window_size",
        "report_filename",
        "report_interval_hours",
        "report_output_dir",
        "report_write_gzip_log",
        "scheduling",
        "speculative_nextn",
        "throughput_adjustment_interval_seconds",
        "throughput_metrics_source",
        "total_gpu_power_limit",
        "ttft_ms",
    )
)
"""Every key of the reference's ``PlannerConfig`` (Dynamo 1.6.1). Those servesim does not
model (deployment settings: ports, Prometheus, log and report paths, ...) are accepted and
have no effect; a key in neither set is an error (a typo must not pass silently)."""


def parse_planner_config(text: str) -> PlannerConfig:
    """A planner config from ``--planner-config``: inline JSON, or ``@FILE`` holding JSON.

    Raises:
        ConfigError: unreadable file, bad JSON, or a bad value (named by its key).
    """
    source = "--planner-config"
    if text.startswith("@"):
        path = Path(text[1:])
        source = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read planner config {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a JSON object of planner keys")
    return planner_config(raw)


def planner_config(raw: Mapping[str, Any]) -> PlannerConfig:
    """Validate a mapping of planner keys (see :data:`REFERENCE_KEYS` for those ignored).

    Raises:
        ConfigError: an unknown key or a bad value, named by its key.
    """
    known = {f.name for f in fields(PlannerConfig)}
    for key in raw:
        if key not in known and key not in REFERENCE_KEYS:
            close = difflib.get_close_matches(key, sorted(known | REFERENCE_KEYS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"planner config: unknown key '{key}'{hint}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known or value is None:
            continue
        if key == "mode":
            values[key] = _choice(key, value, MODES)
        elif key == "optimization_target":
            values[key] = _choice(key, value, TARGETS)
        elif key == "load_predictor":
            values[key] = str(value)
        elif key in ("load_adjustment_interval_seconds", "throughput_adjustment_interval_seconds"):
            values[key] = _integer(key, value, low=1)
        elif key in ("max_gpu_budget", "min_gpu_budget"):
            values[key] = _integer(key, value, low=None)
        elif key == "min_endpoint":
            values[key] = _integer(key, value, low=0)
        elif key in ("prefill_min_endpoint", "decode_min_endpoint", "load_predictor_window"):
            values[key] = _integer(key, value, low=1)
        elif key in ("prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"):
            values[key] = _integer(key, value, low=0)
        elif key in ("decode_scale_up_kv_rate", "decode_scale_down_kv_rate"):
            values[key] = _number(key, value, low=0.0, high=100.0)
        else:  # ttft_ms, itl_ms
            values[key] = _number(key, value, low=0.0)
            if values[key] <= 0:
                raise ConfigError(f"planner config: '{key}' must be > 0, got {value!r}")
    config = PlannerConfig(**values)
    if config.mode == "agg" and (
        config.prefill_min_endpoint is not None or config.decode_min_endpoint is not None
    ):
        raise ConfigError(
            "planner config: 'prefill_min_endpoint' and 'decode_min_endpoint' are not supported "
            "with mode 'agg'; use 'min_endpoint'"
        )
    if config.optimization_target == "load":
        pairs = [("decode_scale_up_kv_rate", "decode_scale_down_kv_rate")]
        if config.mode == "disagg":
            pairs.insert(0, ("prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"))
        for up, down in pairs:
            if values.get(up) is None or values.get(down) is None:
                raise ConfigError(
                    f"planner config: optimization_target 'load' needs '{up}' and '{down}'"
                )
            if values[up] <= values[down]:
                raise ConfigError(f"planner config: '{up}' must be greater than '{down}'")
    if config.optimization_target == "sla":
        _choice("load_predictor", config.load_predictor, PREDICTORS)
    return config


def check_planner_fits(config: PlannerConfig, pools: Mapping[Stage, EngineConfig]) -> None:
    """Refuse a planner config the cluster cannot run: a mode that is not the cluster's, or a
    GPU budget below the pools' minimum footprint.

    Raises:
        ConfigError: naming the key.
    """
    disaggregated = Stage.PREFILL in pools
    if config.mode == "disagg" and not disaggregated:
        raise ConfigError(
            "planner config: 'mode' is 'disagg' but the run is aggregated "
            "(give prefill and decode engine args, or use mode 'agg')"
        )
    if config.mode == "agg" and disaggregated:
        raise ConfigError(
            "planner config: 'mode' is 'agg' but the run is disaggregated (use mode 'disagg')"
        )
    footprint = sum(config.min_endpoints(s) * e.gpus_per_worker for s, e in pools.items())
    if 0 <= config.max_gpu_budget < footprint:
        raise ConfigError(
            f"planner config: 'max_gpu_budget' {config.max_gpu_budget} is below the minimum "
            f"footprint of {footprint} GPUs (min endpoints x GPUs per worker)"
        )
    if 0 <= config.max_gpu_budget < config.min_gpu_budget:
        raise ConfigError(
            f"planner config: 'min_gpu_budget' {config.min_gpu_budget} exceeds "
            f"'max_gpu_budget' {config.max_gpu_budget}"
        )
    for engine in pools.values():
        if engine.backend is Backend.SGLANG:
            raise ConfigError(
                "planner config: the planner reads forward-pass metrics, which servesim "
                "measures on vLLM and TRT-LLM engines only (the engine is SGLang)"
            )


# ----- GPU budget (the reference's direction-preserving band) -----


def _in_band(total: int, low: int, high: int, tolerance: int) -> bool:
    """Whether ``total`` GPUs lie in ``[low - tolerance, high]`` (a negative bound is off)."""
    return not (high >= 0 and total > high) and not (low >= 0 and total < low - tolerance)


def clamp_single(desired: int, gpus: int, low: int, high: int, floor: int) -> int:
    """One pool's workers brought into the GPU band (0: even ``floor`` overshoots the ceiling)."""
    if (low < 0 and high < 0) or gpus <= 0:
        return desired
    tolerance = gpus if low >= 0 and high >= 0 else 0
    if _in_band(desired * gpus, low, high, tolerance):
        return desired
    if high >= 0 and desired * gpus > high:
        return 0 if high < floor * gpus else max(floor, high // gpus)
    return max(floor, -(-low // gpus))


def guard_single(
    current: int, proposed: int, gpus: int, low: int, high: int, floor: int
) -> tuple[int, str | None]:
    """A one-pool proposal within the GPU band, never reversed: held at a full (or floor)
    allocation it would cross."""
    if gpus <= 0:
        return proposed, None
    tolerance = gpus if low >= 0 and high >= 0 else 0
    if not _in_band(current * gpus, low, high, tolerance):
        return clamp_single(current, gpus, low, high, floor), "gpu_budget_reconcile"
    if low >= 0 and current * gpus <= low and proposed < current:
        return current, "gpu_budget_guard_hold"
    if high >= 0 and current * gpus >= high and proposed > current:
        return current, "gpu_budget_guard_hold"
    final = clamp_single(proposed, gpus, low, high, floor)
    if not min(current, proposed) <= final <= max(current, proposed):
        return current, "gpu_budget_guard_hold"
    return final, None


def clamp_pair(
    p: int, d: int, p_gpus: int, d_gpus: int, low: int, high: int, floors: tuple[int, int]
) -> tuple[int, int]:
    """Prefill and decode workers brought into the GPU band, shrinking or growing them in
    proportion ((0, 0): even the floors overshoot the ceiling)."""
    if (low < 0 and high < 0) or p_gpus <= 0 or d_gpus <= 0:
        return p, d
    p_floor, d_floor = floors
    total = p * p_gpus + d * d_gpus
    tolerance = max(p_gpus, d_gpus) if low >= 0 and high >= 0 else 0
    if _in_band(total, low, high, tolerance):
        return p, d
    if high >= 0 and total > high:
        if high < p_floor * p_gpus + d_floor * d_gpus:
            return 0, 0
        most_p = (high - d_floor * d_gpus) // p_gpus
        new_p = max(p_floor, min(most_p, math.floor(p * high / total)))
        return new_p, max(d_floor, (high - new_p * p_gpus) // d_gpus)
    if total <= 0:
        new_p = max(p_floor, math.ceil(low / 2 / p_gpus))
    else:
        new_p = max(p_floor, math.ceil(p * low / total))
    new_d = max(d_floor, math.ceil(max(0, low - new_p * p_gpus) / d_gpus))
    shrinks = new_d < d
    new_d = max(d, new_d)
    if high >= 0 and new_p * p_gpus + new_d * d_gpus > high:
        if not shrinks:
            return p, d
        return fit_pair((p, d), (new_p, d), (p_gpus, d_gpus), low, high, floors)
    return new_p, new_d


def fit_pair(
    current: tuple[int, int],
    proposed: tuple[int, int],
    gpus: tuple[int, int],
    low: int,
    high: int,
    floors: tuple[int, int],
) -> tuple[int, int]:
    """The pair nearest ``proposed`` in the GPU band with each pool between its current and
    proposed count; an opposing move (one up, one down) moves both or neither."""
    (cp, cd), (pp, pd), (gp, gd) = current, proposed, gpus
    if gp <= 0 or gd <= 0:
        return proposed
    tolerance = max(gp, gd) if low >= 0 and high >= 0 else 0
    opposing = (pp < cp and pd > cd) or (pp > cp and pd < cd)
    p_low, p_high = max(min(cp, pp), floors[0]), max(cp, pp)
    d_low, d_high = max(min(cd, pd), floors[1]), max(cd, pd)
    if high >= 0:
        p_high = min(p_high, (high - d_low * gd) // gp)
        d_high = min(d_high, (high - p_low * gp) // gd)
    if low >= 0:
        p_low = max(p_low, -(-(low - tolerance - d_high * gd) // gp))
        d_low = max(d_low, -(-(low - tolerance - p_high * gp) // gd))
    if p_low > p_high or d_low > d_high:
        return current
    if pp >= floors[0] and pd >= floors[1] and _in_band(pp * gp + pd * gd, low, high, tolerance):
        return proposed
    ask_p, ask_d = abs(pp - cp), abs(pd - cd)
    candidates: list[tuple[int, int]] = []
    # Enumerate the shorter range; for each value the band leaves one interval of the other
    # pool, whose point nearest the proposal is the only candidate worth scoring.
    by_p = p_high - p_low <= d_high - d_low
    own_range = range(p_low, p_high + 1) if by_p else range(d_low, d_high + 1)
    own_gpu, other_gpu = (gp, gd) if by_p else (gd, gp)
    own_now, other_now, other_ask = (cp, cd, pd) if by_p else (cd, cp, pp)
    for own in own_range:
        lo, hi = (d_low, d_high) if by_p else (p_low, p_high)
        if low >= 0:
            lo = max(lo, -(-(low - tolerance - own * own_gpu) // other_gpu))
        if high >= 0:
            hi = min(hi, (high - own * own_gpu) // other_gpu)
        if opposing:
            if own == own_now:
                if lo <= other_now <= hi:
                    candidates.append((own, other_now))
                continue
            lo, hi = (
                (max(lo, other_now + 1), hi)
                if other_ask > other_now
                else (lo, min(hi, other_now - 1))
            )
        if lo <= hi:
            candidates.append((own, min(max(other_ask, lo), hi)))
    best: tuple[tuple[int, int, int, int, int], tuple[int, int]] | None = None
    for own, other in candidates:
        cand_p, cand_d = (own, other) if by_p else (other, own)
        if not _in_band(cand_p * gp + cand_d * gd, low, high, tolerance):
            continue
        moved_p, moved_d = abs(cand_p - cp), abs(cand_d - cd)
        score = (
            abs(pp - cand_p) + abs(pd - cand_d),
            abs(moved_p * ask_d - moved_d * ask_p),
            -(moved_p + moved_d),
            cand_p,
            cand_d,
        )
        if best is None or score < best[0]:
            best = (score, (cand_p, cand_d))
    return current if best is None else best[1]


def guard_pair(
    current: tuple[int, int],
    proposed: tuple[int, int],
    gpus: tuple[int, int],
    low: int,
    high: int,
    floors: tuple[int, int],
) -> tuple[tuple[int, int], str | None]:
    """A prefill-and-decode proposal within the GPU band without reversing either pool's
    direction; at a full allocation only an opposing rebalance may move."""
    (cp, cd), (pp, pd), (gp, gd) = current, proposed, gpus
    if gp <= 0 or gd <= 0:
        return clamp_pair(pp, pd, gp, gd, low, high, floors), None
    tolerance = max(gp, gd) if high >= 0 else 0
    total = cp * gp + cd * gd
    if not _in_band(total, low, high, tolerance):
        return clamp_pair(cp, cd, gp, gd, low, high, floors), "gpu_budget_reconcile"
    any_down, any_up = pp < cp or pd < cd, pp > cp or pd > cd
    opposing = (pp < cp and pd > cd) or (pp > cp and pd < cd)
    if low >= 0 and total <= low and any_down and not any_up:
        return current, "gpu_budget_guard_hold"
    if (low >= 0 and total <= low and opposing) or (high >= 0 and total >= high and any_up):
        if not opposing:
            return current, "gpu_budget_guard_hold"
        fitted = fit_pair(current, proposed, gpus, low, high, floors)
        return (current, "gpu_budget_guard_hold") if fitted == current else (fitted, None)
    new = clamp_pair(pp, pd, gp, gd, low, high, floors)
    within = all(
        min(c, p) <= n <= max(c, p) for c, p, n in zip(current, proposed, new, strict=True)
    )
    if not within or not _in_band(new[0] * gp + new[1] * gd, low, high, tolerance):
        return current, "gpu_budget_guard_hold"
    return new, None


# ----- forward-pass metrics, as the planner sees them -----


class FpmBuffer:
    """The latest FPM of each active (worker, rank) of one pool, with the idle rule."""

    def __init__(self) -> None:
        self.latest: dict[tuple[int, int], ForwardPass] = {}
        self._published: dict[tuple[int, int], float] = {}
        self._seen: dict[int, int] = {}  # worker id -> FPMs read

    def observe(self, pool: Pool, now: float) -> None:
        """Read the pool's new FPMs, fill in idle seconds, drop inactive workers'."""
        active = pool.ids(WorkerState.ACTIVE)
        alive = set(active)
        for key in [k for k in self.latest if k[0] not in alive]:
            del self.latest[key]
        for key in [k for k in self._published if k[0] not in alive]:
            del self._published[key]
        for worker_id in active:
            worker = pool.workers[worker_id]
            assert worker.fpms is not None, "a planner turned on the workers' FPMs"
            fresh = worker.fpm_count != self._seen.get(worker_id, 0)
            self._seen[worker_id] = worker.fpm_count
            for rank, fpm in enumerate(worker.fpms):
                key = (worker_id, rank)
                if fresh:
                    self.latest[key] = fpm
                    self._published[key] = worker.fpm_ms
                last = self._published.setdefault(key, pool.since[worker_id])
                idle = now - last
                if idle >= IDLE_FPM_MS:
                    self._published[key] = last + math.floor(idle / IDLE_FPM_MS) * IDLE_FPM_MS
                    self.latest[key] = ForwardPass()


def _covers(fpms: Mapping[tuple[int, int], ForwardPass], workers: int) -> bool:
    """Whether the FPMs come from exactly ``workers`` workers, each with all its ranks."""
    ranks: dict[int, int] = {}
    for worker_id, _ in fpms:
        ranks[worker_id] = ranks.get(worker_id, 0) + 1
    return len(ranks) == workers and len(set(ranks.values())) <= 1


# ----- the planner -----


@dataclass(slots=True)
class _PoolState:
    """What the planner tracks of one pool between ticks."""

    engine: EngineConfig
    fpms: FpmBuffer = field(default_factory=FpmBuffer)
    target: int | None = None  # the last target, until the pool reaches it


@dataclass(slots=True)
class _Predictor:
    """Demand prediction for the ``sla`` target: the last window, or a moving average."""

    window: int
    rates: deque[float] = field(default_factory=deque)
    isls: deque[float] = field(default_factory=deque)
    osls: deque[float] = field(default_factory=deque)

    def observe(self, rate: float, isl: float | None, osl: float | None) -> None:
        for values, value in ((self.rates, rate), (self.isls, isl), (self.osls, osl)):
            if value is not None:
                values.append(value)
                while len(values) > self.window:
                    values.popleft()

    def predict(self) -> tuple[float, float, float] | None:
        """(requests/s, prompt tokens, output tokens), None before any completion."""
        if not self.isls or not self.osls:
            return None
        from statistics import fmean  # (5 ms of start-up at module level; planners only)

        return fmean(self.rates), fmean(self.isls), fmean(self.osls)


class Planner:
    """The reference's planner step at each tick (a :class:`ScalingPolicy`)."""

    def __init__(
        self,
        config: PlannerConfig,
        engines: Mapping[Stage, EngineConfig],
        traffic: TrafficWindow,
        *,
        details: bool = False,
    ) -> None:
        self.config = config
        self._pools = {stage: _PoolState(engine) for stage, engine in engines.items()}
        self._traffic = traffic
        self._details = details
        self._last_tick_ms = 0.0
        window = config.load_predictor_window if config.load_predictor == "moving_average" else 1
        self._predictor = _Predictor(window)
        self.scaling_events: list[dict[str, Any]] = []
        # The sla target's estimate at the latest tick (its demand and engine figures).
        self._estimate: dict[str, float] = {}
        self.ticks: list[dict[str, Any]] = []
        self.total_ticks = 0

    def initial_tick_ms(self) -> float:
        """See :class:`~servesim.cluster.runtime.ScalingPolicy`."""
        return self.config.tick_interval_s * 1000.0

    def on_tick(self, snapshot: ScalingSnapshot) -> ScaleDecision:
        """See :class:`~servesim.cluster.runtime.ScalingPolicy`."""
        now = snapshot.now_ms
        counts: dict[Stage, tuple[int, int, int]] = {}  # ready, current, expected
        for stage, state in self._pools.items():
            pool = snapshot.pools[stage]
            ready = len(pool.ids(WorkerState.ACTIVE))
            current = ready + len(pool.ids(WorkerState.STARTING))
            if state.target == current:
                state.target = None
            counts[stage] = (ready, current, current if state.target is None else state.target)
            state.fpms.observe(pool, now)
        traffic = self._traffic.drain(now - self._last_tick_ms, 0, 0)
        self._last_tick_ms = now
        if self.config.optimization_target == "sla":
            self._estimate = {}
            proposal, reason = self._sla(counts, traffic)
        else:
            proposal, reason = self._load(counts)
        targets: dict[Stage, int] = {}
        for stage, target in proposal.items():
            current = counts[stage][1]
            if target == current:
                continue
            targets[stage] = target
            self._pools[stage].target = target
            self.scaling_events.append(
                {
                    "at_s": now / 1000.0,
                    "component": "agg" if stage is Stage.AGGREGATED else stage.name.lower(),
                    "from_count": current,
                    "to_count": target,
                    "reason": "scale_up" if target > current else "scale_down",
                }
            )
        next_tick = (self.total_ticks + 2) * self.config.tick_interval_s * 1000.0
        if self._details:
            self.ticks.append(self._tick_record(snapshot, counts, traffic, targets, reason))
        self.total_ticks += 1
        return ScaleDecision(targets=targets, next_tick_ms=next_tick)

    # ----- the easy targets: one step from the FPMs -----

    def _load(self, counts: Mapping[Stage, tuple[int, int, int]]) -> tuple[dict[Stage, int], str]:
        """The load decision of the throughput, latency and load targets."""
        if any(ready != expected for ready, _, expected in counts.values()):
            return {}, "scaling_in_progress"
        fpms = {stage: state.fpms.latest for stage, state in self._pools.items()}
        if not any(fpms.values()):
            return {}, "no_fpm_data"
        for stage, latest in fpms.items():
            if latest and not _covers(latest, counts[stage][0]):
                return {}, "worker_count_mismatch"
        config = self.config
        if Stage.AGGREGATED in counts:
            ready = counts[Stage.AGGREGATED][0]
            engine = self._pools[Stage.AGGREGATED].engine
            desired = self._easy(Stage.AGGREGATED, fpms[Stage.AGGREGATED], ready, engine)
            if desired is None:
                return {}, "no_change"
            desired = max(desired, config.min_endpoint)
            final, held = guard_single(
                ready,
                desired,
                engine.gpus_per_worker,
                config.min_gpu_budget,
                config.max_gpu_budget,
                config.min_endpoint,
            )
            return {Stage.AGGREGATED: final}, held or _direction(final, ready)
        ready_p, ready_d = counts[Stage.PREFILL][0], counts[Stage.DECODE][0]
        p_engine, d_engine = self._pools[Stage.PREFILL].engine, self._pools[Stage.DECODE].engine
        want_p = self._easy(Stage.PREFILL, fpms[Stage.PREFILL], ready_p, p_engine)
        want_d = self._easy(Stage.DECODE, fpms[Stage.DECODE], ready_d, d_engine)
        floors = (config.min_endpoints(Stage.PREFILL), config.min_endpoints(Stage.DECODE))
        p = max(ready_p if want_p is None else want_p, floors[0])
        d = max(ready_d if want_d is None else want_d, floors[1])
        gpus = (p_engine.gpus_per_worker, d_engine.gpus_per_worker)
        low, high = config.min_gpu_budget, config.max_gpu_budget
        if ready_p < floors[0] or ready_d < floors[1]:
            (p, d), held = clamp_pair(p, d, *gpus, low, high, floors), "gpu_budget_reconcile"
        else:
            (p, d), held = guard_pair((ready_p, ready_d), (p, d), gpus, low, high, floors)
        if (p, d) == (ready_p, ready_d):
            return {}, held or "no_change"
        reasons = (_direction(p, ready_p), _direction(d, ready_d))
        reason = "scale_up" if "scale_up" in reasons else "scale_down"
        return {Stage.PREFILL: p, Stage.DECODE: d}, held or reason

    def _easy(
        self,
        stage: Stage,
        fpms: Mapping[tuple[int, int], ForwardPass],
        workers: int,
        engine: EngineConfig,
    ) -> int | None:
        """One pool's easy-target step: workers + 1, workers - 1, or None (no change)."""
        if not fpms or workers == 0:
            return None
        config = self.config
        load = config.optimization_target == "load"
        if stage is Stage.PREFILL:
            if load:
                up = float(config.prefill_scale_up_queue_tokens or 0)
                down = float(config.prefill_scale_down_queue_tokens or 0)
                values = [float(f.queued_prefill_tokens) for f in fpms.values()]
            else:
                if not engine.max_model_len:
                    return None  # no context length: the reference never scales prefill
                up, down = _THRESHOLDS[config.optimization_target][:2]
                values = [f.queued_prefill_tokens / engine.max_model_len for f in fpms.values()]
            over = any(v >= up for v in values)
            # load and latency: at or under the down threshold; throughput: under it.
            if load or config.optimization_target == "latency":
                under = all(v <= down for v in values)
            else:
                under = all(v < down for v in values)
        else:
            capacity = engine.total_kv_tokens * engine.dp_size
            if capacity <= 0:
                return None
            if load:
                up = float(config.decode_scale_up_kv_rate or 0.0) / 100.0
                down = float(config.decode_scale_down_kv_rate or 0.0) / 100.0
            else:
                up, down = _THRESHOLDS[config.optimization_target][2:]
            queued = stage is Stage.AGGREGATED
            values = [
                (
                    f.decode_kv_tokens
                    + f.queued_decode_kv_tokens
                    + (f.queued_prefill_tokens if queued else 0)
                )
                / capacity
                for f in fpms.values()
            ]
            over = any(v >= up for v in values) if load else any(v > up for v in values)
            under = all(v <= down for v in values) if load else all(v < down for v in values)
        if over:
            return workers + 1
        if workers > 1 and under:
            desired = max(workers - 1, config.min_endpoints(stage))
            if 0 < desired < workers and max(values) * workers / desired >= up:
                return workers  # the survivors would be over the up threshold at once
            return desired
        return None

    # ----- servesim's sla target: size the pools from predicted demand -----

    def _sla(
        self, counts: Mapping[Stage, tuple[int, int, int]], traffic: Mapping[str, Any]
    ) -> tuple[dict[Stage, int], str]:
        duration = traffic["duration_s"]
        completed = traffic["completed_requests"]
        self._predictor.observe(
            traffic["arriving_requests"] / duration if duration > 0 else 0.0,
            traffic["avg_isl"] if completed else None,
            traffic["avg_osl"] if completed else None,
        )
        if any(ready != expected for ready, _, expected in counts.values()):
            return {}, "scaling_in_progress"
        predicted = self._predictor.predict()
        if predicted is None:
            return {}, "insufficient_data"
        rate, isl, osl = predicted
        config = self.config
        low, high = config.min_gpu_budget, config.max_gpu_budget
        self._estimate = {"requests_per_s": rate, "isl": isl, "osl": osl}
        if Stage.AGGREGATED in counts:
            engine = self._pools[Stage.AGGREGATED].engine
            capacity = sla_capacity(engine, isl, osl, config.ttft_ms, config.itl_ms)
            self._estimate.update(capacity.as_dict())
            want = max(math.ceil(rate / capacity.aggregated_rps), config.min_endpoint)
            final = clamp_single(want, engine.gpus_per_worker, low, high, config.min_endpoint)
            return {Stage.AGGREGATED: final}, "sla"
        p_engine, d_engine = self._pools[Stage.PREFILL].engine, self._pools[Stage.DECODE].engine
        floors = (config.min_endpoints(Stage.PREFILL), config.min_endpoints(Stage.DECODE))
        prefill = sla_capacity(p_engine, isl, osl, config.ttft_ms, config.itl_ms)
        decode = sla_capacity(d_engine, isl, osl, config.ttft_ms, config.itl_ms)
        self._estimate.update(prefill_rps=prefill.prefill_rps, decode_rps=decode.decode_rps)
        p = max(math.ceil(rate / prefill.prefill_rps), floors[0])
        d = max(math.ceil(rate / decode.decode_rps), floors[1])
        p, d = clamp_pair(
            p, d, p_engine.gpus_per_worker, d_engine.gpus_per_worker, low, high, floors
        )
        return {Stage.PREFILL: p, Stage.DECODE: d}, "sla"

    # ----- the report -----

    def section(self, transitions: Sequence[Transition]) -> dict[str, Any]:
        """The report's ``planner`` section (``transitions``: the run's lifecycle changes, listed
        as operations with the details)."""
        config = self.config.as_dict()
        digest = hashlib.sha256(
            json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        out: dict[str, Any] = {
            "metadata": {
                "planner_config": config,
                "planner_config_digest": digest,
                "mode": self.config.mode,
                "optimization_target": self.config.optimization_target,
                "bootstrap": {"status": "not_required"},
                "details_captured": self._details,
            },
            "scaling_events": self.scaling_events,
            "total_ticks": self.total_ticks,
            "lifecycle_operations": lifecycle_operations(transitions) if self._details else [],
        }
        if self._details:
            out["ticks"] = self.ticks
        return out

    def _tick_record(
        self,
        snapshot: ScalingSnapshot,
        counts: Mapping[Stage, tuple[int, int, int]],
        traffic: Mapping[str, Any],
        targets: Mapping[Stage, int],
        reason: str,
    ) -> dict[str, Any]:
        def name(stage: Stage) -> str:
            return "agg" if stage is Stage.AGGREGATED else stage.name.lower()

        return {
            "ordinal": snapshot.ordinal,
            "at_ms": snapshot.now_ms,
            "input": {
                "worker_counts": {
                    name(stage): {"ready": ready, "current": current, "expected": expected}
                    for stage, (ready, current, expected) in counts.items()
                },
                "fpm_observations": {
                    name(stage): [
                        {"worker_id": w, "dp_rank": r, "metrics": asdict(fpm)}
                        for (w, r), fpm in sorted(state.fpms.latest.items())
                    ]
                    for stage, state in self._pools.items()
                },
                "traffic": dict(traffic),
            },
            "topology": {
                name(stage): {
                    "active": pool.ids(WorkerState.ACTIVE),
                    "starting": pool.ids(WorkerState.STARTING),
                    "draining": pool.ids(WorkerState.DRAINING),
                }
                for stage, pool in snapshot.pools.items()
            },
            "decision": {
                "reason": reason,
                "estimate": dict(self._estimate),
                "targets": {name(stage): target for stage, target in sorted(targets.items())},
            },
        }


_TRANSITIONS = {
    WorkerState.STARTING: "worker_starting",
    WorkerState.ACTIVE: "worker_ready",
    WorkerState.DRAINING: "worker_draining",
    WorkerState.REMOVED: "worker_removed",
}


def lifecycle_operations(transitions: Sequence[Transition]) -> list[dict[str, Any]]:
    """Lifecycle changes as the reference lists them: one operation per instant, pool and cause
    (a tick's scaling, a startup finishing, a drain settling), in time order."""
    out: list[dict[str, Any]] = []
    for t in transitions:
        pool = "agg" if t.stage is Stage.AGGREGATED else t.stage.name.lower()
        last = out[-1] if out else None
        if last is None or (last["at_ms"], last["pool"], last["cause"]) != (t.at_ms, pool, t.cause):
            last = {
                "operation_ordinal": len(out),
                "at_ms": t.at_ms,
                "pool": pool,
                "cause": t.cause,
                "transitions": [],
            }
            out.append(last)
        last["transitions"].append(
            {
                "worker_id": t.worker_id,
                "prior_state": None if t.prior is None else t.prior.value,
                "state": t.state.value,
                "transition": _TRANSITIONS[t.state],
            }
        )
    return out


def _direction(target: int, current: int) -> str:
    if target > current:
        return "scale_up"
    return "scale_down" if target < current else "no_change"


def sla_prefill_ms(engine: EngineConfig, isl: float) -> float:
    """One prompt of ``isl`` tokens prefilled alone, chunk by chunk, on the engine's timing."""
    timing = make_timing(engine)
    tokens = max(1, round(isl))
    chunk = engine.max_num_batched_tokens or tokens
    total, done = 0.0, 0
    while done < tokens:
        end = min(done + chunk, tokens)
        total += pass_duration(timing.prefill_ms(1, end, done), timing.prefill_divisor)
        done = end
    return total


def sla_decode_batch(
    engine: EngineConfig, isl: float, osl: float, itl_ms: float
) -> tuple[int, float]:
    """The largest decode batch whose step fits ``itl_ms`` at the mean context (prompt plus
    half the output), within the KV capacity and ``max_num_seqs``; and its step time.

    A batch of one that does not fit is kept (the ITL target is then out of reach).
    """
    timing = make_timing(engine)
    context = max(1, round(isl + osl / 2.0))
    most = max(1, engine.total_kv_tokens // context)
    if engine.max_num_seqs:
        most = min(most, engine.max_num_seqs)

    def step(batch: int) -> float:
        return pass_duration(
            timing.decode_ms(batch, batch * context, context), timing.decode_divisor
        )

    lo, hi = 1, most
    while lo < hi:  # the largest batch whose step fits (step times grow with the batch)
        mid = (lo + hi + 1) // 2
        if step(mid) <= itl_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo, step(lo)


UNREACHABLE_LOAD = 0.5
"""The prefill utilisation the sla target keeps when no load meets the TTFT target."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaCapacity:
    """Requests per second one worker serves within the targets (see :func:`sla_capacity`)."""

    prefill_ms: float
    chunks: int
    decode_batch: int
    decode_step_ms: float
    prefill_rps: float
    decode_rps: float
    aggregated_rps: float

    def as_dict(self) -> dict[str, float]:
        """The figures, for a tick's record."""
        return {k: float(v) for k, v in asdict(self).items()}


def sla_capacity(
    engine: EngineConfig, isl: float, osl: float, ttft_ms: float, itl_ms: float
) -> SlaCapacity:
    """How many requests of ``isl`` prompt and ``osl`` output tokens per second one worker of
    ``engine`` serves within the TTFT and ITL targets, by the engine's own timing model.

    - Prefill: a prompt takes ``P`` (its chunks of ``max_num_batched_tokens``, alone). As a
      queue with deterministic service (M/D/1) at utilisation ``rho = rate x P``, TTFT is
      ``P + rho P / (2 (1 - rho))``; the largest ``rho`` within ``ttft_ms`` gives
      ``prefill_rps = rho / P`` (``rho`` = 0.5 when even an idle engine misses the target).
    - Decode: the largest batch ``b`` whose step ``s`` fits ``itl_ms``
      (:func:`sla_decode_batch`); by Little's law ``decode_rps = b / (osl x s)``.
    - Aggregated: the smaller of ``prefill_rps``, ``b / (osl x itl)`` (the requests decoding
      at once stay within ``b``), and the rate at which prefill passes, interleaved with
      decode steps, keep the mean step within ``itl_ms``: a worker at rate ``r`` makes
      ``r x k + (1 - r x P) / s`` steps a second (``k`` chunks a prompt), at least
      ``1 / itl``.
    """
    prefill_s = sla_prefill_ms(engine, isl) / 1000.0
    tokens = max(1, round(isl))
    chunks = -(-tokens // (engine.max_num_batched_tokens or tokens))
    batch, step_ms = sla_decode_batch(engine, isl, osl, itl_ms)
    step_s, itl_s, ttft_s = step_ms / 1000.0, itl_ms / 1000.0, ttft_ms / 1000.0
    slack = (ttft_s - prefill_s) / prefill_s if prefill_s > 0 else math.inf
    rho = 2.0 * slack / (1.0 + 2.0 * slack) if slack > 0 else UNREACHABLE_LOAD
    prefill_rps = rho / prefill_s if prefill_s > 0 else math.inf
    decode_rps = batch / (max(osl, 1.0) * step_s) if step_s > 0 else math.inf
    aggregated = min(prefill_rps, batch / (max(osl, 1.0) * max(itl_s, step_s)))
    if step_s > 0 and prefill_s / step_s > chunks:
        # r k + (1 - r P) / s >= 1 / itl  <=>  r <= (1/s - 1/itl) / (P/s - k)
        interleaved = (1.0 / step_s - 1.0 / max(itl_s, step_s)) / (prefill_s / step_s - chunks)
        aggregated = (
            min(aggregated, interleaved)
            if interleaved > 0
            else min(aggregated, UNREACHABLE_LOAD / prefill_s)
        )
    return SlaCapacity(
        prefill_ms=prefill_s * 1000.0,
        chunks=chunks,
        decode_batch=batch,
        decode_step_ms=step_ms,
        prefill_rps=prefill_rps,
        decode_rps=decode_rps,
        aggregated_rps=aggregated,
    )
