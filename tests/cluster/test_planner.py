"""The planner in the loop: each target's arithmetic on hand-computed cases, the GPU budget,
the idle-FPM rule, the config's bad input, and runs where a planner must change nothing.

The reference scenarios (``tests/scenarios``) hold the planner against the
reference end to end; these pin the rules one at a time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.cli import main
from servesim.cluster.planner import (
    FpmBuffer,
    Planner,
    PlannerConfig,
    clamp_pair,
    clamp_single,
    fit_pair,
    guard_pair,
    guard_single,
    planner_config,
    sla_capacity,
    sla_decode_batch,
    sla_prefill_ms,
)
from servesim.cluster.runtime import Pool, ScalingSnapshot, Stage, WorkerState
from servesim.config import EngineConfig, Role
from servesim.engine.scheduler import ForwardPass
from servesim.engine.worker import Worker
from servesim.errors import ConfigError
from servesim.metrics.report import request_row
from servesim.metrics.telemetry import TrafficWindow
from tests.support import paid_worker_seconds, run_cli, state_at

AGG, PREFILL, DECODE = Stage.AGGREGATED, Stage.PREFILL, Stage.DECODE
# KV capacity 1,000 tokens a rank; a prompt of at most 1,000 tokens.
SMALL = {"block_size": 10, "num_gpu_blocks": 100, "max_model_len": 1000}


def _engine(role: Role = Role.AGGREGATED, **keys: Any) -> EngineConfig:
    return parse_engine_args({**SMALL, **keys}, role=role)


def _pool(stage: Stage, engine: EngineConfig, workers: int) -> Pool:
    def factory(worker_id: int) -> Worker:
        return Worker(worker_id, engine, fpm=True)

    return Pool(stage, [factory(i) for i in range(workers)], [], factory=factory)


def _publish(pool: Pool, at_ms: float, *fpms: ForwardPass) -> None:
    """Each worker of ``pool`` publishes its FPM (one rank each) at ``at_ms``."""
    for worker, fpm in zip(pool.workers, fpms, strict=True):
        worker.fpms = [fpm]
        worker.fpm_ms = at_ms
        worker.fpm_count += 1


def _planner(pools: dict[Stage, Pool], **keys: Any) -> Planner:
    mode = "agg" if AGG in pools else "disagg"
    config = planner_config({"mode": mode, **keys})
    engines = {stage: pool.workers[0].config for stage, pool in pools.items()}
    return Planner(config, engines, TrafficWindow())


def _tick(planner: Planner, pools: dict[Stage, Pool], at_ms: float) -> dict[Stage, int]:
    snapshot = ScalingSnapshot(ordinal=planner.total_ticks, now_ms=at_ms, pools=pools)
    return planner.on_tick(snapshot).targets


def _decode(kv: int, queued_prefill: int = 0) -> ForwardPass:
    return ForwardPass(decode_kv_tokens=kv, queued_prefill_tokens=queued_prefill)


# ----- easy targets -----


def test_throughput_agg_scales_up_over_full_kv_and_not_at_it() -> None:
    """Aggregated utilisation counts queued prompts: 600 + 401 over 1,000 KV tokens is 1.001
    (> 1.0: one more worker); exactly 1.0 is not over (the throughput target's '>')."""
    pools = {AGG: _pool(AGG, _engine(), 1)}
    planner = _planner(pools, optimization_target="throughput")
    _publish(pools[AGG], 4500.0, _decode(600, 400))
    assert _tick(planner, pools, 5000.0) == {}
    _publish(pools[AGG], 9500.0, _decode(600, 401))
    assert _tick(planner, pools, 10000.0) == {AGG: 2}
    assert planner.scaling_events == [
        {"at_s": 10.0, "component": "agg", "from_count": 1, "to_count": 2, "reason": "scale_up"}
    ]


def test_load_target_scales_up_at_its_rate() -> None:
    """The load target's rate is inclusive: utilisation 0.8 at decode_scale_up_kv_rate 80."""
    pools = {AGG: _pool(AGG, _engine(), 1)}
    planner = _planner(
        pools,
        optimization_target="load",
        decode_scale_up_kv_rate=80,
        decode_scale_down_kv_rate=10,
    )
    _publish(pools[AGG], 4500.0, _decode(800))
    assert _tick(planner, pools, 5000.0) == {AGG: 2}


def test_scale_down_only_when_the_survivors_stay_under_the_up_threshold() -> None:
    """Two workers under 0.6 (throughput): down to 1 if the busier one's load x 2 / 1 stays
    under 1.0 (0.45 x 2 = 0.9), held at 2 otherwise (0.55 x 2 = 1.1)."""
    pools = {AGG: _pool(AGG, _engine(), 2)}
    planner = _planner(pools, optimization_target="throughput")
    _publish(pools[AGG], 4900.0, _decode(550), _decode(100))
    assert _tick(planner, pools, 5000.0) == {}
    _publish(pools[AGG], 9900.0, _decode(450), _decode(100))
    assert _tick(planner, pools, 10000.0) == {AGG: 1}


def test_latency_disagg_prefill_queue_against_context_length() -> None:
    """Latency target: prefill up when a queue reaches a tenth of max_model_len (100 of 1,000
    tokens); decode up over 0.4 of the KV (401 of 1,000). Both scale in one tick."""
    pools = {PREFILL: _pool(PREFILL, _engine(Role.PREFILL), 1)}
    pools[DECODE] = _pool(DECODE, _engine(Role.DECODE), 1)
    planner = _planner(pools, optimization_target="latency")
    _publish(pools[PREFILL], 4500.0, ForwardPass(queued_prefill_tokens=99))
    _publish(pools[DECODE], 4500.0, _decode(400))
    assert _tick(planner, pools, 5000.0) == {}
    _publish(pools[PREFILL], 9500.0, ForwardPass(queued_prefill_tokens=100))
    _publish(pools[DECODE], 9500.0, _decode(401))
    assert _tick(planner, pools, 10000.0) == {PREFILL: 2, DECODE: 2}


def test_prefill_never_scales_without_a_context_length() -> None:
    """No max_model_len: the easy targets cannot weigh a prefill queue (the reference's rule)."""
    pools = {PREFILL: _pool(PREFILL, _engine(Role.PREFILL, max_model_len=None), 1)}
    pools[DECODE] = _pool(DECODE, _engine(Role.DECODE), 1)
    planner = _planner(pools, optimization_target="latency")
    _publish(pools[PREFILL], 4500.0, ForwardPass(queued_prefill_tokens=10**6))
    _publish(pools[DECODE], 4500.0, _decode(200))
    assert _tick(planner, pools, 5000.0) == {}


def test_starting_workers_make_the_planner_observe_only() -> None:
    """A worker still starting: the tick observes (no decision) however loaded the pool is."""
    pools = {AGG: _pool(AGG, _engine(), 1)}
    pools[AGG].workers.append(Worker(1, pools[AGG].workers[0].config, fpm=True))
    pools[AGG].states.append(WorkerState.STARTING)
    pools[AGG].since.append(1000.0)
    planner = _planner(pools, optimization_target="throughput")
    _publish(pools[AGG], 4500.0, _decode(2000), ForwardPass())
    assert _tick(planner, pools, 5000.0) == {}
    assert planner.ticks == [] and planner.total_ticks == 1


def test_a_worker_without_fpms_blocks_the_decision() -> None:
    """Two ready workers, one that became active at the tick and published nothing: the FPMs
    do not cover the pool, no decision (the reference's worker-count check)."""
    pools = {AGG: _pool(AGG, _engine(), 2)}
    pools[AGG].since[1] = 5000.0
    planner = _planner(pools, optimization_target="throughput")
    pools[AGG].workers[0].fpms = [_decode(5000)]
    pools[AGG].workers[0].fpm_ms, pools[AGG].workers[0].fpm_count = 4900.0, 1
    assert _tick(planner, pools, 5000.0) == {}


# ----- the idle-FPM rule -----


def test_idle_workers_publish_zeros_every_whole_second() -> None:
    """Active since 100 ms with no FPM: nothing at 1,099, zeros at 1,100 (its clock moves to
    1,100); a real FPM at 1,500 stands at 2,100 and turns to zeros at 2,500."""
    pool = _pool(AGG, _engine(), 1)
    pool.since[0] = 100.0
    buffer = FpmBuffer()
    buffer.observe(pool, 1099.0)
    assert buffer.latest == {}
    buffer.observe(pool, 1100.0)
    assert buffer.latest == {(0, 0): ForwardPass()}
    _publish(pool, 1500.0, _decode(7))
    buffer.observe(pool, 2100.0)
    assert buffer.latest == {(0, 0): _decode(7)}
    buffer.observe(pool, 2500.0)
    assert buffer.latest == {(0, 0): ForwardPass()}


def test_fpms_of_workers_no_longer_active_are_dropped() -> None:
    pool = _pool(AGG, _engine(), 2)
    _publish(pool, 10.0, _decode(1), _decode(2))
    buffer = FpmBuffer()
    buffer.observe(pool, 20.0)
    assert set(buffer.latest) == {(0, 0), (1, 0)}
    pool.states[1] = WorkerState.DRAINING
    buffer.observe(pool, 30.0)
    assert set(buffer.latest) == {(0, 0)}


# ----- the GPU budget -----


def test_single_pool_budget_holds_a_scale_up_at_the_ceiling() -> None:
    assert guard_single(6, 7, 1, -1, 6, 1) == (6, "gpu_budget_guard_hold")
    assert guard_single(2, 4, 2, -1, 6, 1) == (3, None)  # clamped to 6 GPUs, still up
    assert guard_single(3, 2, 1, -1, 6, 1) == (2, None)
    assert clamp_single(9, 1, -1, 6, 1) == 6
    assert clamp_single(1, 4, -1, 3, 1) == 0  # even one worker overshoots


def test_pair_budget_shrinks_in_proportion_and_rebalances_only_both_ways() -> None:
    """10 GPUs asked of 6: prefill keeps floor(5 x 6 / 10) = 3, decode the other 3. At a full
    6-GPU allocation an up alone is held; an opposing move (prefill up, decode down) moves."""
    assert clamp_pair(5, 5, 1, 1, -1, 6, (1, 1)) == (3, 3)
    assert guard_pair((3, 3), (4, 3), (1, 1), -1, 6, (1, 1)) == ((3, 3), "gpu_budget_guard_hold")
    assert guard_pair((3, 3), (4, 2), (1, 1), -1, 6, (1, 1)) == ((4, 2), None)
    assert guard_pair((2, 2), (4, 4), (1, 1), -1, 6, (1, 1)) == ((3, 3), None)
    # Two GPUs a prefill worker: from (2, 1) = 5 GPUs, prefill up to 4 fits only one more.
    assert fit_pair((2, 1), (4, 1), (2, 1), -1, 7, (1, 1)) == (3, 1)


# ----- the sla target -----


FIXED = {"type": "fixed", "prefill_ms": 10, "decode_ms": 5}


def test_sla_engine_arithmetic_on_fixed_timing() -> None:
    """Fixed timing: a 2,500-token prompt takes 3 chunks of 1,000 = 30 ms; a decode step is
    5 ms whatever the batch, so the ITL-feasible batch is the most the KV holds at the mean
    context (prompt plus half the output: 550 tokens) or max_num_seqs, whichever is fewer."""
    engine = parse_engine_args(
        {"block_size": 10, "num_gpu_blocks": 1000, "max_num_batched_tokens": 1000,
         "max_num_seqs": 8, "timing_model": FIXED}
    )  # fmt: skip
    assert sla_prefill_ms(engine, 2500) == 30.0
    assert sla_decode_batch(engine, 500, 100, itl_ms=50.0) == (8, 5.0)  # 10,000 // 550 = 18 > 8
    assert sla_decode_batch(engine, 500, 100, itl_ms=4.0) == (1, 5.0)  # out of reach: one
    small = parse_engine_args({**SMALL, "num_gpu_blocks": 110, "timing_model": FIXED})
    assert sla_decode_batch(small, 500, 100, itl_ms=50.0)[0] == 2  # 1,100 // 550


def _traffic(window: TrafficWindow, arrivals: int, completed: int, isl: int, osl: int) -> None:
    window.arrivals += arrivals
    window.completed += completed
    window.isl_sum += completed * isl
    window.osl_sum += completed * osl


def test_sla_capacity_on_fixed_timing() -> None:
    """A 2,500-token prompt is 30 ms of prefill; for TTFT <= 75 ms the queue may load it to
    rho with 30 + rho 30 / (2 (1 - rho)) = 75, rho = 3/4: 25 prompts/s. Decode at batch 8,
    5 ms a step: 8 / (100 x 5 ms) = 16 requests/s."""
    keys = {"block_size": 10, "num_gpu_blocks": 10000, "max_num_batched_tokens": 1000,
            "max_num_seqs": 8, "timing_model": FIXED}  # fmt: skip
    capacity = sla_capacity(parse_engine_args(keys), 2500, 100, ttft_ms=75.0, itl_ms=50.0)
    assert capacity.prefill_ms == 30.0 and capacity.chunks == 3
    assert math.isclose(capacity.prefill_rps, 25.0, rel_tol=1e-12)
    assert capacity.decode_rps == 16.0
    # Aggregated: 8 requests decoding at once at 50 ms a token: 8 / (100 x 50 ms) = 1.6/s;
    # interleaving (30 ms of prefill is 6 steps, more than its 3 chunks) allows
    # (1/5 ms - 1/50 ms) / (6 - 3) = 60/s: the decode bound holds.
    assert math.isclose(capacity.aggregated_rps, 1.6, rel_tol=1e-12)


def test_sla_disagg_sizes_pools_from_demand() -> None:
    """90 requests/s (900 in a 10 s window) on the engine above: ceil(90 / 25) = 4 prefill and
    ceil(90 / 16) = 6 decode workers. Under a budget of 8 GPUs the 10 asked shrink in
    proportion: prefill floor(4 x 8 / 10) = 3, decode the other 5."""
    keys = {"block_size": 10, "num_gpu_blocks": 10000, "max_num_batched_tokens": 1000,
            "max_num_seqs": 8, "timing_model": FIXED}  # fmt: skip
    pools = {PREFILL: _pool(PREFILL, parse_engine_args(keys, role=Role.PREFILL), 1)}
    pools[DECODE] = _pool(DECODE, parse_engine_args(keys, role=Role.DECODE), 1)
    config = planner_config(
        {"mode": "disagg", "optimization_target": "sla", "ttft_ms": 75, "itl_ms": 50,
         "throughput_adjustment_interval_seconds": 10, "max_gpu_budget": 12}
    )  # fmt: skip
    window = TrafficWindow()
    engines = {stage: pool.workers[0].config for stage, pool in pools.items()}
    planner = Planner(config, engines, window)
    assert planner.initial_tick_ms() == 10000.0
    _traffic(window, 900, 800, 2500, 100)
    assert _tick(planner, pools, 10000.0) == {PREFILL: 4, DECODE: 6}
    tight = Planner(planner_config({**config.as_dict(), "max_gpu_budget": 8}), engines, window)
    _traffic(window, 900, 800, 2500, 100)
    assert _tick(tight, pools, 10000.0) == {PREFILL: 3, DECODE: 5}


def test_sla_predictors() -> None:
    """Windows of 2 s with 13 then 33 arrivals (6.5 and 16.5 requests/s) on an aggregated
    worker that serves 0.2 requests/s (one 550-token context fits its KV: 1 / (100 x 50 ms)).
    The last window alone asks 33 then 83 workers; the mean of the last two, 33 then 58."""
    engine = _engine(timing_model=FIXED, max_num_batched_tokens=1000)
    assert math.isclose(sla_capacity(engine, 500, 100, 500.0, 50.0).aggregated_rps, 0.2)
    sizes: dict[str, list[int]] = {}
    for predictor in ("constant", "moving_average"):
        window = TrafficWindow()
        config = planner_config(
            {"mode": "agg", "optimization_target": "sla", "load_predictor": predictor,
             "load_predictor_window": 2, "throughput_adjustment_interval_seconds": 2,
             "max_gpu_budget": 1000}
        )  # fmt: skip
        planner = Planner(config, {AGG: engine}, window)
        pool = _pool(AGG, engine, 1)
        sizes[predictor] = []
        for k, arrivals in enumerate((13, 33)):
            _traffic(window, arrivals, 10, 500, 100)
            target = _tick(planner, {AGG: pool}, (k + 1) * 2000.0)[AGG]
            pool.scale_to(target, (k + 1) * 2000.0, 0.0)  # ready at once
            sizes[predictor].append(target)
    assert sizes == {"constant": [33, 83], "moving_average": [33, 58]}


# ----- runs -----


def _run_config(**keys: Any) -> RunConfig:
    """Requests of 100 + 50 tokens every 5 ms for 2 s on a worker of 1,024 KV tokens: its queue
    outgrows the KV within the first second."""
    engine = {
        "block_size": 16,
        "num_gpu_blocks": 64,
        "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
    }
    config: dict[str, Any] = {"num_workers": 1, "engine": parse_engine_args(engine)} | keys
    return RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=100, output_tokens=50, request_count=400, arrival_interval_ms=5
        ),
        **config,
    )


