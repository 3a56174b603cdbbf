"""``servesim replay ...``: flags mirror the reference CLI (``python -m dynamo.replay``).

Exit codes: 0 success, 2 bad usage or input, 1 a simulation that cannot finish.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from servesim.config import (
    EngineConfig,
    Role,
    RouterConfig,
    load_json_argument,
    parse_engine_args,
    parse_router_config,
)
from servesim.errors import ConfigError, ServesimError
from servesim.metrics.report import render_table, write_report_json, write_requests_jsonl
from servesim.metrics.summary import Sla
from servesim.simulation import RunConfig, SyntheticWorkload, count_requests, run


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"servesim: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _integer(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``, described as ``what``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


_seed = _integer(0, "a non-negative integer")
_positive_int = _integer(1, "an integer >= 1")


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite non-negative number, got {text}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``servesim`` argument parser."""
    parser = _Parser(prog="servesim", description="Simulate LLM inference serving in virtual time.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("replay", help="replay a trace or synthetic workload on a simulated cluster")
    w = p.add_argument_group("workload")
    w.add_argument(
        "trace_files", nargs="*", type=Path, metavar="TRACE", help="Mooncake JSONL trace"
    )
    w.add_argument(
        "--trace-block-size", type=_positive_int, default=512, help="tokens per hash id (512)"
    )
    w.add_argument(
        "--arrival-speedup-ratio",
        type=_positive,
        default=1.0,
        help="divide arrival times and session delays by this (open-loop replay; ignored in closed loop)",
    )
    w.add_argument(
        "--replay-concurrency", type=_positive_int, help="closed loop: at most N sessions in flight"
    )
    w.add_argument("--input-tokens", type=_positive_int, help="synthetic prompt length")
    w.add_argument("--output-tokens", type=_positive_int, help="synthetic output length")
    w.add_argument("--request-count", type=_positive_int, help="synthetic request count")
    w.add_argument(
        "--arrival-interval-ms", type=_non_negative, help="synthetic fixed arrival gap (0 = burst)"
    )
    w.add_argument(
        "--request-rate", type=_positive, help="synthetic Poisson arrivals, requests per second"
    )
    w.add_argument("--seed", type=_seed, default=42, help="seed of every random choice (42)")
    w.add_argument(
        "--arrival-seed",
        type=_seed,
        help="seed of the synthetic Poisson arrivals alone (default: --seed)",
    )
    c = p.add_argument_group("cluster")
    c.add_argument("--num-workers", type=_positive_int, help="aggregated workers (1)")
    c.add_argument(
        "--num-prefill-workers", type=_positive_int, help="disaggregated: prefill workers (1)"
    )
    c.add_argument(
        "--num-decode-workers", type=_positive_int, help="disaggregated: decode workers (1)"
    )
    c.add_argument(
        "--prefill-engine-args",
        metavar="JSON",
        help="disaggregated: prefill engine keys (JSON or @file)",
    )
    c.add_argument(
        "--decode-engine-args",
        metavar="JSON",
        help="disaggregated: decode engine keys (JSON or @file)",
    )
    c.add_argument("--router-mode", choices=["round_robin", "kv_router"], default="round_robin")
    c.add_argument(
        "--session-affinity",
        choices=["disabled", "local", "modulo", "hrw"],
        default="disabled",
        help="KV router: keep a session's turns on one worker (simulation-only modes of the reference)",
    )
    c.add_argument(
        "--router-config",
        metavar="JSON",
        help="KV router settings (KvRouterConfig keys) as JSON or @file",
    )
    c.add_argument(
        "--kv-event-lag-ms",
        type=_non_negative,
        default=0.0,
        help="KV router only: engines' KV events reach the router's index this much later (0)",
    )
    c.add_argument(
        "--extra-engine-args", metavar="JSON", help="engine keys as inline JSON or @file"
    )
    c.add_argument(
        "--exact-passes",
        action="store_true",
        help="step every engine pass as its own event (no decode fast-forward; same results, slower)",
    )
    o = p.add_argument_group("report")
    o.add_argument("--sla-ttft-ms", type=_non_negative, help="goodput bound on TTFT")
    o.add_argument(
        "--sla-itl-ms", type=_non_negative, help="goodput bound on mean inter-token latency"
    )
    o.add_argument("--sla-e2e-ms", type=_non_negative, help="goodput bound on end-to-end latency")
    o.add_argument(
        "--max-sim-time-seconds",
        type=_non_negative,
        help="stop when the simulated clock would pass this; unfinished requests are incomplete",
    )
    o.add_argument("--report-json", type=Path, help='write {"summary": ...} here')
    o.add_argument("--per-request-jsonl", type=Path, help="write one record per request here")
    o.add_argument("--quiet", action="store_true", help="print no table")
    return parser


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RunConfig:
    """Turn parsed flags into a :class:`RunConfig`, rejecting conflicting workload flags."""
    synthetic_flags = [args.input_tokens, args.output_tokens, args.request_count]
    synthetic = None
    trace = None
    if args.trace_files:
        if any(v is not None for v in synthetic_flags):
            parser.error(
                "give either a trace file or --input-tokens/--output-tokens/--request-count, not both"
            )
        if args.arrival_interval_ms is not None or args.request_rate is not None:
            parser.error("--request-rate and --arrival-interval-ms only apply to synthetic replay")
        if len(args.trace_files) != 1:
            parser.error(f"exactly one trace file is supported, got {len(args.trace_files)}")
        trace = args.trace_files[0]
        if not trace.is_file():
            parser.error(f"trace file not found: {trace}")
    else:
        names = ("--input-tokens", "--output-tokens", "--request-count")
        missing = [n for n, v in zip(names, synthetic_flags, strict=True) if v is None]
        if missing:
            parser.error(
                f"synthetic replay is missing {', '.join(missing)} (or give a trace file instead)"
            )
        controllers = [args.replay_concurrency, args.arrival_interval_ms, args.request_rate]
        if sum(v is not None for v in controllers) > 1:
            parser.error(
                "synthetic replay takes at most one of --replay-concurrency, --request-rate, "
                "--arrival-interval-ms"
            )
        synthetic = SyntheticWorkload(
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            request_count=args.request_count,
            arrival_interval_ms=args.arrival_interval_ms,
            request_rate=args.request_rate,
            arrival_seed=args.arrival_seed,
        )
    engines = _engines(args, parser)
    return RunConfig(
        trace=trace,
        synthetic=synthetic,
        trace_block_size=args.trace_block_size,
        arrival_speedup_ratio=args.arrival_speedup_ratio,
        replay_concurrency=args.replay_concurrency,
        num_workers=args.num_workers or 1,
        num_prefill_workers=args.num_prefill_workers or 1,
        num_decode_workers=args.num_decode_workers or 1,
        router_mode=args.router_mode,
        router=_router(args, parser),
        session_affinity=args.session_affinity,
        kv_event_lag_ms=args.kv_event_lag_ms,
        **engines,
        sla=Sla(ttft_ms=args.sla_ttft_ms, itl_ms=args.sla_itl_ms, e2e_ms=args.sla_e2e_ms),
        max_sim_time_ms=None
        if args.max_sim_time_seconds is None
        else args.max_sim_time_seconds * 1000.0,
        seed=args.seed,
        exact_passes=args.exact_passes,
    )


def _router(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RouterConfig:
    if args.router_config is None:
        return RouterConfig()
    if args.router_mode != "kv_router":
        parser.error("--router-config applies to --router-mode kv_router")
    return parse_router_config(load_json_argument(args.router_config, flag="--router-config"))


def _engine_raw(text: str | None, flag: str) -> dict[str, Any]:
    raw = {} if text is None else load_json_argument(text, flag=flag)
    if not isinstance(raw, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {type(raw).__name__}")
    return raw


def _engines(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, EngineConfig]:
    """The engine configs of an aggregated or a disaggregated run, from the flags that chose it."""
    disagg_flags = [
        args.num_prefill_workers,
        args.num_decode_workers,
        args.prefill_engine_args,
        args.decode_engine_args,
    ]
    if not any(v is not None for v in disagg_flags):
        return {
            "engine": parse_engine_args(
                _engine_raw(args.extra_engine_args, "--extra-engine-args"),
                source="--extra-engine-args",
            )
        }
    if args.num_workers is not None or args.extra_engine_args is not None:
        parser.error(
            "--num-workers/--extra-engine-args are for aggregated runs; a disaggregated run takes "
            "--num-prefill-workers, --num-decode-workers, --prefill-engine-args and --decode-engine-args"
        )
    prefill = _engine_raw(args.prefill_engine_args, "--prefill-engine-args")
    decode = _engine_raw(args.decode_engine_args, "--decode-engine-args")
    backends = [
        str(raw.get("backend", raw.get("engine_type", "vllm"))).lower() for raw in (prefill, decode)
    ]
    if backends[0] != backends[1]:
        raise ConfigError(
            f"prefill and decode pools must use the same backend, got '{backends[0]}' (--prefill-engine-args) "
            f"and '{backends[1]}' (--decode-engine-args)"
        )
    return {
        "prefill_engine": parse_engine_args(
            prefill, source="--prefill-engine-args", role=Role.PREFILL
        ),
        "decode_engine": parse_engine_args(decode, source="--decode-engine-args", role=Role.DECODE),
    }


def _progress_bar(total: int | None) -> Callable[[int], None] | None:
    """A stderr progress bar that appears once a run has taken two seconds (terminals only)."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()
    last = [0.0]

    def update(done: int) -> None:
        now = time.monotonic()
        if now - started < 2.0 or now - last[0] < 0.2:
            return
        last[0] = now
        if total:
            filled = int(30 * done / total)
            bar = "#" * filled + "-" * (30 - filled)
            sys.stderr.write(f"\r[{bar}] {done}/{total} requests")
        else:
            sys.stderr.write(f"\r{done} requests finished")
        sys.stderr.flush()

    return update


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # As the reference: an existing directory gets the report inside it.
    if args.report_json is not None and args.report_json.is_dir():
        args.report_json = args.report_json / "servesim_report.json"
    if args.per_request_jsonl is not None and args.per_request_jsonl.is_dir():
        args.per_request_jsonl = args.per_request_jsonl / "servesim_requests.jsonl"
    try:
        config = config_from_args(args, parser)
        progress = None if args.quiet else _progress_bar(count_requests(config))
        report = run(config, progress=progress)
        if progress is not None:
            sys.stderr.write("\r\033[K")
        if args.report_json is not None:
            write_report_json(args.report_json, report.summary)
        if args.per_request_jsonl is not None:
            write_requests_jsonl(args.per_request_jsonl, report.records)
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a report path that cannot be written
        print(f"servesim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(render_table(report.summary))
        if report.time_limited:
            print(
                "Stopped at --max-sim-time-seconds: unfinished requests are reported as incomplete."
            )
        if args.report_json is not None:
            print(f"Saved full report to: {args.report_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
