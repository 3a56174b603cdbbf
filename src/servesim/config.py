"""Typed, validated configuration.

Engine arguments use the reference's flat engine keys (see
``spec/reference_engine_config.json``): a user of the reference passes the same
JSON object. Every key is validated here, once, so the engine can trust its
config. An unknown key, or one that belongs to a feature servesim does not
simulate yet, is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.errors import ConfigError
from servesim.presets import PRESETS, preset_path

if TYPE_CHECKING:
    from servesim.aic import AicSpec


class Role(StrEnum):
    """The part a worker plays: serve whole requests, or one side of a P/D handoff."""

    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


class Backend(StrEnum):
    """The engine a worker simulates: its scheduler and KV cache."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    """vLLM's core under TensorRT-LLM's ``GUARANTEED_NO_EVICT`` capacity policy."""


Parser = Callable[[str, Any], Any]
KeyTable = dict[str, tuple[str | None, Parser, Any]]
"""key -> (attribute, or None for a key that only validates; parser; default)."""


def _int(minimum: int, *, nullable: bool = False, maximum: int | None = None) -> Parser:
    def parse(key: str, value: Any) -> Any:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
        if value < minimum:
            raise ConfigError(f"'{key}' must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"'{key}' must be <= {maximum}, got {value}")
        return value

    return parse


def _float(minimum: float, *, nullable: bool = False, maximum: float | None = None) -> Parser:
    def parse(key: str, value: Any) -> Any:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"'{key}' must be a number >= {minimum}, got {value!r}")
        if not math.isfinite(value) or value < minimum:
            raise ConfigError(f"'{key}' must be a finite number >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"'{key}' must be <= {maximum}, got {value}")
        return float(value)

    return parse


def _positive() -> Parser:
    def parse(key: str, value: Any) -> Any:
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ConfigError(f"'{key}' must be a finite number greater than 0, got {value!r}")
        return float(value)

    return parse


def _bool(key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    return value


def _choice(*choices: str, lowercase: bool = True) -> Parser:
    """One of ``choices``, compared case-insensitively unless ``lowercase`` is False."""

    def parse(key: str, value: Any) -> Any:
        if isinstance(value, str) and lowercase:
            value = value.lower()
        if not isinstance(value, str) or value not in choices:
            allowed = ", ".join(f"'{c}'" for c in choices)
            raise ConfigError(f"'{key}' must be one of {allowed}, got {value!r}")
        return value

    return parse


def _only(default: Any, feature: str) -> Parser:
    """A key of a feature servesim does not simulate yet: only its default is accepted."""

    def parse(key: str, value: Any) -> Any:
        if value != default:
            raise ConfigError(
                f"'{key}' ({feature}) is not supported by servesim yet; "
                f"remove it or set it to {json.dumps(default)}"
            )
        return value

    return parse


_NOT_YET_TEXT = "not simulated yet (only the default is accepted)"


def _any(key: str, value: Any) -> Any:
    return value


def _accept_rates(key: str, value: Any) -> Any:
    """A comma-separated string of acceptance rates in [0, 1], as the reference spells them."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"'{key}' must be a comma-separated string such as \"0.85,0.3\", got {value!r}"
        )
    rates = []
    for index, text in enumerate(value.split(",")):
        try:
            rate = float(text.strip())
        except ValueError:
            raise ConfigError(f"'{key}' item {index} is not a number: {text.strip()!r}") from None
        if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
            raise ConfigError(f"'{key}' item {index} must be in [0, 1], got {rate}")
        rates.append(rate)
    return tuple(rates)


DEFAULT_ACCEPT_RATES = (0.85, 0.3, 0.0, 0.0, 0.0)
"""The reference's conditional acceptance rates when none are given (the first ``aic_nextn``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingModelConfig:
    """Which timing model prices a pass: ``polynomial`` (default), ``interpolated`` (NPZ,
    at ``path``; ``profile`` names a shipped preset), ``fixed`` (``prefill_ms`` for a pass
    that prefills anything, plus ``decode_ms`` for one that decodes anything) or ``aic``
    (AIConfigurator's database, engine ``aic``)."""

    type: str = "polynomial"
    path: str | os.PathLike[str] | None = None
    profile: str | None = None
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    aic: AicSpec | None = None

    def __post_init__(self) -> None:
        if self.path is not None and not isinstance(self.path, str):
            # A Path names the profile as well as a str; the config keeps the str.
            object.__setattr__(self, "path", os.fspath(self.path))

    @property
    def profile_path(self) -> str:
        """The measured profile's path (``interpolated`` only)."""
        assert self.path is not None, "an interpolated timing model has a path"
        return os.fspath(self.path)


def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"'{key}' must be a non-empty string, got {value!r}")
    return value


_AIC_FIELDS: dict[str, Parser] = {
    "system": _name,
    "model": _name,
    "backend": _choice(*Backend),
    "backend_version": _name,
    "tp_size": _int(1),
    "attention_dp_size": _int(1),
    "moe_tp_size": _int(1),
    "moe_ep_size": _int(1),
    "gemm_quant": _name,
    "moe_quant": _name,
    "kvcache_quant": _name,
}
"""The fields of an ``aic`` timing model (``system`` and ``model`` are required; the
backend defaults to the engine's, ``tp_size`` to its ``tensor_parallel_size``)."""


def _timing_model(key: str, value: Any) -> TimingModelConfig:
    if not isinstance(value, dict):
        raise ConfigError(f'\'{key}\' must be a JSON object like {{"type": "polynomial"}}')
    if "profile" in value:
        return _preset(key, value)
    kind = value.get("type")
    if kind == "polynomial":
        extra = set(value) - {"type"}
        if extra:
            raise ConfigError(f"'{key}': unknown field(s) {sorted(extra)} for type 'polynomial'")
        return TimingModelConfig()
    if kind == "interpolated":
        extra = set(value) - {"type", "path"}
        if extra:
            raise ConfigError(f"'{key}': unknown field(s) {sorted(extra)} for type 'interpolated'")
        path = value.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"'{key}': type 'interpolated' needs a 'path' to an NPZ profile")
        if not Path(path).is_file():
            raise ConfigError(f"'{key}': profile file not found: {path}")
        return TimingModelConfig(type="interpolated", path=path)
    if kind == "fixed":
        extra = set(value) - {"type", "prefill_ms", "decode_ms"}
        if extra:
            raise ConfigError(f"'{key}': unknown field(s) {sorted(extra)} for type 'fixed'")
        times = {}
        for name in ("prefill_ms", "decode_ms"):
            if name not in value:
                raise ConfigError(f"'{key}': type 'fixed' needs '{name}' (milliseconds per pass)")
            times[name] = _float(0.0)(f"{key}.{name}", value[name])
        return TimingModelConfig(type="fixed", **times)
    if kind == "aic":
        return _aic_timing(key, value)
    raise ConfigError(
        f"'{key}': type must be 'polynomial', 'interpolated', 'fixed' or 'aic' (or give a "
        f"'profile'), got {kind!r}"
    )


