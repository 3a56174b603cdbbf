#!/usr/bin/env python3
"""Build the shipped timing presets (``src/servesim/profiles/*.npz``) from measured profiles.

    python bench/build_profiles.py     # rewrites src/servesim/profiles/h200_llama31_8b_fp8_tp1.npz

``h200-llama3.1-8b-fp8`` comes from NVIDIA Dynamo 1.6.1's planner test profile
``H200_TP1P_TP1D`` (``../shared/data/dynamo/profiling_results/``; Apache-2.0):
17 prefill points (ISL, TTFT) and 41 decode points (KV usage x max_kv_tokens,
mean context length, ITL). The interpolated layout wants a rectangular decode
grid; the measured points are not one (each context length was measured at its
own KV usages). The grid built here passes through every measured point, so the
preset reproduces each of them (a test checks it):

- context axis: the 6 measured context lengths;
- KV axis: every measured KV token count (41), plus 0 and ``max_kv_tokens``;
- a grid cell of context row c at KV k is the linear interpolation of row c's
  own measurements at k, held at the row's first or last measurement outside
  their range (a row's last measurements are not extrapolated: the ITL of the
  shortest contexts peaks and falls as the batch saturates).

Between rows the model is bilinear, as for any interpolated profile. Prefill
points are copied unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE = REPO_ROOT.parent / "shared" / "data" / "dynamo" / "profiling_results" / "H200_TP1P_TP1D"
TARGET = REPO_ROOT / "src" / "servesim" / "profiles" / "h200_llama31_8b_fp8_tp1.npz"


def decode_grid(
    kv_usage: np.ndarray, context: np.ndarray, itl: np.ndarray, max_kv_tokens: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (KV tokens, context, ITL) grid through every measured decode point."""
    kv_tokens = kv_usage * max_kv_tokens
    rows = np.unique(context)
    kv_axis = np.unique(np.concatenate(([0.0, max_kv_tokens], kv_tokens)))
    grid = np.empty((kv_axis.size, rows.size))
    for j, row in enumerate(rows):
        here = context == row
        order = np.argsort(kv_tokens[here])
        grid[:, j] = np.interp(kv_axis, kv_tokens[here][order], itl[here][order])
    return kv_axis, rows.astype(np.float64), grid


def main() -> None:
    """Write the preset NPZ."""
    with np.load(SOURCE / "selected_prefill_interpolation" / "raw_data.npz") as prefill:
        isl = np.asarray(prefill["prefill_isl"], dtype=np.float64)
        ttft = np.asarray(prefill["prefill_ttft"], dtype=np.float64)
    with np.load(SOURCE / "selected_decode_interpolation" / "raw_data.npz") as decode:
        kv_axis, ctx_axis, itl = decode_grid(
            np.asarray(decode["x_kv_usage"], dtype=np.float64),
            np.asarray(decode["y_context_length"], dtype=np.float64),
            np.asarray(decode["z_itl"], dtype=np.float64),
            float(np.ravel(decode["max_kv_tokens"])[0]),
        )
    order = np.argsort(isl)
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    with TARGET.open("wb") as out:
        np.savez(
            out,
            prefill_isl=isl[order],
            prefill_ttft_ms=ttft[order],
            decode_active_kv_tokens=kv_axis,
            decode_context_length=ctx_axis,
            decode_itl=itl,
        )
    print(f"wrote {TARGET}: {isl.size} prefill points, decode grid {itl.shape}")


if __name__ == "__main__":
    main()