def test_a_planner_that_cannot_move_changes_nothing() -> None:
    """A budget of one GPU on one worker: every tick is held, and the run reports exactly what
    it reports without a planner (measuring FPMs and splitting windows at ticks is neutral)."""
    plain = run(_run_config())
    config = planner_config(
        {"mode": "agg", "max_gpu_budget": 1, "load_adjustment_interval_seconds": 1}
    )
    planned = run(_run_config(planner=config, planner_details=True))
    assert "planner" not in plain.sections and "lifecycle_transitions" not in plain.sections
    section = planned.sections["planner"]
    assert section["scaling_events"] == [] and section["total_ticks"] >= 3
    assert any(t["decision"]["reason"] == "gpu_budget_guard_hold" for t in section["ticks"])
    ticks = section["total_ticks"]
    assert f"Planner       throughput target (agg): {ticks} ticks, 0 scale-ups" in planned.table()
    assert "Planner" not in plain.table()
    skip = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    assert {k: v for k, v in plain.summary.items() if k not in skip} == {
        k: v for k, v in planned.summary.items() if k not in skip
    }
    assert [request_row(r) for r in plain.records] == [request_row(r) for r in planned.records]


def test_ticks_see_the_same_passes_with_and_without_fast_forward() -> None:
    """Every tick's FPMs and decision agree when windows fast-forward and when every pass steps."""
    config = planner_config(
        {"mode": "agg", "max_gpu_budget": 4, "load_adjustment_interval_seconds": 1}
    )
    fast = run(_run_config(planner=config, planner_details=True))
    exact = run(_run_config(planner=config, planner_details=True, exact_passes=True))
    assert len(fast.sections["planner"]["scaling_events"]) == 3  # up at 1, 2 and 3 s
    assert fast.sections["planner"] == exact.sections["planner"]
    assert [request_row(r) for r in fast.records] == [request_row(r) for r in exact.records]


