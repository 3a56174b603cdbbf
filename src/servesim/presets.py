"""Measured timing profiles shipped with servesim (``timing_model: {"profile": name}``).

Each preset is an NPZ in the interpolated layout (see
:class:`servesim.engine.timing.InterpolatedTiming`) under ``servesim/profiles/``;
``profiles/README.md`` says where each one's measurements come from and how the
file was built (``bench/build_profiles.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Preset:
    """One shipped profile: its file under ``servesim/profiles/`` and what it measured."""

    file: str
    description: str


PRESETS: dict[str, Preset] = {
    "h200-llama3.1-8b-fp8": Preset(
        file="h200_llama31_8b_fp8_tp1.npz",
        description=(
            "nvidia/Llama-3.1-8B-Instruct-FP8, vLLM, 1x H200, TP1: NVIDIA Dynamo 1.6.1's "
            "measured planner profile (17 prefill points, 41 decode points; Apache-2.0)"
        ),
    ),
}
"""The presets, by name."""


def preset_path(name: str) -> Path:
    """Where preset ``name``'s NPZ is installed."""
    from importlib import resources  # (17 ms of start-up at module level; only presets need it)

    return Path(str(resources.files("servesim") / "profiles" / PRESETS[name].file))
