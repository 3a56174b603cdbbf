"""Scenarios, stored reference outputs and comparison rules for the end-to-end tests.

A scenario is a copy of one of the team's reference scenarios (the format of
``shared/reference/README.md``), kept in ``tests/scenarios/reference/`` as
``<name>.scenario.json``. The copies name their trace and timing profile by a
path relative to ``tests/`` (files under ``tests/data/``), so a clone of the
repository runs them alone. Beside each scenario is what the reference
(NVIDIA Dynamo 1.6.1's offline replay) produced for it, written by
``regenerate.py``:

- deterministic scenarios (round robin): ``<name>.summary.json``, the
  reference's whole summary, and ``<name>.requests.json``, its per-request
  records reduced to :data:`RECORD_FIELDS`, in arrival order;
- KV-router scenarios (the reference breaks cost ties at random, unseeded):
  ``<name>.spread.json``, the minimum and maximum of every summary key over
  many reference runs;
- scenarios with ``telemetry_options`` (round robin): also
  ``<name>.telemetry.json``, the reference's whole ``telemetry`` section;
- scenarios with ``planner_config`` (round robin): also
  ``<name>.planner.json``, the reference's ``planner`` section (with
  ``capture_planner_details``, its lifecycle operations and every tick's
  input too); :func:`planner_view` reduces either simulator's to what both
  write.

The functions here build servesim's command line for a scenario the way
``refcheck.py`` does, reduce per-request records of either simulator to the
compared fields, and compare summaries and records, returning one sentence per
disagreement that names the scenario, the key, both values and the relative
difference. Standard library only: ``regenerate.py`` uses it too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference"

# Summary keys that measure the host (the simulator's own speed), not the
# simulated cluster: never compared.
HOST_SPEED_KEYS = frozenset(
    {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
)

# Keys (dotted paths into nested summary objects) where servesim knowingly differs
# from the reference, each explained in docs/reference-differences.md: never compared.
KNOWN_DIFFERENCES = frozenset(
    {
        # Digests of the reference's own serialisation of the agentic graph and of its
        # lifecycle events, which is not public: servesim digests its own.
        "agentic_graph.graph_digest",
        "agentic_lifecycle_digest",
    }
)

# Deterministic scenarios: floats agree to this relative error, or to the
# absolute error below for values near zero; integers and non-numbers exactly.
REL_TOL = 1e-6
ABS_TOL = 1e-9
# KV-router scenarios: a value may lie this far (relative) outside the range
# of the reference's runs; nothing more.
SPREAD_SLACK = 1e-9

# The per-request fields kept from both simulators' records (same names in
# both). The first three identify a request; the rest are compared.
IDENTITY_FIELDS = ("arrival_time_ms", "input_length", "output_length")
RECORD_FIELDS = (
    *IDENTITY_FIELDS,
    "first_token_ms",
    "last_token_ms",
    "reused_input_tokens",
    "decode_reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "terminal_status",
)
# Digits kept of stored floats: rounding then costs 1e-12 relative at most.
STORED_DIGITS = 12

Json = dict[str, Any]
Row = list[Any]


@dataclass(frozen=True)
class Scenario:
    """One scenario: its name, its JSON dict and where its stored outputs are."""

    name: str
    spec: Json

    @property
    def kv_router(self) -> bool:
        """Whether the reference routes with its (randomly tie-breaking) KV router."""
        return bool(self.spec.get("router_mode") == "kv_router")

    @property
    def summary_path(self) -> Path:
        """The reference's summary (deterministic scenarios)."""
        return REFERENCE / f"{self.name}.summary.json"

    @property
    def requests_path(self) -> Path:
        """The reference's reduced per-request records (deterministic scenarios)."""
        return REFERENCE / f"{self.name}.requests.json"

    @property
    def telemetry(self) -> bool:
        """Whether the scenario samples telemetry (``telemetry_options``)."""
        return self.spec.get("telemetry_options") is not None

    @property
    def telemetry_path(self) -> Path:
        """The reference's ``telemetry`` report section (scenarios with telemetry)."""
        return REFERENCE / f"{self.name}.telemetry.json"

    @property
    def planner(self) -> bool:
        """Whether the scenario runs the planner in the loop (``planner_config``)."""
        return self.spec.get("planner_config") is not None

    @property
    def planner_path(self) -> Path:
        """The reference's ``planner`` report section (scenarios with a planner)."""
        return REFERENCE / f"{self.name}.planner.json"

    @property
    def spread_path(self) -> Path:
        """Minimum and maximum of each summary key over the reference's runs (KV router)."""
        return REFERENCE / f"{self.name}.spread.json"


