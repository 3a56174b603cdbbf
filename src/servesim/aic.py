"""NVIDIA AIConfigurator (``aiconfigurator-core``): its perf database, compiled engines and
KV memory model, behind the optional ``servesim[aic]`` extra.

Everything here imports the package lazily, so servesim runs without it; asking
for AIC timing without it is a :class:`ConfigError` that says how to install it.
The package logs the database files it loads; those messages are silenced
(a replay's stderr is for servesim's own messages).

What the database covers is read from the installed wheel, never hard-coded:
systems and their backend versions from ``get_supported_databases``, models
from the model configurations shipped in the wheel (compiling a model outside
that list would try to download its configuration).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.errors import ConfigError

INSTALL_HINT = (
    "AIC timing needs the optional package aiconfigurator-core: "
    "pip install 'servesim[aic]' (or pip install aiconfigurator-core)"
)

MEMORY_FRACTION_KEYS = {
    "vllm": "gpu_memory_utilization",
    "sglang": "mem_fraction_static",
    "trtllm": "free_gpu_memory_fraction",
}
"""The engine key holding each backend's KV memory fraction (vLLM and SGLang: of the
GPU's total memory; TRT-LLM: of the memory left after weights and activations)."""

DEFAULT_MEMORY_FRACTION = {"vllm": 0.9, "sglang": 0.9, "trtllm": 0.9}
"""The fraction used when none is given: vLLM's ``gpu_memory_utilization`` default,
TRT-LLM's ``free_gpu_memory_fraction`` default, and 0.9 for SGLang (whose own default
depends on the GPU's memory)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AicSpec:
    """One AIC engine: what ``EngineHandle.compile`` is given (hashable: engines are
    compiled once per spec and shared by every worker that asks for it)."""

    system: str
    backend: str
    model: str
    backend_version: str | None = None
    tp_size: int = 1
    attention_dp_size: int = 1
    moe_tp_size: int | None = None
    moe_ep_size: int | None = None
    gemm_quant: str | None = None
    moe_quant: str | None = None
    kvcache_quant: str | None = None

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``compile_engine`` and ``estimate_kv_cache``."""
        kwargs: dict[str, Any] = {
            "tp_size": self.tp_size,
            "attention_dp_size": self.attention_dp_size,
            "moe_tp_size": self.moe_tp_size,
            "moe_ep_size": self.moe_ep_size,
            "gemm_quant_mode": self.gemm_quant,
            "moe_quant_mode": self.moe_quant,
            "kvcache_quant_mode": self.kvcache_quant,
        }
        return {key: value for key, value in kwargs.items() if value is not None}


def _package() -> Any:
    try:
        import aiconfigurator_core
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    import logging  # (7 ms of start-up at module level; only the optional package needs it)

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return aiconfigurator_core


def is_installed() -> bool:
    """Whether the optional package can be imported."""
    try:
        _package()
    except ConfigError:
        return False
    return True


@functools.cache
def databases() -> dict[str, dict[str, list[str]]]:
    """system -> backend -> queryable versions, as the installed database declares them."""
    _package()
    from aiconfigurator_core.sdk import perf_database

    found = perf_database.get_supported_databases()
    return {
        system: {backend: list(versions) for backend, versions in sorted(found[system].items())}
        for system in sorted(found)
    }


@functools.cache
def models() -> list[str]:
    """The model names whose configuration ships in the wheel (``org/name``)."""
    package = _package()
    folder = Path(package.__file__).parent / "model_configs"
    suffix = "_config.json"
    names = {
        path.name[: -len(suffix)].replace("--", "/", 1)
        for path in folder.glob(f"*{suffix}")
        if not path.name.endswith("_hf_quant_config.json")
    }
    return sorted(names)


def check_covered(spec: AicSpec, key: str) -> None:
    """Raise a :class:`ConfigError` listing what the database has when ``spec`` asks for
    a system, backend, version or model it lacks.

    The quick checks read one small file; the full listing (every system file and
    version slot: seconds) is read only to explain a miss.
    """
    if spec.model in models() and _has_database(spec):
        return
    systems = databases()
    if spec.system not in systems:
        raise ConfigError(
            f"{key}: AIC has no system {spec.system!r}; its database has: {', '.join(systems)}"
        )
    backends = systems[spec.system]
    if spec.backend not in backends:
        raise ConfigError(
            f"{key}: AIC has no {spec.backend!r} data for {spec.system}; it has: "
            f"{', '.join(backends)}"
        )
    versions = backends[spec.backend]
    if spec.backend_version is not None and spec.backend_version not in versions:
        raise ConfigError(
            f"{key}: AIC has no {spec.backend} version {spec.backend_version!r} for "
            f"{spec.system}; it has: {', '.join(versions)}"
        )
    if spec.model not in models():
        raise ConfigError(
            f"{key}: AIC has no model {spec.model!r}; its database has: {', '.join(models())}"
        )