def _preset(key: str, value: dict[str, Any]) -> TimingModelConfig:
    extra = set(value) - {"type", "profile"}
    if extra or value.get("type", "interpolated") != "interpolated":
        raise ConfigError(
            f"'{key}': a 'profile' preset takes no other field, got {sorted(set(value))}"
        )
    name = value["profile"]
    if name not in PRESETS:
        raise ConfigError(
            f"'{key}': unknown profile {name!r}; the presets are: {', '.join(PRESETS)} "
            "(servesim timing list)"
        )
    return TimingModelConfig(type="interpolated", path=str(preset_path(name)), profile=name)


def _aic_timing(key: str, value: dict[str, Any]) -> TimingModelConfig:
    extra = set(value) - {"type", *_AIC_FIELDS}
    if extra:
        raise ConfigError(
            f"'{key}': unknown field(s) {sorted(extra)} for type 'aic' (it takes "
            f"{', '.join(_AIC_FIELDS)})"
        )
    for name in ("system", "model"):
        if name not in value:
            raise ConfigError(f"'{key}': type 'aic' needs '{name}' (servesim timing list)")
    fields = {
        name: _AIC_FIELDS[name](f"{key}.{name}", value[name]) for name in value if name != "type"
    }
    # The backend and TP size are filled in from the engine (see _resolve_aic).
    fields.setdefault("backend", "")
    fields.setdefault("tp_size", 0)
    from servesim.aic import AicSpec  # (AIC's layer loads for the runs that price with it)

    return TimingModelConfig(type="aic", aic=AicSpec(**fields))


@dataclass(frozen=True, slots=True, kw_only=True)
class SglangConfig:
    """The ``sglang`` engine keys, with the reference's defaults.

    ``new_token_ratio`` (the share of each running request's remaining output
    that admission keeps in reserve) starts at ``0.7 x schedule_conservativeness``
    and decays over 600 passes to 14% of that.
    """

    schedule_policy: str = "fifo"
    max_prefill_tokens: int = 16384
    # Shared by a worker's DP ranks: a rank chunks by chunked_prefill_size // dp_size
    # (max_prefill_tokens and the rest are each rank's own).
    chunked_prefill_size: int = 8192
    clip_max_new_tokens: int = 4096
    schedule_conservativeness: float = 1.0


_SGLANG_KEYS: KeyTable = {
    "schedule_policy": ("schedule_policy", _choice("fifo", "lpm", lowercase=False), "fifo"),
    # Must equal the engine's block_size (one page is one block).
    "page_size": ("page_size", _int(1), None),
    "max_prefill_tokens": ("max_prefill_tokens", _int(1), 16384),
    "chunked_prefill_size": ("chunked_prefill_size", _int(1), 8192),
    "clip_max_new_tokens": ("clip_max_new_tokens", _int(0), 4096),
    "schedule_conservativeness": ("schedule_conservativeness", _float(0.0), 1.0),
}

_SGLANG_KEY_MEANINGS = {
    "schedule_policy": "order of the waiting queue: fifo, or lpm (longest cached prefix first)",
    "page_size": "tokens per radix-cache page; must equal block_size (null: block_size)",
    "max_prefill_tokens": "token budget of one prefill pass",
    "chunked_prefill_size": "prefill tokens of one pass, shared by the DP ranks (a multiple of block_size; each rank gets chunked_prefill_size // dp_size)",
    "clip_max_new_tokens": "cap on each request's remaining output that admission reserves",
    "schedule_conservativeness": "scales the new-token-ratio reserve admission keeps (0.7 x this)",
}

_U32 = (1 << 32) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOffloadConfig:
    """``native_host_offload``: a host-memory (G2) KV tier per DP rank, vLLM's
    ``OffloadingConnector`` CPU path, or (``cluster_shared``) one tier for every rank
    of the deployment, named by ``kv_layout_id``. Bandwidths in GB/s (0 = instant):
    each rank's own links, and a shared tier's caps over all its copies."""

    num_host_blocks: int
    d2h_bandwidth_gbps: float = 32.0
    h2d_bandwidth_gbps: float = 32.0
    latency_to_first_byte_ms: float = 0.0
    scope: str = "dp_rank_local"
    kv_layout_id: str | None = None
    shared_d2h_bandwidth_gbps: float = 80.0
    shared_h2d_bandwidth_gbps: float = 80.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskOffloadConfig:
    """``g3_offload``: a disk (G3) KV tier under the host tier, one per worker
    (``worker_local``) or one for the cluster (``cluster_shared``). Bandwidths in
    GB/s (0 = instant); a transfer's bytes start ``latency_to_first_byte_ms`` after it
    is submitted, and concurrent transfers share the bandwidth equally."""

    scope: str
    num_g3_blocks: int
    latency_to_first_byte_ms: float = 0.1
    read_bandwidth_gbps: float = 10.0
    write_bandwidth_gbps: float = 10.0
    shared_read_bandwidth_gbps: float = 80.0
    shared_write_bandwidth_gbps: float = 80.0


def _host_scope(key: str, value: Any) -> Any:
    if value == "worker_local":
        raise ConfigError(
            f"'{key}': worker_local is a g3_offload scope; use dp_rank_local for a host tier "
            "per DP rank (or cluster_shared for one per deployment)"
        )
    return _choice("dp_rank_local", "cluster_shared", lowercase=False)(key, value)