def load_scenarios() -> list[Scenario]:
    """Every scenario in ``tests/scenarios/reference/``, sorted by name."""
    return [
        Scenario(p.name.removesuffix(".scenario.json"), json.loads(p.read_text()))
        for p in sorted(REFERENCE.glob("*.scenario.json"))
    ]


def load_scenario(name: str) -> Scenario:
    """The scenario called ``name``."""
    return Scenario(name, json.loads((REFERENCE / f"{name}.scenario.json").read_text()))


def with_absolute_paths(spec: Json) -> Json:
    """A copy of ``spec`` whose trace and profile paths are absolute (relative ones are under ``tests/``)."""
    out: Json = json.loads(json.dumps(spec))
    if "trace" in out:
        out["trace"] = str(TESTS / out["trace"])
    for key in ("engine", "prefill_engine", "decode_engine"):
        timing = out.get(key, {}).get("timing_model")
        holder = timing.get("config", timing) if timing else {}
        if "path" in holder:  # a measured profile (fixed and polynomial timing have none)
            holder["path"] = str(TESTS / holder["path"])
    return out


def _servesim_engine(engine: Json, overrides: Json) -> Json:
    """An engine dict in servesim's words: the reference's external profile renamed, overrides applied."""
    out = {**engine, **overrides}
    timing = out.get("timing_model")
    if timing and timing.get("provider") == "dynamo_profile":
        out["timing_model"] = {"type": "interpolated", "path": timing["config"]["path"]}
    return out


def write_trace(spec: Json, workdir: Path) -> Path:
    """The scenario's trace cut to its first ``max_requests`` lines, written into ``workdir``."""
    lines = Path(spec["trace"]).read_text().splitlines(keepends=True)
    trace = workdir / "trace.jsonl"
    trace.write_text("".join(lines[: spec.get("max_requests", len(lines))]))
    return trace


# A scenario's synthetic keys and servesim's flags for them (each passed only when set).
_SYNTHETIC_FLAGS = {
    "input_tokens": "--input-tokens",
    "output_tokens": "--output-tokens",
    "request_count": "--request-count",
    "arrival_interval_ms": "--arrival-interval-ms",
    "request_rate": "--request-rate",
    "arrival_seed": "--arrival-seed",
    "turns_per_session": "--turns-per-session",
    "shared_prefix_ratio": "--shared-prefix-ratio",
    "num_prefix_groups": "--num-prefix-groups",
    "inter_turn_delay_ms": "--inter-turn-delay-ms",
}


# A scenario's trace keys and servesim's flags for them (each passed only when set).
_TRACE_FLAGS = {
    "trace_format": "--trace-format",
    "trace_shared_prefix_ratio": "--trace-shared-prefix-ratio",
    "trace_num_prefix_groups": "--trace-num-prefix-groups",
    "agentic_lanes": "--agentic-lanes",
    "execution_model": "--execution-model",
}
# Formats whose trace block size defaults to 512 (the others carry their own).
_MOONCAKE_LIKE = {"mooncake", "mooncake-delta", "mooncake_delta", "applied_compute_agentic"}


