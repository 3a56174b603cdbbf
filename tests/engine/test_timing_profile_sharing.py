"""A measured profile is read once per file version and its model shared by every worker."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from servesim import ConfigError, parse_engine_args
from servesim.engine.timing import InterpolatedTiming, make_timing
from servesim.engine.worker import Worker


def write_profile(path: Path, itl_ms: float) -> Path:
    """A flat profile: every decode step takes ``itl_ms``."""
    axis = np.array([0.0, 1e6])
    np.savez(
        path,
        prefill_isl=np.array([1.0, 1e5]),
        prefill_ttft_ms=np.array([10.0, 1000.0]),
        decode_active_kv_tokens=axis,
        decode_context_length=axis,
        decode_itl=np.full((2, 2), itl_ms),
    )
    return path


def engine(path: Path, **extra: object) -> dict[str, object]:
    return {"timing_model": {"type": "interpolated", "path": str(path)}, **extra}


def test_workers_of_one_profile_share_one_read_only_model(tmp_path: Path) -> None:
    config = parse_engine_args(engine(write_profile(tmp_path / "p.npz", 7.0), dp_size=2))
    workers = [Worker(i, config) for i in range(3)]
    models = {id(rank.timing) for worker in workers for rank in worker.ranks}
    assert len(models) == 1
    timing = workers[0].ranks[0].timing
    assert isinstance(timing, InterpolatedTiming)
    assert timing.decode_ms(1, 100, 100) == 7.0
    with pytest.raises(ValueError, match="read-only"):
        timing._itl[0, 0] = 1.0


def test_other_speedups_get_their_own_model(tmp_path: Path) -> None:
    path = write_profile(tmp_path / "p.npz", 7.0)
    plain = make_timing(parse_engine_args(engine(path)))
    faster = make_timing(parse_engine_args(engine(path, speedup_ratio=2.0)))
    assert plain is not faster
    assert (plain.prefill_divisor, faster.prefill_divisor) == (1.0, 2.0)


def test_a_rewritten_profile_is_read_again(tmp_path: Path) -> None:
    path = write_profile(tmp_path / "p.npz", 7.0)
    config = parse_engine_args(engine(path))
    before = make_timing(config)
    write_profile(path, 9.0)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later version
    after = make_timing(config)
    assert after is not before
    assert (before.decode_ms(1, 100, 100), after.decode_ms(1, 100, 100)) == (7.0, 9.0)


def test_a_profile_that_cannot_be_read_fails_every_time(tmp_path: Path) -> None:
    """Failures are not cached: a file gone, then one that is not a profile, each raise."""
    path = write_profile(tmp_path / "p.npz", 7.0)
    config = parse_engine_args(engine(path))
    path.unlink()
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"p\.npz: cannot load"):
            make_timing(config)
    path.write_text("not a profile")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"p\.npz: cannot load"):
            make_timing(config)