# ----- bad input -----


@pytest.mark.parametrize(
    ("keys", "expect"),
    [
        ({"mode": "prefill"}, "'mode' must be one of agg, disagg"),
        ({"optimization_target": "cost"}, "'optimization_target' must be one of"),
        ({"load_adjustment_interval_seconds": 0}, "'load_adjustment_interval_seconds' must be at least 1"),
        ({"load_adjustment_interval_seconds": -5}, "'load_adjustment_interval_seconds'"),
        ({"max_gpu_budget": "8"}, "'max_gpu_budget' must be an integer"),
        ({"optimization_target": "load"}, "needs 'decode_scale_up_kv_rate'"),
        ({"optimization_target": "sla", "load_predictor": "arima"}, "'load_predictor' must be one of"),
        ({"decode_scale_up_kv_rate": 120}, "'decode_scale_up_kv_rate' must be between 0 and 100"),
    ],
)  # fmt: skip
def test_bad_planner_keys_are_named(keys: dict[str, Any], expect: str) -> None:
    with pytest.raises(ConfigError, match=expect.replace("(", r"\(")):
        planner_config({"mode": "agg", **keys})


def _replay(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    argv = [
        "replay", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "3", "--arrival-interval-ms", "10",
        "--report-json", str(tmp_path / "report.json"), *args,
    ]  # fmt: skip
    code, _, err = run_cli(capsys, *argv)
    return code, err


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--planner-config", '{"mode": "disagg"}'], "'mode' is 'disagg' but the run is aggregated"),
        (["--planner-config", '{"mode": "agg", "optimization_target": "fast"}'], "'optimization_target'"),
        (["--planner-config", '{"mode": "agg", "load_adjustment_interval_seconds": 0}'], "'load_adjustment_interval_seconds'"),
        (["--planner-config", '{"mode": "agg", "max_gpu_budget": 1}', "--extra-engine-args", '{"tensor_parallel_size": 2}'], "'max_gpu_budget' 1 is below the minimum footprint of 2 GPUs"),
        (["--planner-config", "{mode: agg}"], "--planner-config: not JSON"),
        (["--planner-config", "@/nonexistent/planner.json"], "cannot read planner config"),
        (["--planner-details"], "--planner-details needs --planner-config"),
        (["--telemetry-interval-ms", "0"], "--telemetry-interval-ms"),
        (["--telemetry-interval-ms", "-1"], "--telemetry-interval-ms"),
    ],
)  # fmt: skip
def test_bad_planner_input_exits_2_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expect: str
) -> None:
    code, err = _replay(tmp_path, capsys, *args)
    assert code == 2, err
    assert "Traceback" not in err
    assert expect in err, err
    assert not (tmp_path / "report.json").exists()