def servesim_argv(sc: Scenario, workdir: Path, report: Path) -> list[str]:
    """servesim's command line for a scenario, as ``refcheck.py argv`` builds it.

    Covers the scenario keys the stored scenarios use (trace or synthetic
    workload, closed loop, router mode and config, aggregated or
    disaggregated pools, timing profiles, servesim-only engine overrides); a
    scenario with any other key is refused, so a new key cannot be dropped
    silently.
    """
    known = {
        "name", "trace", "max_requests", "trace_block_size", "arrival_speedup_ratio",
        "synthetic", "replay_concurrency", "router_mode", "router_config", "num_workers",
        "engine", "num_prefill_workers", "num_decode_workers", "prefill_engine",
        "decode_engine", "servesim_engine_overrides", "kv_event_lag_ms", "telemetry_options",
        "planner_config", "capture_planner_details", *_TRACE_FLAGS,
    }  # fmt: skip
    unknown = sorted(set(sc.spec) - known)
    if unknown:
        raise ValueError(f"{sc.name}: scenario keys the test harness does not handle: {unknown}")
    unknown = sorted(set(sc.spec.get("synthetic", {})) - set(_SYNTHETIC_FLAGS))
    if unknown:
        raise ValueError(f"{sc.name}: synthetic keys the test harness does not handle: {unknown}")
    spec = with_absolute_paths(sc.spec)
    argv = ["replay"]
    if "trace" in spec:
        argv += [str(write_trace(spec, workdir))]
        if spec.get("trace_format", "mooncake") in _MOONCAKE_LIKE or "trace_block_size" in spec:
            argv += ["--trace-block-size", str(spec.get("trace_block_size", 512))]
        for key, flag in _TRACE_FLAGS.items():
            if spec.get(key) is not None:
                argv += [flag, str(spec[key])]
        if spec.get("arrival_speedup_ratio", 1.0) != 1.0:
            argv += ["--arrival-speedup-ratio", str(spec["arrival_speedup_ratio"])]
    else:
        syn = spec["synthetic"]
        for key, flag in _SYNTHETIC_FLAGS.items():
            if syn.get(key) is not None:
                argv += [flag, str(syn[key])]
    if spec.get("replay_concurrency") is not None:
        argv += ["--replay-concurrency", str(spec["replay_concurrency"])]
    argv += ["--router-mode", spec.get("router_mode", "round_robin")]
    if spec.get("router_config"):
        argv += ["--router-config", json.dumps(spec["router_config"])]
    if spec.get("kv_event_lag_ms") is not None:
        argv += ["--kv-event-lag-ms", str(spec["kv_event_lag_ms"])]
    overrides = spec.get("servesim_engine_overrides", {})
    if "prefill_engine" in spec or "decode_engine" in spec:
        argv += [
            "--num-prefill-workers", str(spec.get("num_prefill_workers", 1)),
            "--num-decode-workers", str(spec.get("num_decode_workers", 1)),
            "--prefill-engine-args", json.dumps(_servesim_engine(spec.get("prefill_engine", {}), overrides)),
            "--decode-engine-args", json.dumps(_servesim_engine(spec.get("decode_engine", {}), overrides)),
        ]  # fmt: skip
    else:
        argv += [
            "--num-workers", str(spec.get("num_workers", 1)),
            "--extra-engine-args", json.dumps(_servesim_engine(spec.get("engine", {}), overrides)),
        ]  # fmt: skip
    if spec.get("telemetry_options") is not None:
        interval = spec["telemetry_options"].get("sample_interval_ms", 1000.0)
        argv += ["--telemetry-interval-ms", str(interval)]
    if spec.get("planner_config") is not None:
        argv += ["--planner-config", json.dumps(spec["planner_config"])]
    if spec.get("capture_planner_details"):
        argv.append("--planner-details")
    return [*argv, "--report-json", str(report), "--quiet"]


def _round(value: Any) -> Any:
    """``value`` with floats cut to :data:`STORED_DIGITS` significant digits."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{STORED_DIGITS}g}")
    return value


def reduce_records(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Records as rows of :data:`RECORD_FIELDS`, in arrival order.

    Both simulators are sorted the same way: by arrival time, then input
    and output length, then session id and turn, then uuid. servesim numbers
    requests in arrival order; the reference gives trace requests and
    synthetic session turns random uuids, so the lengths break ties between
    trace requests that arrive together (no two requests in the shipped trace
    slices share arrival time and both lengths), the session and turn break
    ties between synthetic turns (two sessions' turns can be ready at the
    same instant), and the uuid only orders one-shot synthetic requests,
    which both simulators number ``00000000-0000-0000-0000-<index>``.
    """

    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        turn = r.get("turn_index")
        session = (r.get("session_id") or "", -1 if turn is None else turn)
        return (*(r[f] for f in IDENTITY_FIELDS), *session, r["uuid"])

    ordered = sorted(records, key=key)
    return [[_round(r.get(f)) for f in RECORD_FIELDS] for r in ordered]


