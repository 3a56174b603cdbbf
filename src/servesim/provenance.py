"""What made a report: servesim's version, the resolved configuration, the seed and the
input files (name, size, SHA-256), as the report's ``provenance`` section.

The resolved configuration is a *settings* object (:mod:`servesim.settings`): the
replay's flag names with every default filled in, engine and router keys resolved
(``servesim replay --config REPORT`` replays it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.config import engine_settings, router_settings
from servesim.workload.formats import canonical_format
from servesim.workload.mooncake import STDIN

if TYPE_CHECKING:
    from servesim.simulation import RunConfig

_AGENTIC_FORMATS = ("agentic_mooncake", "dynamo")
_HASH_CHUNK = 1 << 20


def resolved_settings(config: RunConfig) -> dict[str, Any]:
    """The settings that make ``config`` again: each replay flag (by its name, without
    dashes) that applies to this run, with its value or default; null where the flag's
    default is "not given"."""
    s: dict[str, Any] = {}
    if config.trace is not None:
        fmt = canonical_format(config.trace_format)
        s["trace"] = [str(path) for path in (config.trace, *config.trace_shards)]
        s["trace_format"] = fmt
        s["trace_block_size"] = config.trace_block_size
        if fmt == "applied_compute_agentic":
            s["trace_shared_prefix_ratio"] = config.trace_shared_prefix_ratio
            s["trace_num_prefix_groups"] = config.trace_num_prefix_groups
        if fmt in _AGENTIC_FORMATS:
            s["execution_model"] = config.execution_model
            s["agentic_lanes"] = config.agentic_lanes
        s["arrival_speedup_ratio"] = config.arrival_speedup_ratio
    else:
        assert config.synthetic is not None
        s.update(asdict(config.synthetic))
    s["replay_concurrency"] = config.replay_concurrency
    s["seed"] = config.seed
    if config.disaggregated:
        assert config.prefill_engine is not None and config.decode_engine is not None
        s["num_prefill_workers"] = config.num_prefill_workers
        s["num_decode_workers"] = config.num_decode_workers
        s["prefill_engine"] = engine_settings(config.prefill_engine)
        s["decode_engine"] = engine_settings(config.decode_engine)
    else:
        s["num_workers"] = config.num_workers
        s["engine"] = engine_settings(config.engine)
    s["router_mode"] = config.router_mode
    if config.router_mode == "kv_router":
        s["session_affinity"] = config.session_affinity
        s["kv_event_lag_ms"] = config.kv_event_lag_ms
        s["router"] = router_settings(config.router)
    s["sla_ttft_ms"] = config.sla.ttft_ms
    s["sla_itl_ms"] = config.sla.itl_ms
    s["sla_e2e_ms"] = config.sla.e2e_ms
    ms = config.max_sim_time_ms
    s["max_sim_time_seconds"] = None if ms is None else ms / 1000.0
    s["exact_passes"] = config.exact_passes
    s["telemetry_interval_ms"] = config.telemetry_interval_ms
    if config.planner is not None:
        s["planner_config"] = asdict(config.planner)
        s["planner_details"] = config.planner_details
    return s


def file_digest(path: Path) -> dict[str, Any]:
    """A file's ``name`` (as given), ``size_bytes`` and ``sha256`` (hex).

    Raises:
        OSError: the file cannot be read.
    """
    import hashlib  # (it loads OpenSSL: ~4 ms of a start-up a synthetic replay never needs)

    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"name": str(path), "size_bytes": size, "sha256": digest.hexdigest()}


def input_files(config: RunConfig) -> list[dict[str, Any]]:
    """Each trace file's :func:`file_digest`; a trace on stdin is named ``<stdin>`` with a
    null size and hash (it cannot be read twice); a synthetic workload has none."""
    if config.trace_path is None:
        return []
    out = []
    for path in (config.trace_path, *config.trace_shards):
        if path == STDIN:
            out.append({"name": "<stdin>", "size_bytes": None, "sha256": None})
        else:
            out.append(file_digest(path))
    return out


def provenance(config: RunConfig, *, version: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's ``provenance`` section."""
    return {
        "servesim_version": version,
        "seed": config.seed,
        "config": resolved_settings(config),
        "inputs": inputs,
    }


def config_key(settings: dict[str, Any], inputs: list[dict[str, Any]], version: str) -> str:
    """A short stable hash of resolved settings, the inputs' contents and servesim's
    version: what a sweep keys a finished point by."""
    blob = json.dumps(
        {
            "config": settings,
            "inputs": [i["sha256"] for i in inputs],
            "version": version,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    import hashlib  # (see file_digest)

    return hashlib.sha256(blob.encode()).hexdigest()[:16]