def test_planner_config_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "planner.json"
    path.write_text(json.dumps({"mode": "agg", "max_gpu_budget": 3, "namespace": "prod"}))
    code = main(["replay", "--input-tokens", "100", "--output-tokens", "5", "--request-count", "3", "--arrival-interval-ms", "10", "--arrival-interval-ms", "10",
                 "--planner-config", f"@{path}", "--report-json", str(tmp_path / "r.json"), "--quiet"])  # fmt: skip
    assert code == 0
    section = json.loads((tmp_path / "r.json").read_text())["planner"]
    assert section["metadata"]["planner_config"]["max_gpu_budget"] == 3
    assert section["metadata"]["mode"] == "agg"


def test_default_config_is_the_references() -> None:
    config = PlannerConfig()
    assert (config.mode, config.optimization_target) == ("disagg", "throughput")
    assert (config.load_adjustment_interval_seconds, config.max_gpu_budget) == (5, 8)
    assert (config.min_endpoint, config.min_gpu_budget) == (1, -1)


def test_telemetry_does_not_change_what_the_planner_sees() -> None:
    """Samples every 300 ms (some at tick times) leave every tick's input and decision, and
    every request, as they are without telemetry."""
    config = planner_config(
        {"mode": "agg", "max_gpu_budget": 4, "load_adjustment_interval_seconds": 1}
    )
    plain = run(_run_config(planner=config, planner_details=True))
    sampled = run(_run_config(planner=config, planner_details=True, telemetry_interval_ms=300.0))
    assert plain.sections["planner"] == sampled.sections["planner"]
    assert [request_row(r) for r in plain.records] == [request_row(r) for r in sampled.records]