def relative_difference(ref: float, ours: float) -> float:
    """``|ours - ref| / |ref|`` (the absolute difference when ``ref`` is 0)."""
    return abs(ours - ref) / abs(ref) if ref else abs(ours - ref)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def values_agree(ref: Any, ours: Any) -> bool:
    """Deterministic rule: floats within :data:`REL_TOL` (or :data:`ABS_TOL`), anything else exactly.

    An integer on the reference's side is a count and must match exactly.
    """
    if isinstance(ref, float) and _is_number(ours):
        return math.isclose(ours, ref, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(ref, int) and not isinstance(ref, bool):
        return _is_number(ours) and bool(ours == ref)
    return type(ours) is type(ref) and bool(ours == ref)


def describe(scenario: str, key: str, ref: Any, ours: Any) -> str:
    """One disagreement in words: scenario, key, both values, their relative difference."""
    text = f"{scenario}: {key}: reference {ref!r}, servesim {ours!r}"
    if _is_number(ref) and _is_number(ours):
        text += f", relative difference {relative_difference(ref, ours):.3g}"
    return text


def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A summary with nested objects spelled out as dotted keys (``g3_offload.read.transfer_ms``)."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            # A list of objects (agentic_play_outcomes): each by its index.
            for i, item in enumerate(value):
                out.update(flatten(item, f"{prefix}{key}.{i}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def flatten_all(value: Any, prefix: str = "") -> dict[str, Any]:
    """A report section with nested objects and lists spelled out as dotted keys
    (``samples.2.traffic.arriving_requests``); each list's length under ``<key>.#``."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten_all(item, f"{prefix}{key}."))
    elif isinstance(value, list):
        out[f"{prefix}#"] = len(value)
        for index, item in enumerate(value):
            out.update(flatten_all(item, f"{prefix}{index}."))
    else:
        out[prefix.removesuffix(".")] = value
    return out


def compare_section(scenario: str, reference: Any, ours: Any) -> list[str]:
    """Every value of a report section (``telemetry``) under the deterministic rule,
    list lengths included; a value one side lacks is a disagreement."""
    reference, ours = flatten_all(reference), flatten_all(ours)
    failures = [
        describe(scenario, key, reference[key], ours[key])
        for key in sorted(reference)
        if key in ours and not values_agree(reference[key], ours[key])
    ]
    failures += [
        f"{scenario}: {key}: reference {reference.get(key, '(none)')!r}, "
        f"servesim {ours.get(key, '(none)')!r}"
        for key in sorted(set(reference) ^ set(ours))
    ]
    return failures


def compared_keys(reference: Mapping[str, Any]) -> list[str]:
    """The reference's summary keys (dotted, see :func:`flatten`) that are compared: all but
    :data:`HOST_SPEED_KEYS` and :data:`KNOWN_DIFFERENCES`."""
    return sorted(
        k for k in flatten(reference) if k not in HOST_SPEED_KEYS and k not in KNOWN_DIFFERENCES
    )


def missing_keys(scenario: str, reference: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """A sentence for each compared reference key absent from servesim's summary."""
    reference, ours = flatten(reference), flatten(ours)
    return [
        f"{scenario}: {key}: reference {reference[key]!r}, servesim has no such key"
        for key in compared_keys(reference)
        if key not in ours
    ]


def compare_summary(
    scenario: str, reference: Mapping[str, Any], ours: Mapping[str, Any]
) -> list[str]:
    """Summary keys present on both sides whose values disagree (deterministic rule)."""
    reference, ours = flatten(reference), flatten(ours)
    return [
        describe(scenario, key, reference[key], ours[key])
        for key in compared_keys(reference)
        if key in ours and not values_agree(reference[key], ours[key])
    ]


def within_spread(low: Any, high: Any, ours: Any) -> bool:
    """KV-router rule: numbers inside ``[low, high]`` (with :data:`SPREAD_SLACK`), anything else equal."""
    if _is_number(low) and _is_number(high) and _is_number(ours):
        return bool(low - SPREAD_SLACK * abs(low) <= ours <= high + SPREAD_SLACK * abs(high))
    return type(ours) is type(low) and bool(low == high == ours)


def compare_spread(scenario: str, spread: Json, ours: Mapping[str, Any]) -> list[str]:
    """Summary keys present on both sides outside the range of the reference's runs."""
    low, high, ours = flatten(spread["min"]), flatten(spread["max"]), flatten(ours)
    failures = []
    for key in compared_keys(low):
        if key not in ours or within_spread(low[key], high[key], ours[key]):
            continue
        ref = low[key] if low[key] == high[key] else f"{low[key]!r}..{high[key]!r}"
        text = (
            f"{scenario}: {key}: reference {ref} over {spread['runs']} runs, servesim {ours[key]!r}"
        )
        if _is_number(low[key]) and _is_number(ours[key]):
            nearest = low[key] if ours[key] < low[key] else high[key]
            text += (
                f", relative difference to the range {relative_difference(nearest, ours[key]):.3g}"
            )
        failures.append(text)
    return failures


@dataclass
class RecordDiff:
    """Per-request disagreements: how many records differ, the largest differences per field, a few examples.

    ``largest_relative`` and ``largest_absolute`` map a field to its largest
    difference of that kind and the request (index in arrival order) where it
    occurs; a changed non-number counts as ``inf``.
    """

    differing_records: int
    largest_relative: dict[str, tuple[float, int]]
    largest_absolute: dict[str, tuple[float, int]]
    examples: list[str]

    def note(self, field: str, ref: Any, ours: Any, index: int) -> None:
        """Record one field's disagreement in request ``index``."""
        numbers = _is_number(ref) and _is_number(ours)
        for table, size in (
            (self.largest_relative, relative_difference(ref, ours) if numbers else math.inf),
            (self.largest_absolute, abs(ours - ref) if numbers else math.inf),
        ):
            if field not in table or size > table[field][0]:
                table[field] = (size, index)

    def describe(self, scenario: str, total: int) -> str:
        """The disagreement in words (empty when the records agree)."""
        if not self.differing_records:
            return ""
        parts = [f"{scenario}: {self.differing_records} of {total} request records differ"]
        for field in sorted(self.largest_relative):
            rel, rel_at = self.largest_relative[field]
            absolute, abs_at = self.largest_absolute[field]
            parts.append(
                f"  {field}: largest relative difference {rel:.3g} (request #{rel_at}), "
                f"largest absolute {absolute:.6g} (request #{abs_at})"
            )
        parts += ["  " + e for e in self.examples]
        return "\n".join(parts)


def compare_records(scenario: str, reference: Sequence[Row], ours: Sequence[Row]) -> RecordDiff:
    """Rows of :data:`RECORD_FIELDS`, request by request (row ``i`` is request ``#i``), under the deterministic rule."""
    diff = RecordDiff(0, {}, {}, [])
    if len(reference) != len(ours):
        diff.differing_records = max(len(reference), len(ours))
        diff.examples.append(f"reference has {len(reference)} records, servesim {len(ours)}")
        return diff
    for index, (ref_row, our_row) in enumerate(zip(reference, ours, strict=True)):
        bad = [
            (field, r, o)
            for field, r, o in zip(RECORD_FIELDS, ref_row, our_row, strict=True)
            if not values_agree(r, o)
        ]
        if not bad:
            continue
        diff.differing_records += 1
        for field, r, o in bad:
            diff.note(field, r, o, index)
        if len(diff.examples) < 5:
            ident = ", ".join(f"{f}={v}" for f, v in zip(IDENTITY_FIELDS, ref_row, strict=False))
            what = "; ".join(f"{f}: reference {r!r}, servesim {o!r}" for f, r, o in bad)
            diff.examples.append(f"request #{index} ({ident}): {what}")
    return diff


def read_records(path: Path) -> list[Row]:
    """Rows stored by :func:`write_records`, checking their fields."""
    data = json.loads(path.read_text())
    if tuple(data["fields"]) != RECORD_FIELDS:
        raise ValueError(f"{path}: fields {data['fields']} are not {list(RECORD_FIELDS)}")
    rows: list[Row] = data["rows"]
    return rows


def write_records(path: Path, rows: Sequence[Row]) -> None:
    """Rows as ``{"fields": [...], "rows": [...]}`` with one row per line (small, diffable)."""
    body = ",\n".join(json.dumps(row) for row in rows)
    path.write_text(f'{{"fields": {json.dumps(list(RECORD_FIELDS))},\n"rows": [\n{body}\n]}}\n')


# The reference's forward-pass metric fields (scheduled, then queued) and servesim's names.
_FPM_FIELDS = {
    ("scheduled_requests", "num_prefill_requests"): "prefill_requests",
    ("scheduled_requests", "sum_prefill_tokens"): "prefill_tokens",
    ("scheduled_requests", "var_prefill_length"): "prefill_length_var",
    ("scheduled_requests", "sum_prefill_kv_tokens"): "prefill_kv_tokens",
    ("scheduled_requests", "num_decode_requests"): "decode_requests",
    ("scheduled_requests", "sum_decode_kv_tokens"): "decode_kv_tokens",
    ("scheduled_requests", "var_decode_kv_tokens"): "decode_kv_var",
    ("queued_requests", "num_prefill_requests"): "queued_prefill",
    ("queued_requests", "sum_prefill_tokens"): "queued_prefill_tokens",
    ("queued_requests", "var_prefill_length"): "queued_prefill_var",
    ("queued_requests", "num_decode_requests"): "queued_decode",
    ("queued_requests", "sum_decode_kv_tokens"): "queued_decode_kv_tokens",
    ("queued_requests", "var_decode_kv_tokens"): "queued_decode_var",
}


def _reference_fpm(metrics: Json) -> Json:
    out = {ours: metrics[group][key] for (group, key), ours in _FPM_FIELDS.items()}
    out["wall_time_s"] = metrics["wall_time"]
    return out


def planner_view(section: Json, *, reference: bool) -> Json:
    """What both simulators' ``planner`` sections say, in one shape: the scaling events, the
    tick count, the shared metadata, the lifecycle operations (instant, pool, cause and
    transitions) and, with details, each tick's time and every (worker, rank)'s FPM by pool
    (an aggregated pool under ``decode``, as the reference files it)."""
    view: Json = {
        "scaling_events": section["scaling_events"],
        "total_ticks": section["total_ticks"],
        "metadata": {k: section["metadata"][k] for k in ("mode", "bootstrap", "details_captured")},
        "lifecycle_operations": [
            {
                "at_ms": op["at_ms"],
                "pool": op["pool"],
                "cause": op["cause"],
                "transitions": [
                    {k: t[k] for k in ("worker_id", "prior_state", "state", "transition")}
                    for t in op["transitions"]
                ],
            }
            for op in section["lifecycle_operations"]
        ],
    }
    ticks = []
    for tick in section.get("ticks", []):
        observed = tick["input"]["fpm_observations"] or {}
        fpms: Json = {}
        for pool, rows in observed.items():
            name = "decode" if pool == "agg" else pool
            fpms[name] = [
                {
                    "worker_id": int(row["worker_id"]),
                    "dp_rank": row["dp_rank"],
                    **(_reference_fpm(row["metrics"]) if reference else row["metrics"]),
                }
                for row in rows or []
            ]
        ticks.append({"at_ms": tick["at_ms"], "fpms": {k: v for k, v in fpms.items() if v}})
    view["ticks"] = ticks
    return view