def _has_database(spec: AicSpec) -> bool:
    """Whether the wheel has ``spec``'s system, kernel data for its backend, and its version."""
    package = _package()
    from aiconfigurator_core.sdk import perf_database

    systems = Path(package.__file__).parent / "systems"
    if not (systems / f"{spec.system}.yaml").is_file():
        return False
    if not (systems / "data" / spec.system / "gemm" / spec.backend).is_dir():
        return False
    slots = perf_database.get_version_slots(spec.system, spec.backend)
    if not slots:
        return False
    return spec.backend_version is None or spec.backend_version in slots.values()


@functools.lru_cache(maxsize=32)
def compile_engine(spec: AicSpec) -> Any:
    """The compiled ``EngineHandle`` of ``spec``, compiled once per process and spec.

    Raises:
        ConfigError: the package is missing, or AIC cannot build this engine (its
            message is passed on: e.g. a TP size the model's heads do not divide).
    """
    _package()
    from aiconfigurator_core.sdk.engine import EngineHandle

    try:
        return EngineHandle.compile(
            spec.model,
            spec.system,
            spec.backend,
            backend_version=spec.backend_version,
            **spec.compile_kwargs(),
        )
    except (ValueError, KeyError, RuntimeError, AssertionError, NotImplementedError) as exc:
        raise ConfigError(f"AIC cannot build {_describe(spec)}: {exc}") from None


@dataclass(frozen=True, slots=True)
class KvMemory:
    """What one rank's GPU memory holds for KV, from AIC's memory model."""

    kv_bytes_per_token: int
    """KV bytes of one token on one rank, ``floor(kv_budget_bytes / kv_tokens)`` (standard
    attention: all layers, K and V, this rank's heads)."""
    kv_budget_bytes: int
    """Bytes left for KV on one rank (see :func:`kv_memory`)."""
    kv_tokens: int
    """Tokens that budget holds: ``floor(kv_budget_bytes / bytes of one token)`` for
    standard attention; AIC's own inverse of its KV curve for hybrid models, whose
    recurrent state is per sequence, not per token."""
    num_gpu_blocks: int
    """``floor(kv_tokens / block_size)``."""


@functools.lru_cache(maxsize=32)
def kv_memory(
    spec: AicSpec, *, block_size: int, fraction: float, max_num_tokens: int, max_batch_size: int
) -> KvMemory:
    """One rank's KV capacity, from model, parallelism, precision and GPU memory.

    AIC's native memory model (``estimate_kv_cache``) gives the non-KV memory of a
    rank, ``weights + activations + runtime + nccl`` (activations sized for the
    per-pass token budget ``max_num_tokens``), and the KV bytes of one token. The KV
    budget is ``capacity * fraction - non_kv`` for vLLM and SGLang, and
    ``(capacity - non_kv) * fraction`` for TRT-LLM, where ``capacity`` is the GPU's
    memory in the system file. The tokens it holds are AIC's (see
    :attr:`KvMemory.kv_tokens`).

    Raises:
        ConfigError: the package is missing, AIC cannot size this engine, or no
            memory is left for KV.
    """
    _package()
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    version = resolved_version(spec)
    try:
        estimate = estimate_kv_cache(
            spec.model,
            spec.system,
            spec.backend,
            version,
            max_num_tokens=max_num_tokens,
            max_batch_size=max_batch_size,
            memory_fraction_kind="of_free" if spec.backend == "trtllm" else "of_total",
            memory_fraction_value=fraction,
            **spec.compile_kwargs(),
        )
    except ValueError as exc:
        raise ConfigError(f"AIC cannot size the KV cache of {_describe(spec)}: {exc}") from None
    budget = int(estimate["total_kv_size_bytes"])
    tokens = int(estimate["total_kv_size_tokens"])
    blocks = tokens // block_size
    if blocks < 1:
        raise ConfigError(
            f"{_describe(spec)} leaves no GPU memory for a KV block of {block_size} tokens "
            f"({budget} bytes hold {tokens} tokens)"
        )
    return KvMemory(
        kv_bytes_per_token=budget // tokens,
        kv_budget_bytes=budget,
        kv_tokens=tokens,
        num_gpu_blocks=blocks,
    )


def resolved_version(spec: AicSpec) -> str:
    """The backend version ``spec`` prices with: its own, or the database's ``current`` one."""
    if spec.backend_version is not None:
        return spec.backend_version
    _package()
    from aiconfigurator_core.sdk import perf_database

    return str(perf_database.resolve_query_version(spec.system, spec.backend, "current"))


def _describe(spec: AicSpec) -> str:
    return f"{spec.model} on {spec.system} with {spec.backend} at TP {spec.tp_size}"