def test_sglang_with_a_planner_is_refused() -> None:
    engine = parse_engine_args({"backend": "sglang", "block_size": 16})
    with pytest.raises(ConfigError, match="SGLang"):
        run(_run_config(planner=planner_config({"mode": "agg"}), engine=engine))


@settings(max_examples=20, deadline=None)
@given(
    target=st.sampled_from(["throughput", "latency", "load"]),
    interval=st.integers(1, 2),
    budget=st.integers(1, 5),
    startup_s=st.sampled_from([0.0, 0.3, 1.5]),
    router=st.sampled_from(["round_robin", "kv_router"]),
    dp_size=st.sampled_from([1, 2]),
)
def test_planner_gpu_hours_are_the_integral_of_worker_counts(
    target: str, interval: int, budget: int, startup_s: float, router: str, dp_size: int
) -> None:
    """Random planner configs on an overloaded worker: worker-seconds equal the integral of
    the paid workers (starting, active, draining) over the run, GPU-hours follow, every
    request completes, and none was placed on a worker that was not active."""
    keys: dict[str, Any] = {
        "mode": "agg",
        "optimization_target": target,
        "load_adjustment_interval_seconds": interval,
        "max_gpu_budget": budget * dp_size,
    }
    if target == "load":
        keys |= {"decode_scale_up_kv_rate": 50, "decode_scale_down_kv_rate": 20}
    engine = {
        "block_size": 16,
        "num_gpu_blocks": 64,
        "dp_size": dp_size,
        "startup_time": startup_s,
        "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
    }
    report = run(
        _run_config(
            planner=planner_config(keys), engine=parse_engine_args(engine), router_mode=router
        )
    )
    transitions = report.sections["lifecycle_transitions"]
    seconds = report.summary["decode_worker_seconds"]
    assert math.isclose(
        seconds, paid_worker_seconds(transitions, 1, report.summary["duration_ms"]), rel_tol=1e-9
    )
    assert math.isclose(report.summary["gpu_hours"], seconds * dp_size / 3600.0, rel_tol=1e-12)
    assert report.summary["completed_requests"] == 400
    for r in report.records:
        assert state_at(transitions, r.worker, r.arrival_time_ms, 1) == "active"


def test_an_unknown_planner_key_is_refused_with_the_closest_known_one() -> None:
    """A typo must not leave a default silently in force; the reference's deployment keys pass."""
    with pytest.raises(
        ConfigError, match=r"unknown key 'decode_scale_up_kv_rat'.*'decode_scale_up_kv_rate'"
    ):
        planner_config({"mode": "agg", "decode_scale_up_kv_rat": 0.5})
    assert planner_config({"mode": "agg", "namespace": "prod"}) == planner_config({"mode": "agg"})