def _text(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        raise ConfigError(f"'{key}' must be a string, got {value!r}")
    return value


_HOST_OFFLOAD_KEYS: KeyTable = {
    "num_host_blocks": ("num_host_blocks", _int(1), None),
    "d2h_bandwidth_gbps": ("d2h_bandwidth_gbps", _float(0.0), 32.0),
    "h2d_bandwidth_gbps": ("h2d_bandwidth_gbps", _float(0.0), 32.0),
    "latency_to_first_byte_ms": ("latency_to_first_byte_ms", _float(0.0), 0.0),
    "scope": ("scope", _host_scope, "dp_rank_local"),
    "kv_layout_id": ("kv_layout_id", _text, None),
    "shared_d2h_bandwidth_gbps": ("shared_d2h_bandwidth_gbps", _float(0.0), 80.0),
    "shared_h2d_bandwidth_gbps": ("shared_h2d_bandwidth_gbps", _float(0.0), 80.0),
}

_HOST_OFFLOAD_KEY_MEANINGS = {
    "num_host_blocks": "host KV capacity of each DP rank, in blocks (required)",
    "d2h_bandwidth_gbps": "GPU-to-host copy bandwidth, GB/s (0: instant)",
    "h2d_bandwidth_gbps": "host-to-GPU copy bandwidth, GB/s (0: instant)",
    "latency_to_first_byte_ms": "delay before a copy's bytes start moving",
    "scope": "dp_rank_local: one host tier per DP rank; cluster_shared: one per deployment",
    "kv_layout_id": "names a cluster-shared host tier (required with cluster_shared)",
    "shared_d2h_bandwidth_gbps": "a cluster-shared tier's GPU-to-host cap over all copies, GB/s",
    "shared_h2d_bandwidth_gbps": "a cluster-shared tier's host-to-GPU cap over all copies, GB/s",
}

_DISK_OFFLOAD_KEYS: KeyTable = {
    "scope": ("scope", _choice("worker_local", "cluster_shared", lowercase=False), None),
    "num_g3_blocks": ("num_g3_blocks", _int(1), None),
    "latency_to_first_byte_ms": ("latency_to_first_byte_ms", _float(0.0), 0.1),
    "read_bandwidth_gbps": ("read_bandwidth_gbps", _float(0.0), 10.0),
    "write_bandwidth_gbps": ("write_bandwidth_gbps", _float(0.0), 10.0),
    "shared_read_bandwidth_gbps": ("shared_read_bandwidth_gbps", _float(0.0), 80.0),
    "shared_write_bandwidth_gbps": ("shared_write_bandwidth_gbps", _float(0.0), 80.0),
}

_DISK_OFFLOAD_KEY_MEANINGS = {
    "scope": "worker_local (a disk tier per worker) or cluster_shared (one for all; required)",
    "num_g3_blocks": "disk KV capacity of the tier, in blocks (required)",
    "latency_to_first_byte_ms": "delay before a disk transfer's bytes start moving",
    "read_bandwidth_gbps": "disk-to-host bandwidth of one worker, GB/s (0: instant)",
    "write_bandwidth_gbps": "host-to-disk bandwidth of one worker, GB/s (0: instant)",
    "shared_read_bandwidth_gbps": "cluster_shared: disk read bandwidth all workers share, GB/s",
    "shared_write_bandwidth_gbps": "cluster_shared: disk write bandwidth all workers share, GB/s",
}

_REASONING_KEYS: KeyTable = {
    "start_thinking_token_id": (
        "start_thinking_token_id",
        _int(0, maximum=_U32),
        None,
    ),
    "end_thinking_token_id": ("end_thinking_token_id", _int(0, maximum=_U32), None),
    "thinking_ratio": ("thinking_ratio", _float(0.0, maximum=1.0), None),
}

_REASONING_KEY_MEANINGS = {
    "start_thinking_token_id": "token id that opens a thinking span (required)",
    "end_thinking_token_id": "token id that closes a thinking span (required)",
    "thinking_ratio": "share of output tokens that are thinking tokens, in [0, 1] (required)",
}

_TRTLLM_KEYS: KeyTable = {
    "capacity_scheduler_policy": (
        None,
        _choice("guaranteed_no_evict", lowercase=False),
        "guaranteed_no_evict",
    ),
}


_TRTLLM_KEY_MEANINGS = {
    "capacity_scheduler_policy": "admission policy; only guaranteed_no_evict is simulated",
}


def _sub_keys(table: KeyTable, *, required: bool | tuple[str, ...] = False) -> Parser:
    """A nested object of its own keys (``sglang``, ``trtllm``, ``reasoning``, ...), parsed
    with ``table``; ``required``: every key of the table (True), or those named, must be given."""
    needed = tuple(table) if required is True else required or ()

    def parse(key: str, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a JSON object, got {value!r}")
        parsed = _parse_keys(value, table, source=f"'{key}'", kind=key)  # unknown keys first
        missing = [name for name in needed if name not in value]
        if missing:
            raise ConfigError(f"'{key}' needs {', '.join(repr(m) for m in missing)}")
        return parsed

    return parse


# key -> (attribute name or None when the key only validates, parser, default)
_ENGINE_KEYS: KeyTable = {
    "backend": ("backend", _choice(*Backend), Backend.VLLM),
    "engine_type": ("backend", _choice(*Backend), Backend.VLLM),
    "num_gpu_blocks": ("num_gpu_blocks", _int(1), 16384),
    "block_size": ("block_size", _int(0), 0),
    "max_model_len": ("max_model_len", _int(1, nullable=True), None),
    "max_num_seqs": ("max_num_seqs", _int(1, nullable=True), 256),
    "max_num_batched_tokens": ("max_num_batched_tokens", _int(1, nullable=True), 8192),
    "enable_prefix_caching": ("enable_prefix_caching", _bool, True),
    "enable_chunked_prefill": ("enable_chunked_prefill", _bool, True),
    "speedup_ratio": ("speedup_ratio", _float(0.0), 1.0),
    "decode_speedup_ratio": ("decode_speedup_ratio", _float(0.0), 1.0),
    "preemption_mode": ("preemption_mode", _choice("lifo", "fifo"), "lifo"),
    "worker_type": ("worker_type", _choice(*Role), Role.AGGREGATED),
    "timing_model": ("timing_model", _timing_model, TimingModelConfig()),
    "dp_size": ("dp_size", _int(1), 1),
    "tensor_parallel_size": ("tensor_parallel_size", _int(1), 1),
    # Startup delay only matters to a planner that adds workers; a static replay has none.
    "startup_time": ("startup_time", _float(0.0, nullable=True), None),
    # Accepted and without effect on the simulation, as in the reference.
    "emit_kv_events": (None, _bool, False),
    "emit_kv_token_ids": (None, _bool, False),
    "num_gpu_blocks_is_explicit": (None, _bool, False),
    "has_perf_model": (None, _any, None),
    "aic_mtp_seed": ("aic_mtp_seed", _int(0, maximum=(1 << 64) - 1), 42),
    "sglang": ("sglang", _sub_keys(_SGLANG_KEYS), None),
    "trtllm": ("trtllm", _sub_keys(_TRTLLM_KEYS), None),
    # Live-serving settings the offline replay has no use for.
    "enable_local_indexer": (None, _bool, False),
    "bootstrap_port": (None, _int(0, nullable=True), None),
    "handoff_session_timeout_ms": (None, _int(1), 300000),
    "zmq_kv_events_port": (None, _int(0, nullable=True), None),
    "zmq_replay_port": (None, _int(0, nullable=True), None),
    # Features of later work: only their defaults are accepted for now.
    "prefill_schedule_interval": (None, _only(1, "prefill scheduling interval"), 1),
    "prefill_decode_interval": (None, _only(0, "prefill/decode interleaving"), 0),
    # Speculative decoding (MTP/Eagle): drafts per step, their conditional acceptance rates.
    "aic_nextn": ("aic_nextn", _int(1, nullable=True, maximum=5), None),
    "aic_nextn_accept_rates": ("aic_nextn_accept_rates", _accept_rates, None),
    "kv_transfer_bytes_per_token": ("kv_transfer_bytes_per_token", _positive(), None),
    "kv_transfer_bandwidth": ("kv_transfer_bandwidth", _positive(), None),
    "kv_transfer_timing_mode": (
        "kv_transfer_timing_mode",
        _choice("full_prompt", "destination_missing"),
        "full_prompt",
    ),
    "kv_transfer_link_model": (
        "kv_transfer_link_model",
        _choice("shared", "independent"),
        "shared",
    ),
    "is_prefill": ("is_prefill", _bool, False),
    "is_decode": ("is_decode", _bool, False),
    "gpu_memory_utilization": (None, _float(0.0, nullable=True, maximum=1.0), None),
    "mem_fraction_static": (None, _float(0.0, nullable=True, maximum=1.0), None),
    "free_gpu_memory_fraction": (None, _float(0.0, nullable=True, maximum=1.0), None),
    "cuda_graph_reserved_bytes": (None, _only(None, "AIC memory sizing"), None),
    # Output shaping (which output tokens are thinking tokens): validated, no effect on
    # timing or on anything the report shows, as in the reference.
    "reasoning": (None, _sub_keys(_REASONING_KEYS, required=True), None),
    "response_replay_trace_path": (None, _only(None, "response replay"), None),
    "router_queue_policy": (None, _only(None, "router queueing"), None),
    # KV offload tiers (vLLM): bytes of one token's KV, a host tier, a disk tier under it.
    "kv_cache_bytes_per_token": ("kv_cache_bytes_per_token", _int(1, nullable=True), None),
    "native_host_offload": (
        "native_host_offload",
        _sub_keys(_HOST_OFFLOAD_KEYS, required=("num_host_blocks",)),
        None,
    ),
    "g3_offload": (
        "g3_offload",
        _sub_keys(_DISK_OFFLOAD_KEYS, required=("scope", "num_g3_blocks")),
        None,
    ),
}

_NO_EFFECT = "accepted; no effect on an offline replay"
_NOT_YET = "not simulated yet: only the default is accepted"

# One line per engine key for ``servesim keys`` (a test checks every key has one).
_ENGINE_KEY_MEANINGS = {
    "backend": "engine to simulate: vllm, sglang or trtllm (case-insensitive)",
    "engine_type": "the same as backend",
    "num_gpu_blocks": "KV cache capacity of each DP rank, in blocks (derived from the model and GPU memory with AIC timing)",
    "block_size": "tokens per KV block",
    "max_model_len": "longest prompt plus output a request may have (null: unbounded)",
    "max_num_seqs": "most requests running at once per DP rank (null: unbounded)",
    "max_num_batched_tokens": "token budget of one engine pass (null: unbounded)",
    "enable_prefix_caching": "reuse cached prompt blocks across requests",
    "enable_chunked_prefill": "split a prompt over several passes (vllm, trtllm)",
    "speedup_ratio": "divide every pass duration by this",
    "decode_speedup_ratio": "divide decode time by this as well",
    "preemption_mode": "which running request loses its KV first when blocks run out: lifo or fifo",
    "worker_type": "aggregated, prefill or decode; must match the pool it configures",
    "timing_model": 'pass pricing: {"type": "polynomial"}, "interpolated" (with "path" to an NPZ), "fixed" (with "prefill_ms", "decode_ms"), "aic" (with "system", "model"), or {"profile": name} (servesim timing list)',
    "dp_size": "data-parallel ranks per worker, each with its own scheduler and KV cache",
    "tensor_parallel_size": "GPUs per DP rank (counts towards GPU-hours)",
    "startup_time": "seconds a worker a planner adds is starting (paid for, not routable); null: ready at once",
    "emit_kv_events": _NO_EFFECT,
    "emit_kv_token_ids": _NO_EFFECT,
    "num_gpu_blocks_is_explicit": _NO_EFFECT,
    "has_perf_model": _NO_EFFECT,
    "aic_mtp_seed": "seed of the speculative-decoding acceptance draws",
    "sglang": "object of sglang.* keys (backend sglang only)",
    "trtllm": "object of trtllm.* keys (backend trtllm only)",
    "enable_local_indexer": f"live serving setting; {_NO_EFFECT}",
    "bootstrap_port": f"live serving setting; {_NO_EFFECT}",
    "handoff_session_timeout_ms": f"live serving setting; {_NO_EFFECT}",
    "zmq_kv_events_port": f"live serving setting; {_NO_EFFECT}",
    "zmq_replay_port": f"live serving setting; {_NO_EFFECT}",
    "prefill_schedule_interval": _NOT_YET,
    "prefill_decode_interval": _NOT_YET,
    "aic_nextn": "speculative decoding: draft tokens per step, 1 to 5 (null: off)",
    "aic_nextn_accept_rates": 'conditional acceptance rate of each draft, e.g. "0.85,0.3" (null: the reference\'s)',
    "kv_transfer_bytes_per_token": "P/D: KV bytes moved per prompt token",
    "kv_transfer_bandwidth": "P/D: transfer link bandwidth in GB/s (null: no transfer delay)",
    "kv_transfer_timing_mode": "P/D, prefill side: full_prompt moves the whole prompt, destination_missing only blocks the decode rank lacks",
    "kv_transfer_link_model": "P/D: shared (max-min fair links) or independent transfers",
    "is_prefill": "legacy form of worker_type prefill",
    "is_decode": "legacy form of worker_type decode",
    "gpu_memory_utilization": "AIC timing, vllm: share of the GPU's memory for weights, activations and KV when num_gpu_blocks is derived (null: 0.9)",
    "mem_fraction_static": "AIC timing, sglang: share of the GPU's memory for weights, activations and KV when num_gpu_blocks is derived (null: 0.9)",
    "free_gpu_memory_fraction": "AIC timing, trtllm: share of the memory left after weights and activations for weights, activations and KV when num_gpu_blocks is derived (null: 0.9)",
    "cuda_graph_reserved_bytes": f"AIC memory sizing; {_NOT_YET}",
    "reasoning": "object of reasoning.* keys: which output tokens are thinking tokens (validated; changes nothing reported)",
    "response_replay_trace_path": f"response replay; {_NOT_YET}",
    "router_queue_policy": f"router queueing from engine args; {_NOT_YET}",
    "kv_cache_bytes_per_token": "KV bytes of one token in GPU memory (sizes offloaded blocks; derived from the model with AIC timing)",
    "native_host_offload": "object of native_host_offload.* keys: a host-memory KV tier (vllm)",
    "g3_offload": "object of g3_offload.* keys: a disk KV tier under the host tier (vllm)",
}
_SHOWN_DEFAULTS = {
    "block_size": "64 vllm, 32 trtllm, 1 sglang",
    "timing_model": '{"type": "polynomial"}',
}
"""Defaults ``servesim keys`` shows where the table's placeholder would mislead."""

_DEFAULT_BLOCK_SIZE = {Backend.VLLM: 64, Backend.TRTLLM: 32, Backend.SGLANG: 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """One worker's engine, validated; every field has the reference's default.

    ``max_num_seqs`` and ``max_num_batched_tokens`` of ``None`` mean unbounded.
    """

    backend: Backend = Backend.VLLM
    num_gpu_blocks: int = 16384
    block_size: int = 64
    max_model_len: int | None = None
    max_num_seqs: int | None = 256
    max_num_batched_tokens: int | None = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    speedup_ratio: float = 1.0
    decode_speedup_ratio: float = 1.0
    preemption_mode: str = "lifo"
    worker_type: Role = Role.AGGREGATED
    timing_model: TimingModelConfig = field(default_factory=TimingModelConfig)
    dp_size: int = 1
    tensor_parallel_size: int = 1
    startup_time: float | None = None
    kv_transfer_bytes_per_token: float | None = None
    kv_transfer_bandwidth: float | None = None
    kv_transfer_timing_mode: str = "full_prompt"
    kv_transfer_link_model: str = "shared"
    sglang: SglangConfig = field(default_factory=SglangConfig)
    aic_nextn: int | None = None
    aic_nextn_accept_rates: tuple[float, ...] | None = None
    aic_mtp_seed: int = 42
    kv_cache_bytes_per_token: int | None = None
    native_host_offload: HostOffloadConfig | None = None
    g3_offload: DiskOffloadConfig | None = None

    @property
    def accept_rates(self) -> tuple[float, ...]:
        """The conditional acceptance rate of each draft (speculative decoding on)."""
        assert self.aic_nextn is not None
        return self.aic_nextn_accept_rates or DEFAULT_ACCEPT_RATES[: self.aic_nextn]

    @property
    def gpus_per_worker(self) -> int:
        """GPUs one worker occupies: tensor parallel size times DP ranks."""
        return self.tensor_parallel_size * self.dp_size

    @property
    def total_kv_tokens(self) -> int:
        """KV capacity of one DP rank, in tokens."""
        return self.num_gpu_blocks * self.block_size


def _parse_keys(
    raw: Mapping[str, Any], table: KeyTable, *, source: str, kind: str
) -> dict[str, Any]:
    """Parse every key of ``raw`` with its table entry; returns attribute -> value.

    Raises:
        ConfigError: an unknown key, or a bad value, named with ``source`` and ``kind``.
    """
    values: dict[str, Any] = {}
    for key, value in raw.items():
        spec = table.get(key)
        if spec is None:
            raise ConfigError(
                f"{source}: unknown {kind} key '{key}'{_unknown_key_hint(key, table)}"
            )
        attribute, parse, _default = spec
        try:
            parsed = parse(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {kind} key {exc}") from None
        if attribute is not None:
            values[attribute] = parsed
    return values


def _unknown_key_hint(key: str, table: KeyTable) -> str:
    """What to tell the user about an unknown key: the closest known one, and where the rest are."""
    import difflib  # (only a mistyped key needs it)

    close = difflib.get_close_matches(key, table, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    if len(table) <= 10:
        return f"{hint} (known keys: {', '.join(sorted(table))})"
    return f"{hint} ('servesim keys' lists every key)"


def parse_engine_args(
    raw: Mapping[str, Any], *, source: str = "engine args", role: Role = Role.AGGREGATED
) -> EngineConfig:
    """Validate a flat engine-args object and return its :class:`EngineConfig`.

    Args:
        raw: the reference's flat engine keys, e.g. ``{"block_size": 64}``.
        source: where the object came from, used in error messages.
        role: the pool the engine serves: ``aggregated``, ``prefill`` or
            ``decode``; ``worker_type`` (or the legacy ``is_prefill`` /
            ``is_decode``) may be given but must agree with it.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or range, or a
            feature servesim does not simulate yet.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source} must be a JSON object, got {type(raw).__name__}")
    values = _parse_keys(raw, _ENGINE_KEYS, source=source, kind="engine")
    if "backend" in raw and "engine_type" in raw and values["backend"] != raw["backend"].lower():
        raise ConfigError(f"{source}: 'backend' and 'engine_type' disagree")
    backend = Backend(values.get("backend", Backend.VLLM))
    values["backend"] = backend
    _check_role(values, raw, source, role)
    for name, owner in (("sglang", Backend.SGLANG), ("trtllm", Backend.TRTLLM)):
        if values.get(name) is not None and backend is not owner:
            raise ConfigError(
                f"{source}: '{name}' keys configure the {owner} backend, but the backend is "
                f"'{backend}' (set \"backend\": \"{owner}\" or remove '{name}')"
            )
    values.pop("trtllm", None)  # its one policy is the only one accepted
    _check_speculative(values, source)
    sglang = values.pop("sglang", None) or {}
    page_size = sglang.pop("page_size", None)
    if "block_size" not in values:
        values["block_size"] = page_size or _DEFAULT_BLOCK_SIZE[backend]
    block_size = values["block_size"]
    if block_size <= 0:
        raise ConfigError(f"{source}: block_size must be positive, got {block_size}")
    if backend is Backend.SGLANG:
        values["sglang"] = _sglang_config(sglang, values, page_size, source)
    elif block_size < 2:
        raise ConfigError(
            f"{source}: block_size must be >= 2 for the {backend} backend, got {block_size}"
        )
    timing = values.get("timing_model")
    if timing is not None and timing.aic is not None:
        _resolve_aic(values, raw, source)
    _check_offload(values, source)
    return EngineConfig(**values)


def _resolve_aic(values: dict[str, Any], raw: Mapping[str, Any], source: str) -> None:
    """Complete an ``aic`` timing model from the engine (backend, TP size), check the
    database covers it, and derive the KV capacity and bytes per token not given."""
    from servesim.aic import DEFAULT_MEMORY_FRACTION, MEMORY_FRACTION_KEYS, check_covered, kv_memory

    timing: TimingModelConfig = values["timing_model"]
    spec = timing.aic
    assert spec is not None
    tp = values.get("tensor_parallel_size", 1)
    if spec.tp_size and "tensor_parallel_size" in raw and spec.tp_size != tp:
        raise ConfigError(
            f"{source}: timing_model.tp_size ({spec.tp_size}) and tensor_parallel_size ({tp}) "
            "disagree (give one of them)"
        )
    if spec.tp_size:
        values["tensor_parallel_size"] = spec.tp_size
    spec = replace(spec, backend=spec.backend or str(values["backend"]), tp_size=spec.tp_size or tp)
    check_covered(spec, f"{source}: 'timing_model'")
    values["timing_model"] = replace(timing, aic=spec)
    if "num_gpu_blocks" in raw and "kv_cache_bytes_per_token" in raw:
        return
    fraction_key = MEMORY_FRACTION_KEYS[spec.backend]
    fraction = raw.get(fraction_key)
    memory = kv_memory(
        spec,
        block_size=values["block_size"],
        fraction=DEFAULT_MEMORY_FRACTION[spec.backend] if fraction is None else float(fraction),
        max_num_tokens=values.get("max_num_batched_tokens", 8192) or 8192,
        max_batch_size=values.get("max_num_seqs", 256) or 256,
    )
    values.setdefault("num_gpu_blocks", memory.num_gpu_blocks)
    values.setdefault("kv_cache_bytes_per_token", memory.kv_bytes_per_token)


def _check_speculative(values: dict[str, Any], source: str) -> None:
    nextn, rates = values.get("aic_nextn"), values.get("aic_nextn_accept_rates")
    if rates is not None and nextn is None:
        raise ConfigError(f"{source}: aic_nextn_accept_rates requires aic_nextn")
    if nextn is None:
        return
    if rates is not None and len(rates) != nextn:
        raise ConfigError(
            f"{source}: aic_nextn_accept_rates has {len(rates)} rate(s) for aic_nextn {nextn}; "
            "give one conditional acceptance rate per draft token"
        )
    if values.get("decode_speedup_ratio", 1.0) != 1.0:
        raise ConfigError(
            f"{source}: aic_nextn requires decode_speedup_ratio=1.0 (speculative decoding is "
            "modelled by sampling bursts of tokens, not by a faster decode step)"
        )


def _check_offload(values: dict[str, Any], source: str) -> None:
    """Turn the offload objects into their configs; reject what the reference rejects."""
    host, disk = values.get("native_host_offload"), values.get("g3_offload")
    if disk is not None and host is None:
        raise ConfigError(
            f"{source}: g3_offload requires native_host_offload (the disk tier sits under "
            "the host tier)"
        )
    if host is None:
        return
    backend = values.get("backend", Backend.VLLM)
    if backend is not Backend.VLLM:
        raise ConfigError(
            f"{source}: native_host_offload is supported only for the vllm backend, not {backend}"
        )
    if values.get("kv_cache_bytes_per_token") is None:
        raise ConfigError(
            f"{source}: native_host_offload requires kv_cache_bytes_per_token (the size of "
            "an offloaded block is block_size x kv_cache_bytes_per_token)"
        )
    if not values.get("enable_prefix_caching", True):
        raise ConfigError(f"{source}: native_host_offload requires enable_prefix_caching=true")
    if values.get("aic_nextn") is not None:
        raise ConfigError(
            f"{source}: native_host_offload cannot be combined with aic_nextn "
            "(speculative decoding), as in the reference"
        )
    host_config = values["native_host_offload"] = HostOffloadConfig(**host)
    if host_config.scope == "cluster_shared" and not host_config.kv_layout_id:
        raise ConfigError(
            f"{source}: cluster_shared native_host_offload requires a nonempty kv_layout_id"
        )
    if disk is None:
        return
    if host_config.scope == "cluster_shared":
        raise ConfigError(
            f"{source}: g3_offload under a cluster_shared host tier is not simulated yet"
        )
    if values["worker_type"] is not Role.AGGREGATED:
        raise ConfigError(
            f"{source}: g3_offload is supported only for worker_type=aggregated, as in the reference"
        )
    if values.get("dp_size", 1) != 1:
        raise ConfigError(f"{source}: g3_offload supports only dp_size=1, as in the reference")
    values["g3_offload"] = DiskOffloadConfig(**disk)


def _sglang_config(
    keys: dict[str, Any], values: dict[str, Any], page_size: int | None, source: str
) -> SglangConfig:
    """Validate the ``sglang`` keys against the rest of the engine (one page is one block)."""
    block_size = values["block_size"]
    if page_size is not None and page_size != block_size:
        raise ConfigError(
            f"{source}: sglang.page_size ({page_size}) must equal block_size ({block_size}): "
            "one page is one KV block"
        )
    config = SglangConfig(**keys)
    if config.chunked_prefill_size % block_size:
        raise ConfigError(
            f"{source}: sglang.chunked_prefill_size ({config.chunked_prefill_size}) must be a "
            f"multiple of block_size ({block_size})"
        )
    # As the reference, each DP rank chunks by its share of the size (floored). It refuses
    # an engine whose share is 0, and a rank that prefills with less than a page stops at
    # its first prompt; a decode rank, which prefills nothing, runs.
    dp_size = values.get("dp_size", 1)
    per_rank = config.chunked_prefill_size // dp_size
    if per_rank == 0 or (per_rank < block_size and values.get("worker_type") is not Role.DECODE):
        raise ConfigError(
            f"{source}: sglang.chunked_prefill_size ({config.chunked_prefill_size}) over "
            f"dp_size ({dp_size}) ranks leaves each rank {per_rank} tokens a pass, less than "
            f"a page (block_size {block_size}): no prompt could be prefilled"
        )
    if not values.get("enable_chunked_prefill", True):
        raise ConfigError(
            f"{source}: enable_chunked_prefill=false is not supported for the sglang backend "
            "(it chunks by sglang.chunked_prefill_size)"
        )
    return config


def _check_role(values: dict[str, Any], raw: Mapping[str, Any], source: str, role: Role) -> None:
    legacy = [name for name in ("is_prefill", "is_decode") if values.pop(name, False)]
    if len(legacy) == 2:
        raise ConfigError(f"{source}: is_prefill and is_decode cannot both be true")
    if legacy and "worker_type" in raw:
        raise ConfigError(f"{source}: worker_type cannot be combined with is_prefill or is_decode")
    given = legacy[0].removeprefix("is_") if legacy else values.get("worker_type", role)
    if given != role:
        if role is Role.AGGREGATED:
            raise ConfigError(
                f"{source}: worker_type '{given}' needs disaggregated replay "
                "(--prefill-engine-args and --decode-engine-args)"
            )
        raise ConfigError(
            f"{source}: worker_type must be '{role}' for the {role} pool, got '{given}'"
        )
    values["worker_type"] = role
    if (
        role is Role.DECODE
        and values.get("kv_transfer_timing_mode", "full_prompt") != "full_prompt"
    ):
        raise ConfigError(
            f"{source}: kv_transfer_timing_mode is a prefill-side key (the source prices the "
            "transfer); set it in --prefill-engine-args"
        )


def load_json_argument(text: str, *, flag: str) -> Any:
    """Parse a JSON flag value given inline or as ``@path``.

    Raises:
        ConfigError: the file is missing or the text is not valid JSON.
    """
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror}") from None
        where = f"{flag} file {path}"
    else:
        where = flag
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


# ----- router -----

_QUEUE_POLICIES = ("fcfs", "lcfs", "wspt")


def _queue_policy(key: str, value: Any) -> Any:
    if value not in _QUEUE_POLICIES:
        raise ConfigError(f"'{key}' must be one of {', '.join(_QUEUE_POLICIES)}, got {value!r}")
    return value


# The reference's KvRouterConfig (Dynamo 1.6.1): key -> (attribute or None, parser, default).
_ROUTER_KEYS: KeyTable = {
    "overlap_score_credit": ("overlap_score_credit", _float(0.0), 1.0),
    "overlap_score_credit_decay": ("overlap_score_credit_decay", _float(0.0), 0.0),
    "prefill_load_scale": ("prefill_load_scale", _float(0.0), 1.0),
    "decode_active_request_weight": ("decode_active_request_weight", _float(0.0), 0.0),
    "router_temperature": ("router_temperature", _float(0.0), 0.0),
    "router_track_active_blocks": ("router_track_active_blocks", _bool, True),
    "router_assume_kv_reuse": ("router_assume_kv_reuse", _bool, True),
    "router_track_prefill_tokens": ("router_track_prefill_tokens", _bool, True),
    "router_queue_threshold": ("router_queue_threshold", _float(0.0, nullable=True), None),
    "router_queue_policy": ("router_queue_policy", _queue_policy, "fcfs"),
    "host_cache_hit_weight": ("host_cache_hit_weight", _float(0.0), 0.75),
    # The reference's replay indexes no disk-tier blocks, so this weight has no effect.
    "disk_cache_hit_weight": (None, _float(0.0), 0.25),
    # Live-serving plumbing with no effect on an offline replay.
    "use_kv_events": (None, _bool, True),
    "router_replica_sync": (None, _bool, False),
    "router_ttl_secs": (None, _float(0.0), 120.0),
    "router_approximate_cache_policy": (None, _any, "ttl"),
    "router_event_threads": (None, _any, 4),
    "router_tracking_hash": (
        None,
        _only("public-xxh3-v1", "tracking hash"),
        "public-xxh3-v1",
    ),
    "router_tracking_key_file": (None, _only(None, "tracking keys"), None),
    "router_tracking_key_id": (None, _only(None, "tracking keys"), None),
    # Features of later work: only their defaults are accepted.
    "overlap_score_weight": (None, _only(None, "the pre-1.6 cost formula"), None),
    "router_track_output_blocks": (None, _only(False, "output-block tracking"), False),
    "router_prefill_load_model": (None, _only("none", "AIC prefill load model"), "none"),
    "router_predicted_ttl_secs": (None, _only(None, "predicted TTL"), None),
    "use_remote_indexer": (None, _only(False, "remote indexer"), False),
    "serve_indexer": (None, _only(False, "remote indexer"), False),
    "enable_session_prefix_index": (None, _only(False, "session prefix index"), False),
    "shared_cache_multiplier": (None, _only(None, "shared cache tier"), None),
    "shared_cache_type": (None, _only("none", "shared cache tier"), "none"),
    "conditional_disagg_enabled": (None, _only(False, "conditional disaggregation"), False),
    "conditional_disagg_policy": (None, _any, "isl_bounding"),
    "conditional_disagg_eff_isl_threshold": (None, _any, 2048),
    "conditional_disagg_eff_isl_ratio_threshold": (None, _any, 0.7),
    "conditional_disagg_prefill_busy_threshold": (None, _any, None),
    "conditional_disagg_decode_busy_threshold": (None, _any, None),
    "router_policy_config": (None, _only(None, "router policy profiles"), None),
    "router_prefill_policy": (None, _only(None, "router policy profiles"), None),
    "router_decode_policy": (None, _only(None, "router policy profiles"), None),
}


_ROUTER_KEY_MEANINGS = {
    "overlap_score_credit": "blocks of prefill load one cached prompt block takes off a target's cost",
    "overlap_score_credit_decay": "shrink that credit on targets with more prefill load than the least loaded",
    "prefill_load_scale": "weight of the prefill load in the cost",
    "decode_active_request_weight": "cost per active request on the target",
    "router_temperature": "0: cheapest target; above 0: sample targets by softmax of cost at this temperature",
    "router_track_active_blocks": "count the blocks of requests in flight in the decode term",
    "router_assume_kv_reuse": "a block shared by active requests on a target counts once",
    "router_track_prefill_tokens": "count uncached prompt tokens still to prefill as load",
    "router_queue_threshold": "queue requests while every target's prefill load exceeds this x max_num_batched_tokens (null: no queue)",
    "router_queue_policy": "order of the router queue: fcfs, lcfs or wspt",
    "host_cache_hit_weight": (
        "what one block on a target's host tier (after its GPU prefix) counts for, in GPU blocks"
    ),
    "disk_cache_hit_weight": f"disk-tier credit; {_NO_EFFECT} (the router sees no disk blocks)",
    "use_kv_events": f"live serving setting; {_NO_EFFECT}",
    "router_replica_sync": f"live serving setting; {_NO_EFFECT}",
    "router_ttl_secs": f"live serving setting; {_NO_EFFECT}",
    "router_approximate_cache_policy": f"live serving setting; {_NO_EFFECT}",
    "router_event_threads": f"live serving setting; {_NO_EFFECT}",
    "router_tracking_hash": f"tracking hash; {_NOT_YET}",
    "router_tracking_key_file": f"tracking keys; {_NOT_YET}",
    "router_tracking_key_id": f"tracking keys; {_NOT_YET}",
    "overlap_score_weight": f"the pre-1.6 cost formula; {_NOT_YET}",
    "router_track_output_blocks": f"output-block tracking; {_NOT_YET}",
    "router_prefill_load_model": f"AIC prefill load model; {_NOT_YET}",
    "router_predicted_ttl_secs": f"predicted TTL; {_NOT_YET}",
    "use_remote_indexer": f"remote indexer; {_NOT_YET}",
    "serve_indexer": f"remote indexer; {_NOT_YET}",
    "enable_session_prefix_index": f"session prefix index; {_NOT_YET}",
    "shared_cache_multiplier": f"shared cache tier; {_NOT_YET}",
    "shared_cache_type": f"shared cache tier; {_NOT_YET}",
    "conditional_disagg_enabled": f"conditional disaggregation; {_NOT_YET}",
    "conditional_disagg_policy": f"conditional disaggregation; {_NO_EFFECT}",
    "conditional_disagg_eff_isl_threshold": f"conditional disaggregation; {_NO_EFFECT}",
    "conditional_disagg_eff_isl_ratio_threshold": f"conditional disaggregation; {_NO_EFFECT}",
    "conditional_disagg_prefill_busy_threshold": f"conditional disaggregation; {_NO_EFFECT}",
    "conditional_disagg_decode_busy_threshold": f"conditional disaggregation; {_NO_EFFECT}",
    "router_policy_config": f"router policy profiles; {_NOT_YET}",
    "router_prefill_policy": f"router policy profiles; {_NOT_YET}",
    "router_decode_policy": f"router policy profiles; {_NOT_YET}",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    """The KV router's tunables, with the reference's (``KvRouterConfig``, 1.6.1) names and defaults."""

    overlap_score_credit: float = 1.0
    overlap_score_credit_decay: float = 0.0
    prefill_load_scale: float = 1.0
    decode_active_request_weight: float = 0.0
    router_temperature: float = 0.0
    router_track_active_blocks: bool = True
    router_assume_kv_reuse: bool = True
    router_track_prefill_tokens: bool = True
    router_queue_threshold: float | None = None
    router_queue_policy: str = "fcfs"
    host_cache_hit_weight: float = 0.75


def parse_router_config(raw: Any, *, source: str = "--router-config") -> RouterConfig:
    """Validate a partial ``KvRouterConfig`` object.

    Raises:
        ConfigError: not an object, an unknown key, or a bad value (naming it).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source} must contain a JSON object, got {type(raw).__name__}")
    values = _parse_keys(raw, _ROUTER_KEYS, source=source, kind="router")
    return RouterConfig(**values)


# ----- the key reference (``servesim keys``) -----


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyInfo:
    """One key the config parser accepts: its name (``sglang.page_size`` when nested), the
    default shown to users (JSON text) and a one-line meaning."""

    name: str
    default: str
    meaning: str


def _key_infos(table: KeyTable, meanings: Mapping[str, str], prefix: str = "") -> list[KeyInfo]:
    infos = []
    for key, (_attribute, _parse, default) in table.items():
        shown = _SHOWN_DEFAULTS.get(key) if not prefix else None
        infos.append(
            KeyInfo(
                name=prefix + key,
                default=shown if shown is not None else json.dumps(default),
                meaning=meanings.get(key, ""),
            )
        )
    return infos


def engine_keys() -> list[KeyInfo]:
    """Every engine key :func:`parse_engine_args` accepts, the nested ones (``sglang``,
    ``trtllm``, ``reasoning``, the offload tiers) after the flat ones, from the parser's tables."""
    return [
        *_key_infos(_ENGINE_KEYS, _ENGINE_KEY_MEANINGS),
        *_key_infos(_SGLANG_KEYS, _SGLANG_KEY_MEANINGS, "sglang."),
        *_key_infos(_TRTLLM_KEYS, _TRTLLM_KEY_MEANINGS, "trtllm."),
        *_key_infos(_REASONING_KEYS, _REASONING_KEY_MEANINGS, "reasoning."),
        *_key_infos(_HOST_OFFLOAD_KEYS, _HOST_OFFLOAD_KEY_MEANINGS, "native_host_offload."),
        *_key_infos(_DISK_OFFLOAD_KEYS, _DISK_OFFLOAD_KEY_MEANINGS, "g3_offload."),
    ]


def router_keys() -> list[KeyInfo]:
    """Every ``--router-config`` key :func:`parse_router_config` accepts, from its table."""
    return _key_infos(_ROUTER_KEYS, _ROUTER_KEY_MEANINGS)


# ----- back to keys (provenance) -----

_NOT_KEPT = ("engine_type", "is_prefill", "is_decode", "trtllm")
"""Engine keys that spell another key's value (``backend``, ``worker_type``), or whose
one accepted value is the only behaviour (``trtllm``)."""


def timing_settings(timing: TimingModelConfig) -> dict[str, Any]:
    """The ``timing_model`` object that parses back to ``timing``."""
    if timing.type == "interpolated":
        if timing.profile is not None:
            return {"profile": timing.profile}
        return {"type": "interpolated", "path": timing.profile_path}
    if timing.type == "fixed":
        return {"type": "fixed", "prefill_ms": timing.prefill_ms, "decode_ms": timing.decode_ms}
    if timing.type == "aic":
        assert timing.aic is not None
        spec = {name: getattr(timing.aic, name) for name in _AIC_FIELDS}
        return {"type": "aic", **{k: v for k, v in spec.items() if v is not None}}
    return {"type": "polynomial"}


def engine_settings(engine: EngineConfig) -> dict[str, Any]:
    """Every engine key that shapes the simulation, with its resolved value: the object
    :func:`parse_engine_args` turns back into ``engine`` (keys that only validate, and
    aliases, are left out; ``sglang`` only for that backend)."""
    out: dict[str, Any] = {}
    for key, (attribute, _parse, _default) in _ENGINE_KEYS.items():
        if attribute is None or key in _NOT_KEPT:
            continue
        value = getattr(engine, attribute)
        if key == "timing_model":
            value = timing_settings(value)
        elif key == "sglang":
            if engine.backend is not Backend.SGLANG:
                continue
            value = {name: getattr(value, name) for name in SglangConfig.__slots__}
        elif key == "aic_nextn_accept_rates" and value is not None:
            value = ",".join(str(rate) for rate in value)
        elif key in ("native_host_offload", "g3_offload") and value is not None:
            fields = {name: getattr(value, name) for name in type(value).__slots__}
            value = {name: v for name, v in fields.items() if v is not None}
        elif isinstance(value, StrEnum):
            value = str(value)
        out[key] = value
    return out


def router_settings(router: RouterConfig) -> dict[str, Any]:
    """Every ``--router-config`` key of ``router``, resolved."""
    return {name: getattr(router, name) for name in RouterConfig.__slots__}
