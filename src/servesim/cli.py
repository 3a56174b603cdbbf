"""``servesim replay ...``: flags mirror the reference CLI (``python -m dynamo.replay``);
``servesim keys`` lists the engine and router keys.

Exit codes: 0 success, 2 bad usage or input, 1 a simulation that cannot finish,
130 interrupted (Ctrl-C). Every error is one line, ``servesim: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import servesim
from servesim.config import (
    EngineConfig,
    KeyInfo,
    Role,
    RouterConfig,
    engine_keys,
    load_json_argument,
    parse_engine_args,
    parse_router_config,
    router_keys,
)
from servesim.errors import ConfigError, ServesimError
from servesim.metrics.report import read_report_json, write_lines, write_samples_jsonl
from servesim.metrics.summary import Sla
from servesim.presets import PRESETS
from servesim.simulation import RunConfig, SyntheticWorkload, run
from servesim.workload.formats import CSV_FORMATS, FORMATS, TraceOptions, canonical_format
from servesim.workload.mooncake import STDIN

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the epilog's line breaks and shows each option's default.

    A default of None or False means "not given" and is not shown; help that
    already names its default (``(default: 1)``) is left as it is.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and default is not None
            and default is not False
            and default is not argparse.SUPPRESS
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """A parser that takes no abbreviations and reports a usage error on one line, with a
    suggestion when one is close, then a one-line hint; exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = re.findall(r"'([^']*)'", match["choices"])
            message += _did_you_mean(match["given"], choices, quote="'")
        print(f"servesim: error: {message}", file=sys.stderr)
        print(f"try '{self.prog} --help'", file=sys.stderr)
        raise SystemExit(2)

    def reject_unknown(self, extras: list[str]) -> NoReturn:
        """Refuse arguments the parser did not recognise, suggesting the closest option."""
        known = [s for s in self._option_string_actions if s.startswith("--")]
        suggestion = ""
        for arg in extras:
            if arg.startswith("--"):
                suggestion = _did_you_mean(arg.split("=", 1)[0], known)
                if suggestion:
                    break
        self.error(f"unrecognized arguments: {' '.join(extras)}{suggestion}")


def _did_you_mean(given: str, choices: Sequence[str], quote: str = "") -> str:
    import difflib  # (only a mistyped choice needs it)

    close = difflib.get_close_matches(given, choices, n=1)
    return f"; did you mean {quote}{close[0]}{quote}?" if close else ""


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


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1, got {text}")
    return value


_EXAMPLES = """\
examples:
  servesim replay examples/mooncake_conversation_200.jsonl --num-workers 4
  servesim replay trace.jsonl.gz --num-workers 8 --router-mode kv_router --report-json report.json
  servesim replay --input-tokens 2000 --output-tokens 300 --request-count 1000 \\
      --request-rate 20 --num-workers 4 --sla-ttft-ms 500 --sla-itl-ms 40 --html run.html
  servesim report report.json --html report.html

'servesim keys' lists every engine and router key with its default.
"""


def build_parser() -> _Parser:
    """The ``servesim`` argument parser."""
    parser = _Parser(
        prog="servesim",
        description="Simulate LLM inference serving in virtual time.",
        epilog=_EXAMPLES,
    )
    parser.add_argument("--version", action="version", version=f"servesim {servesim.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser(
        "replay",
        help="replay a trace or synthetic workload on a simulated cluster",
        description="Replay a Mooncake trace or a synthetic workload on a simulated cluster\n"
        "and report what users would see.",
        epilog=_EXAMPLES,
    )
    keys = sub.add_parser(
        "keys",
        help="list every engine and router key, with its default and meaning",
        description="List every key --extra-engine-args (and the P/D engine flags) and\n"
        "--router-config accept, with its default and meaning.",
    )
    report = sub.add_parser(
        "report",
        help="print a saved report (servesim replay --report-json) and write its HTML page",
        description="Print the report a 'servesim replay --report-json' run saved, and with\n"
        "--html write its self-contained HTML page.",
        epilog="example:\n  servesim report report.json --html report.html\n",
    )
    report.add_argument("report_file", type=Path, metavar="REPORT", help="a report JSON file")
    report.add_argument(
        "--html", metavar="PATH", type=Path, help="write the report's HTML page here"
    )
    report.add_argument("--quiet", action="store_true", help="print nothing")
    timing = sub.add_parser(
        "timing",
        help="list the timing presets and the AIC systems, backends and models",
        description='List the measured timing presets ({"profile": name}) and, with the\n'
        "aic extra installed, the systems, backends (versions) and models AIC timing covers.",
    )
    timing.add_argument("action", choices=["list"], help="what to do: list")
    p.set_defaults(command_parser=p)
    keys.set_defaults(command_parser=keys)
    report.set_defaults(command_parser=report)
    timing.set_defaults(command_parser=timing)
    add_replay_arguments(p)
    _add_trace_commands(sub)
    _add_planning_commands(sub)
    return parser


_SWEEP_EXAMPLES = """\
examples:
  servesim sweep examples/sweep.yaml
  servesim sweep examples/sweep.yaml --jobs 2 --out results/
  servesim sweep examples/sweep.yaml --ray                 # a local Ray instance
  servesim sweep examples/sweep.yaml --ray 10.0.0.5:6379   # an existing Ray cluster

docs/capacity-planning.md describes sweep files.
"""

_SEARCH_EXAMPLES = """\
examples:
  servesim search examples/search.yaml
  servesim search examples/search.yaml --jobs 2 --json search.json

docs/capacity-planning.md describes search files.
"""


def _add_planning_commands(sub: Any) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="replay every point of a sweep file (in parallel, resumable); write a table",
        description="Replay every point of a sweep file (YAML or JSON) on local processes or\n"
        "Ray, and write one row per point to results.csv and results.parquet. A rerun\n"
        "skips the points already done (results.jsonl in the output directory).",
        epilog=_SWEEP_EXAMPLES,
    )
    search = sub.add_parser(
        "search",
        help="find the deployment with the fewest GPUs that meets an SLA",
        description="Find, over a search file's space (aggregated worker counts, P/D splits,\n"
        "routers, TP/DP), the deployment with the fewest GPUs (or GPU-hours) whose\n"
        "replay meets the SLA percentiles and goodput target, bisecting on worker counts.",
        epilog=_SEARCH_EXAMPLES,
    )
    for p, what in ((sweep, "sweep"), (search, "search")):
        p.set_defaults(command_parser=p)
        p.add_argument("spec", type=Path, metavar="SPEC", help=f"the {what} file (YAML or JSON)")
        p.add_argument(
            "--jobs",
            metavar="N",
            type=_positive_int,
            help=f"local worker processes (default: the cores, {os.cpu_count() or 1})",
        )
        p.add_argument(
            "--ray",
            metavar="ADDRESS",
            nargs="?",
            const=True,
            help="run the points as Ray tasks: on the cluster at ADDRESS, or without one on a "
            "local Ray instance (needs servesim[ray])",
        )
        p.add_argument("--quiet", action="store_true", help="print no progress and no table")
    sweep.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="results directory (default: the file's 'output', or SPEC's name + .sweep)",
    )
    sweep.add_argument(
        "--retry-failed", action="store_true", help="run again the points recorded as failed"
    )
    search.add_argument(
        "--json", metavar="PATH", type=Path, help="write the search result (every point) as JSON"
    )


_TRACE_EXAMPLES = """\
examples:
  servesim trace stats examples/mooncake_conversation_200.jsonl
  servesim trace stats shard0.jsonl.gz shard1.jsonl.gz --trace-format dynamo --json
  servesim trace convert delta.jsonl --from mooncake-delta -o full.jsonl
  servesim trace convert AzureLLMInferenceTrace_conv.csv --from azure -o azure.jsonl
  servesim trace convert BurstGPT_1.csv --from burstgpt -o burstgpt.jsonl
"""


def _add_trace_commands(sub: Any) -> None:
    trace = sub.add_parser(
        "trace",
        help="describe a trace, or convert one to Mooncake JSONL",
        description="Describe a trace, or convert one to Mooncake JSONL.",
        epilog=_TRACE_EXAMPLES,
    )
    trace.set_defaults(command_parser=trace)
    tsub = trace.add_subparsers(dest="trace_command", required=True, parser_class=_Parser)
    stats = tsub.add_parser(
        "stats",
        help="requests, sessions, length percentiles, reuse potential, arrival rate",
        description="Requests, sessions, input/output length percentiles, reuse potential\n"
        "(the share of prompt tokens an unbounded prefix cache could serve) and\n"
        "arrival rate over time, of a trace in any format servesim replays.",
        epilog=_TRACE_EXAMPLES,
    )
    stats.set_defaults(command_parser=stats)
    stats.add_argument("trace_files", nargs="+", type=Path, metavar="TRACE", help="trace file(s)")
    _add_trace_reading(stats, "--trace-format", "the trace's format")
    stats.add_argument(
        "--reuse-block-size",
        metavar="N",
        type=_positive_int,
        help="block size of the reuse estimate (default: the trace block size)",
    )
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    convert = tsub.add_parser(
        "convert",
        help="convert a trace (a servesim format, Azure or BurstGPT CSV) to Mooncake JSONL",
        description="Convert a trace to Mooncake JSONL: from a format servesim replays\n"
        "(each request with its whole prompt), or from the Azure LLM inference or\n"
        "BurstGPT CSV traces (lengths only: new hash ids, no prefix sharing).",
        epilog=_TRACE_EXAMPLES,
    )
    convert.set_defaults(command_parser=convert)
    convert.add_argument("trace_files", nargs="+", type=Path, metavar="TRACE", help="input file(s)")
    _add_trace_reading(
        convert, "--from", f"input format: {', '.join((*FORMATS, *CSV_FORMATS))}", csv=True
    )
    convert.add_argument("--to", choices=["mooncake"], default="mooncake", help="output format")
    convert.add_argument(
        "-o", "--output", metavar="FILE", type=Path, required=True, help="output file (- = stdout)"
    )


def _add_trace_reading(
    p: argparse.ArgumentParser, flag: str, help_text: str, *, csv: bool = False
) -> None:
    p.add_argument(
        flag,
        dest="trace_format",
        metavar="FORMAT",
        type=_source_format if csv else _trace_format,
        default="mooncake",
        help=help_text,
    )
    p.add_argument(
        "--trace-block-size",
        metavar="N",
        type=_positive_int,
        help="tokens per hash id (default 512; dynamo and agentic_mooncake traces carry their own)",
    )
    p.add_argument(
        "--trace-shared-prefix-ratio",
        metavar="R",
        type=_fraction,
        default=0.0,
        help="applied_compute_agentic: shared prefix fraction",
    )
    p.add_argument(
        "--trace-num-prefix-groups",
        metavar="N",
        type=_integer(0, "a non-negative integer"),
        default=0,
        help="applied_compute_agentic: prefix groups",
    )


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    """The replay's flags (``servesim replay`` and the settings of :mod:`servesim.settings`)."""
    w = p.add_argument_group("workload")
    w.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="replay the configuration a report recorded (its provenance section), or a "
        "settings object (JSON or YAML; docs/capacity-planning.md); no other workload, "
        "cluster, engine or router flag with it",
    )
    w.add_argument(
        "trace_files",
        nargs="*",
        type=Path,
        metavar="TRACE",
        help="trace file, gzip-compressed or not (several shards for --trace-format dynamo); "
        "- reads it from stdin",
    )
    w.add_argument(
        "--trace-format",
        metavar="FORMAT",
        type=_trace_format,
        default="mooncake",
        help=f"trace format: {', '.join(FORMATS)}",
    )
    w.add_argument(
        "--trace-block-size",
        metavar="N",
        type=_positive_int,
        help="tokens per hash id (default 512; dynamo and agentic_mooncake traces carry their own)",
    )
    w.add_argument(
        "--trace-shared-prefix-ratio",
        metavar="R",
        type=_fraction,
        help="applied_compute_agentic: fraction of each session's first prompt shared in its group",
    )
    w.add_argument(
        "--trace-num-prefix-groups",
        metavar="N",
        type=_integer(0, "a non-negative integer"),
        help="applied_compute_agentic: prefix groups (line i is in group i mod N; 0 = none)",
    )
    w.add_argument(
        "--execution-model",
        metavar="NAME",
        help="agentic traces: the model every request runs on (required for them)",
    )
    w.add_argument(
        "--agentic-lanes",
        metavar="N",
        type=_positive_int,
        help="agentic traces: keep N plays in flight, taken in play_id order",
    )
    w.add_argument(
        "--arrival-speedup-ratio",
        metavar="X",
        type=_positive,
        default=1.0,
        help="divide arrival times and session delays by this (open-loop replay; ignored in closed loop)",
    )
    w.add_argument(
        "--replay-concurrency",
        metavar="N",
        type=_positive_int,
        help="closed loop: at most N sessions in flight",
    )
    w.add_argument(
        "--input-tokens", metavar="N", type=_positive_int, help="synthetic prompt length"
    )
    w.add_argument(
        "--output-tokens", metavar="N", type=_positive_int, help="synthetic output length"
    )
    w.add_argument(
        "--request-count", metavar="N", type=_positive_int, help="synthetic request count"
    )
    w.add_argument(
        "--arrival-interval-ms",
        metavar="MS",
        type=_non_negative,
        help="synthetic fixed arrival gap (0 = burst)",
    )
    w.add_argument(
        "--request-rate",
        metavar="RPS",
        type=_positive,
        help="synthetic Poisson arrivals, requests per second",
    )
    w.add_argument(
        "--seed", metavar="N", type=_seed, default=42, help="seed of every random choice"
    )
    w.add_argument(
        "--arrival-seed",
        metavar="N",
        type=_seed,
        help="seed of the synthetic Poisson arrivals alone (default: --seed)",
    )
    w.add_argument(
        "--turns-per-session",
        metavar="N",
        type=_positive_int,
        help="synthetic sessions of N turns; --request-count counts sessions (default: 1)",
    )
    w.add_argument(
        "--inter-turn-delay-ms",
        metavar="MS",
        type=_non_negative,
        help="synthetic think time from a turn's completion to the next turn (default: 0)",
    )
    w.add_argument(
        "--shared-prefix-ratio",
        metavar="X",
        type=_fraction,
        help="synthetic: share of each prompt's blocks that is its session's group prefix (default: 0)",
    )
    w.add_argument(
        "--num-prefix-groups",
        metavar="N",
        type=_seed,
        help="synthetic: prefix groups the sessions are drawn into (default: 0, no sharing)",
    )
    c = p.add_argument_group("cluster")
    c.add_argument(
        "--num-workers", metavar="N", type=_positive_int, help="aggregated workers (default: 1)"
    )
    c.add_argument(
        "--num-prefill-workers",
        metavar="N",
        type=_positive_int,
        help="disaggregated: prefill workers (default: 1)",
    )
    c.add_argument(
        "--num-decode-workers",
        metavar="N",
        type=_positive_int,
        help="disaggregated: decode workers (default: 1)",
    )
    e = p.add_argument_group(
        "engine", "Engine keys as inline JSON or @file; 'servesim keys' lists them."
    )
    e.add_argument(
        "--extra-engine-args", metavar="JSON", help="aggregated: every worker's engine keys"
    )
    e.add_argument(
        "--prefill-engine-args", metavar="JSON", help="disaggregated: prefill engine keys"
    )
    e.add_argument("--decode-engine-args", metavar="JSON", help="disaggregated: decode engine keys")
    e.add_argument(
        "--exact-passes",
        action="store_true",
        help="step every engine pass as its own event (no decode fast-forward; same results, slower)",
    )
    r = p.add_argument_group("router")
    r.add_argument(
        "--router-mode",
        choices=["round_robin", "kv_router"],
        default="round_robin",
        help="how requests are placed on workers",
    )
    r.add_argument(
        "--session-affinity",
        choices=["disabled", "local", "modulo", "hrw"],
        default="disabled",
        help="KV router: keep a session's turns on one worker (simulation-only modes of the reference)",
    )
    r.add_argument(
        "--router-config",
        metavar="JSON",
        help="KV router keys (the reference's KvRouterConfig) as JSON or @file; 'servesim keys' lists them",
    )
    r.add_argument(
        "--kv-event-lag-ms",
        metavar="MS",
        type=_non_negative,
        default=0.0,
        help="KV router only: engines' KV events reach the router's index this much later",
    )
    g = p.add_argument_group("goodput and limits")
    g.add_argument("--sla-ttft-ms", metavar="MS", type=_non_negative, help="goodput bound on TTFT")
    g.add_argument(
        "--sla-itl-ms",
        metavar="MS",
        type=_non_negative,
        help="goodput bound on mean inter-token latency",
    )
    g.add_argument(
        "--sla-e2e-ms", metavar="MS", type=_non_negative, help="goodput bound on end-to-end latency"
    )
    g.add_argument(
        "--max-sim-time-seconds",
        metavar="S",
        type=_non_negative,
        help="stop when the simulated clock would pass this; unfinished requests are incomplete",
    )
    o = p.add_argument_group("output", "Report files are checked before the run and written whole.")
    o.add_argument(
        "--report-json",
        metavar="PATH",
        type=Path,
        help='write {"summary": ...} here (a directory: inside it)',
    )
    o.add_argument(
        "--per-request-jsonl",
        metavar="PATH",
        type=Path,
        help="write one record per request here (a directory: inside it)",
    )
    o.add_argument(
        "--html",
        metavar="PATH",
        type=Path,
        help="write a self-contained HTML page with the run's charts here",
    )
    o.add_argument(
        "--telemetry-interval-ms",
        metavar="MS",
        type=_positive,
        help="sample traffic and every worker's scheduler this often (virtual ms) into the "
        "report's telemetry section",
    )
    o.add_argument(
        "--telemetry-jsonl",
        metavar="PATH",
        type=Path,
        help="write the telemetry samples here, one a line (needs --telemetry-interval-ms)",
    )
    o.add_argument(
        "--planner-config",
        metavar="JSON",
        help="run the planner in the loop with these PlannerConfig keys (inline JSON, or @FILE): "
        "mode agg|disagg, optimization_target throughput|latency|load|sla, "
        "load_adjustment_interval_seconds, max_gpu_budget, min_endpoint, ... (docs/planner.md)",
    )
    o.add_argument(
        "--planner-details",
        action="store_true",
        help="list every planner tick's input and decision in the report's planner section",
    )
    o.add_argument("--quiet", action="store_true", help="print no report and no progress")


# Synthetic workload flags a trace replay refuses: (flag, argparse dest).
_SYNTHETIC_ONLY = (
    ("--request-rate", "request_rate"),
    ("--arrival-interval-ms", "arrival_interval_ms"),
    ("--turns-per-session", "turns_per_session"),
    ("--inter-turn-delay-ms", "inter_turn_delay_ms"),
    ("--shared-prefix-ratio", "shared_prefix_ratio"),
    ("--num-prefix-groups", "num_prefix_groups"),
)


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
        given = [flag for flag, dest in _SYNTHETIC_ONLY if getattr(args, dest) is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            parser.error(f"{', '.join(given)} only {verb} to synthetic replay")
        if args.trace_format != "dynamo" and len(args.trace_files) != 1:
            parser.error(
                f"--trace-format={args.trace_format} requires exactly one trace file, "
                f"got {len(args.trace_files)}"
            )
        trace = args.trace_files[0]
        for path in args.trace_files:
            if path == STDIN:
                if sys.stdin.isatty():
                    parser.error(
                        "the trace is to be read from stdin ('-'), but stdin is a terminal"
                    )
            elif not path.is_file():
                parser.error(f"trace file not found: {path}")
        _check_trace_flags(args, parser)
    else:
        names = ("--input-tokens", "--output-tokens", "--request-count")
        missing = [n for n, v in zip(names, synthetic_flags, strict=True) if v is None]
        if missing:
            parser.error(
                f"synthetic replay is missing {', '.join(missing)} (or give a trace file instead)"
            )
        paces = [
            flag
            for flag, value in (
                ("--replay-concurrency", args.replay_concurrency),
                ("--request-rate", args.request_rate),
                ("--arrival-interval-ms", args.arrival_interval_ms),
            )
            if value is not None
        ]
        if len(paces) != 1:
            parser.error(
                "synthetic replay needs exactly one of --replay-concurrency, --request-rate and "
                f"--arrival-interval-ms, got {' and '.join(paces) if paces else 'none'}"
            )
        sessions = {
            dest: getattr(args, dest)
            for dest in (
                "turns_per_session",
                "inter_turn_delay_ms",
                "shared_prefix_ratio",
                "num_prefix_groups",
            )
            if getattr(args, dest) is not None
        }
        synthetic = SyntheticWorkload(
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            request_count=args.request_count,
            arrival_interval_ms=args.arrival_interval_ms,
            request_rate=args.request_rate,
            arrival_seed=args.arrival_seed,
            **sessions,
        )
    engines = _engines(args, parser)
    return RunConfig(
        trace=trace,
        trace_shards=tuple(args.trace_files[1:]),
        trace_format=args.trace_format,
        synthetic=synthetic,
        trace_block_size=args.trace_block_size,
        trace_shared_prefix_ratio=args.trace_shared_prefix_ratio or 0.0,
        trace_num_prefix_groups=args.trace_num_prefix_groups or 0,
        execution_model=args.execution_model,
        agentic_lanes=args.agentic_lanes,
        arrival_speedup_ratio=args.arrival_speedup_ratio,
        replay_concurrency=args.replay_concurrency,
        num_workers=args.num_workers or 1,
        num_prefill_workers=args.num_prefill_workers or 1,
        num_decode_workers=args.num_decode_workers or 1,
        router_mode=args.router_mode,
        router=_router(args, parser),
        session_affinity=args.session_affinity,
        kv_event_lag_ms=args.kv_event_lag_ms,
        engine=engines.get("engine", EngineConfig()),
        prefill_engine=engines.get("prefill_engine"),
        decode_engine=engines.get("decode_engine"),
        keep_records=args.per_request_jsonl is not None,
        sla=Sla(ttft_ms=args.sla_ttft_ms, itl_ms=args.sla_itl_ms, e2e_ms=args.sla_e2e_ms),
        max_sim_time_ms=None
        if args.max_sim_time_seconds is None
        else args.max_sim_time_seconds * 1000.0,
        seed=args.seed,
        exact_passes=args.exact_passes,
        telemetry_interval_ms=args.telemetry_interval_ms,
        planner=None
        if args.planner_config is None
        else servesim.parse_planner_config(args.planner_config),  # (loads the planner)
        planner_details=args.planner_details,
    )


def _trace_format(text: str) -> str:
    try:
        return canonical_format(text)
    except ConfigError:
        hint = _did_you_mean(text, FORMATS, quote="'")
        raise argparse.ArgumentTypeError(
            f"unknown trace format '{text}' (expected one of {', '.join(FORMATS)}){hint}"
        ) from None


def _source_format(text: str) -> str:
    if text in CSV_FORMATS:
        return text
    try:
        return canonical_format(text)
    except ConfigError:
        known = (*FORMATS, *CSV_FORMATS)
        hint = _did_you_mean(text, known, quote="'")
        raise argparse.ArgumentTypeError(
            f"unknown trace format '{text}' (expected one of {', '.join(known)}){hint}"
        ) from None


def _trace_command(args: argparse.Namespace) -> int:
    """``servesim trace stats`` / ``servesim trace convert``."""
    from servesim.workload.toolkit import convert_to_mooncake, render_stats, trace_stats

    options = TraceOptions(
        trace_format=args.trace_format if args.trace_format not in CSV_FORMATS else "mooncake",
        trace_block_size=args.trace_block_size,
        shared_prefix_ratio=args.trace_shared_prefix_ratio,
        num_prefix_groups=args.trace_num_prefix_groups,
        closed_loop=True,  # describing or converting needs no timestamps
    )
    for path in args.trace_files:
        if path != STDIN and not path.is_file():
            raise ConfigError(f"trace file not found: {path}")
    if args.trace_command == "stats":
        stats = trace_stats(args.trace_files, options, block_size=args.reuse_block_size or 0)
        print(json.dumps(stats, indent=2) if args.json else render_stats(stats))
        return 0
    count = 0

    def counted() -> Iterator[str]:
        nonlocal count
        for line in convert_to_mooncake(args.trace_files, args.trace_format, options):
            count += 1
            yield line

    if args.output == STDIN:
        sys.stdout.writelines(counted())
    else:
        check_writable(args.output, "--output")
        write_lines(args.output, counted())
    where = "<stdout>" if args.output == STDIN else str(args.output)
    print(f"wrote {count:,} Mooncake rows to {where}", file=sys.stderr)
    return 0


def _check_trace_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Trace flags that only some formats take, refused (as the reference does) elsewhere."""
    fmt = args.trace_format
    if fmt == "applied_compute_agentic" and args.replay_concurrency is None:
        parser.error(
            "--trace-format=applied_compute_agentic requires --replay-concurrency because the "
            "source traces do not include first-turn timestamps"
        )
    if fmt != "applied_compute_agentic":
        for flag, dest in (
            ("--trace-shared-prefix-ratio", "trace_shared_prefix_ratio"),
            ("--trace-num-prefix-groups", "trace_num_prefix_groups"),
        ):
            if getattr(args, dest) is not None:
                parser.error(f"{flag} only applies to --trace-format=applied_compute_agentic")
    if fmt == "agentic_mooncake":
        if args.replay_concurrency is not None:
            parser.error(
                "--trace-format=agentic_mooncake replays on the trace's own schedule: "
                "--replay-concurrency does not apply (use --agentic-lanes)"
            )
        if not args.execution_model:
            parser.error(
                "agentic execution requires a configured target model: give --execution-model NAME"
            )
    if fmt not in ("agentic_mooncake", "dynamo"):
        for flag, dest in (
            ("--execution-model", "execution_model"),
            ("--agentic-lanes", "agentic_lanes"),
        ):
            if getattr(args, dest) is not None:
                parser.error(f"{flag} only applies to agentic traces (agentic_mooncake, dynamo)")


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


class _ProgressBar:
    """Requests ended out of the workload's, with the time left, on stderr.

    It appears once a run has taken :attr:`DELAY_S` seconds (a short run prints
    none) and vanishes when the run ends; it is redrawn at most ten times a second.
    """

    DELAY_S = 1.0

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
            auto_refresh=False,
        )
        self._task = self._bar.add_task("replay", total=None)
        self._started = time.monotonic()
        self._shown = False
        self._last = 0.0

    def __call__(self, ended: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.1 or now - self._started < self.DELAY_S:
            return
        self._last = now
        self._bar.update(self._task, completed=ended, total=total)
        if not self._shown:
            self._bar.start()
            self._shown = True
        self._bar.refresh()

    def close(self) -> None:
        """Remove the bar (if it was shown)."""
        if self._shown:
            self._bar.stop()
            self._shown = False


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before the run, a report path that could not be written after it.

    A report is written to a temporary file beside it, then renamed, and missing
    directories are created (as the reference creates them), so what must be
    writable is the nearest directory that exists. A path that exists and is
    not a regular file (``/dev/stdout``) is written in place.

    Raises:
        ConfigError: naming ``flag``, the path and why it cannot be written.
    """
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag}: cannot write {path}: permission denied")
        return
    directory = path.parent
    while not directory.exists():  # ends: "/" or "." exists
        directory = directory.parent
    if not directory.is_dir():
        raise ConfigError(f"{flag}: cannot write {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: cannot write {path}: no permission to write in {directory}")


# Peak RSS of `servesim replay`, measured with /usr/bin/time -v: about 35 MB for the process;
# about 5.5 KB per DP rank (100,000 workers: 575 MB; 10,000 workers x dp_size 8: 403 MB;
# 10,000 prefill + 10,000 decode workers: 162 MB; num_gpu_blocks changes nothing); about
# 1 KB per synthetic request (400,000 requests: 388 MB); about 40 bytes per byte of Mooncake
# JSONL (the 3 MB conversation trace, 12,031 requests, 16 workers: 150 MB), which gzip
# shrinks about 4 times. The estimate rounds each up a little.
_BASE_BYTES = 35_000_000
_BYTES_PER_RANK = 6_000
_BYTES_PER_SYNTHETIC_REQUEST = 1_200
_BYTES_PER_TRACE_BYTE = 40
_GZIP_RATIO = 4
MEMORY_WARNING_BYTES = 2_000_000_000
"""Above this estimate the CLI warns before the run."""


def estimate_memory_bytes(config: RunConfig) -> tuple[int, str]:
    """A rough peak memory estimate of ``config``'s replay, and what it was estimated from.

    A trace on stdin counts for nothing (its size is not known in advance).
    """
    if config.disaggregated:
        assert config.prefill_engine is not None and config.decode_engine is not None
        ranks = (
            config.num_prefill_workers * config.prefill_engine.dp_size
            + config.num_decode_workers * config.decode_engine.dp_size
        )
    else:
        ranks = config.num_workers * config.engine.dp_size
    total = _BASE_BYTES + ranks * _BYTES_PER_RANK
    basis = _count(ranks, "DP rank")
    if config.synthetic is not None:
        total += config.synthetic.request_count * _BYTES_PER_SYNTHETIC_REQUEST
        basis += ", " + _count(config.synthetic.request_count, "request")
    elif config.trace_path is not None and config.trace_path != STDIN:
        try:
            size = config.trace_path.stat().st_size
            with config.trace_path.open("rb") as handle:
                if handle.read(2) == b"\x1f\x8b":
                    size *= _GZIP_RATIO
        except OSError:  # an unreadable trace is reported when the replay reads it
            return total, basis
        total += size * _BYTES_PER_TRACE_BYTE
        basis += f", a {size / 1e6:,.1f} MB trace"
    return total, basis


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _warn_if_large(config: RunConfig) -> None:
    estimate, basis = estimate_memory_bytes(config)
    if estimate > MEMORY_WARNING_BYTES:
        print(
            f"servesim: warning: this run may need about {estimate / 1e9:.1f} GB of memory "
            f"({basis})",
            file=sys.stderr,
        )


def render_keys() -> str:
    """The ``servesim keys`` listing: every engine and router key, its default and meaning."""
    sections: list[tuple[str, list[KeyInfo]]] = [
        (
            "Engine keys (--extra-engine-args, --prefill-engine-args, --decode-engine-args):",
            engine_keys(),
        ),
        ("Router keys (--router-config, with --router-mode kv_router):", router_keys()),
    ]
    infos = [info for _, keys in sections for info in keys]
    name_width = max(len(info.name) for info in infos)
    default_width = max(len(info.default) for info in infos)
    lines: list[str] = []
    for title, keys in sections:
        lines += [*([""] if lines else []), title]
        lines.append(f"  {'key':<{name_width}}  {'default':<{default_width}}  meaning")
        lines += [
            f"  {k.name:<{name_width}}  {k.default:<{default_width}}  {k.meaning}" for k in keys
        ]
    return "\n".join(lines)


def render_timing_list() -> str:
    """The ``servesim timing list`` listing: presets, then what AIC timing covers."""
    from servesim import aic

    lines = ['Timing presets (timing_model: {"profile": NAME}):']
    width = max(len(name) for name in PRESETS)
    lines += [f"  {name:<{width}}  {preset.description}" for name, preset in PRESETS.items()]
    lines += ["", 'AIC timing (timing_model: {"type": "aic", "system": S, "model": M, ...}):']
    if not aic.is_installed():
        return "\n".join([*lines, f"  not available: {aic.INSTALL_HINT}"])
    systems = aic.databases()
    width = max(len(system) for system in systems)
    lines.append(f"  {'system':<{width}}  backends (versions)")
    for system, backends in systems.items():
        shown = ", ".join(f"{b} ({', '.join(v)})" for b, v in backends.items())
        lines.append(f"  {system:<{width}}  {shown}")
    lines += ["", f"  models ({len(aic.models())}, those whose configuration ships with AIC):"]
    lines += [f"    {name}" for name in aic.models()]
    return "\n".join(lines)


def console_main() -> NoReturn:
    """The ``servesim`` command and ``python -m servesim``: :func:`main`, then exit at once.

    Whatever :func:`main` makes is complete when it returns: reports are renamed
    into place whole, process pools and Ray are shut down. Tearing the interpreter
    down after a replay, freeing its objects one by one, would only add 10 to 30 ms
    to every run of a sweep's hundreds, so the process ends as soon as its output is
    flushed.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a reader gone or a stream closed: there is no one left to tell
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code.

    Ctrl-C prints one line and returns 130. A report is only ever renamed into
    place whole, so an interrupted run leaves no partial file. A reader that
    closes stdout early (``| head``) ends the printing quietly, with 0.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader of stdout stopped (``servesim replay ... | head``): the run and its
        # files are complete; say nothing more, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K")  # the progress bar's line
        print("servesim: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    command_parser: _Parser = getattr(args, "command_parser", parser)
    if extras:
        command_parser.reject_unknown(extras)
    if args.command == "keys":
        print(render_keys())
        return 0
    if args.command == "report":
        return _report_command(args)
    if args.command == "trace":
        try:
            return _trace_command(args)
        except ServesimError as exc:
            print(f"servesim: error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"servesim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.command == "timing":
        print(render_timing_list())
        return 0
    if args.command in ("sweep", "search"):
        try:
            if args.command == "sweep":
                return _sweep_command(args)
            return _search_command(args)
        except ServesimError as exc:
            print(f"servesim: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except OSError as exc:
            print(f"servesim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
    # As the reference: an existing directory gets the report inside it.
    if args.report_json is not None and args.report_json.is_dir():
        args.report_json = args.report_json / "servesim_report.json"
    if args.per_request_jsonl is not None and args.per_request_jsonl.is_dir():
        args.per_request_jsonl = args.per_request_jsonl / "servesim_requests.jsonl"
    if args.html is not None and args.html.is_dir():
        args.html = args.html / "servesim_report.html"
    try:
        if args.telemetry_jsonl is not None and args.telemetry_interval_ms is None:
            command_parser.error("--telemetry-jsonl needs --telemetry-interval-ms")
        if args.planner_details and args.planner_config is None:
            command_parser.error("--planner-details needs --planner-config")
        for path, flag in (
            (args.report_json, "--report-json"),
            (args.per_request_jsonl, "--per-request-jsonl"),
            (args.html, "--html"),
            (args.telemetry_jsonl, "--telemetry-jsonl"),
        ):
            if path is not None:
                check_writable(path, flag)
        if args.config is not None:
            config = _config_from_record(args, command_parser)
        else:
            config = config_from_args(args, command_parser)
        _warn_if_large(config)
        bar = _ProgressBar() if not args.quiet and sys.stderr.isatty() else None
        try:
            report = run(config, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        report.save(
            json_path=args.report_json, jsonl_path=args.per_request_jsonl, html_path=args.html
        )
        if args.telemetry_jsonl is not None:
            write_samples_jsonl(args.telemetry_jsonl, report.sections["telemetry"]["samples"])
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a report path that could not be written after all
        print(f"servesim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    if not args.quiet:
        _print(report.document())
        for path, what in ((args.report_json, "full report"), (args.html, "HTML report")):
            if path is not None:
                print(f"Saved {what} to: {path}")
    return 0


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


_SWEEP_SHOWN = (
    "gpus",
    "p99_ttft_ms",
    "p99_itl_ms",
    "output_throughput_tok_s",
    "gpu_hours",
    "sla_attainment",
    "status",
)


def render_sweep_table(table: Any, axis_keys: Sequence[str]) -> str:
    """A sweep's key columns as aligned text: each point's axis values, GPUs, p99 TTFT and
    ITL, output throughput, GPU-hours, SLA attainment and status (the files have all)."""
    columns = [c for c in ("point", *axis_keys, *_SWEEP_SHOWN) if c in table.columns]

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
        return str(value)

    rows = [columns, *([cell(r.get(c)) for c in columns] for r in table)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.rjust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _sweep_command(args: argparse.Namespace) -> int:
    """``servesim sweep SPEC``: progress a line per point on stderr, then where the table is."""
    from servesim.sweeps import SweepProgress, load_spec, sweep

    spec = load_spec(args.spec, output=args.out)
    axis_keys = spec.axis_keys

    def show(p: SweepProgress) -> None:
        last = p.last or {}
        values = " ".join(f"{k}={last[k]}" for k in axis_keys if last.get(k) is not None)
        eta = "" if p.eta_s is None or p.done == p.total else f" · ETA {_duration(p.eta_s)}"
        status = last.get("status")
        if status == "failed":
            status = f"FAILED: {last.get('error')}"
        print(
            f"[{p.done:>{len(str(p.total))}}/{p.total}] point {last.get('point')} {status}"
            f"{eta} · {values}",
            file=sys.stderr,
            flush=True,
        )

    result = sweep(
        spec,
        jobs=args.jobs,
        ray=args.ray,
        retry_failed=args.retry_failed,
        progress=None if args.quiet else show,
    )
    if not args.quiet:
        print(render_sweep_table(result.table, axis_keys))
        print(
            f"\n{len(result.table)} points: {result.ran} run now, {result.skipped} done before, "
            f"{result.failed} failed"
        )
        for path in result.files:
            print(f"Saved table to: {path}")
    if result.failed:
        print(
            f"servesim: {result.failed} point(s) failed; their errors are in the table's "
            "'error' column",
            file=sys.stderr,
        )
        return 1
    return 0


def _search_command(args: argparse.Namespace) -> int:
    """``servesim search SPEC``: the winner, the next smaller deployment of its kind,
    the runners-up and the Pareto frontier."""
    from servesim.capacity import Candidate, describe, load_search, search

    spec = load_search(args.spec)
    if args.json is not None:
        check_writable(args.json, "--json")

    def show(c: Candidate) -> None:
        verdict = "meets" if c.feasible else "misses"
        print(f"  tried {describe(c)}: {verdict}", file=sys.stderr, flush=True)

    result = search(spec, jobs=args.jobs, ray=args.ray, progress=None if args.quiet else show)
    if args.json is not None:
        write_lines(args.json, [result.to_json()])
    if args.quiet:
        return 0
    assert result.winner is not None
    wanted = " and ".join(str(t) for t in result.targets)
    if result.min_goodput is not None:
        wanted += f", goodput >= {result.min_goodput:g}"
    print(f"Targets: {wanted}; objective: fewest {result.objective.replace('_', '-')}")
    print(f"{len(result.evaluated)} deployments replayed")
    print(f"\nWinner: {describe(result.winner)}, {result.winner.gpu_hours or 0:.3f} GPU-hours")
    if result.next_smaller is not None:
        print(f"One step smaller misses: {describe(result.next_smaller)}")
    if result.runners_up:
        print("\nRunners-up (the fewest of each other kind that meets the targets):")
        for c in result.runners_up:
            print(f"  {describe(c)}, {c.gpu_hours or 0:.3f} GPU-hours")
    if result.frontier:
        key = next(iter(result.frontier[0].metrics))
        print(f"\nPareto frontier (output tokens/s per GPU vs {key}):")
        for c in result.frontier:
            mark = "meets" if c.feasible else "misses"
            print(
                f"  {c.throughput_per_gpu or 0:>9.1f} tok/s/GPU  {key} {c.metrics[key]:>9.1f}  "
                f"{c.label} ({c.gpus} GPUs, {mark})"
            )
    if args.json is not None:
        print(f"\nSaved search result to: {args.json}")
    return 0


def _config_from_record(args: argparse.Namespace, parser: _Parser) -> RunConfig:
    """``replay --config FILE``: the run a report's provenance (or a settings object)
    describes, refusing a trace whose contents changed since it was recorded."""
    from servesim.provenance import file_digest
    from servesim.settings import OUTPUT_DESTS, config_from_settings, record_settings

    given = [
        action.option_strings[0] if action.option_strings else "TRACE"
        for action in parser._actions
        if action.dest not in OUTPUT_DESTS
        and action.dest not in ("command_parser", "trace_files")
        and getattr(args, action.dest, None) != action.default
    ]
    if args.trace_files:
        given.append("TRACE")
    if given:
        parser.error(
            f"--config replays the recorded configuration; drop {', '.join(sorted(set(given)))} "
            "(or edit the file)"
        )
    source = f"--config {args.config}"
    settings, inputs = record_settings(args.config)
    config = config_from_settings(settings, source=source)
    for recorded in inputs:
        path = Path(recorded["name"])
        if recorded.get("sha256") is None or recorded["name"] == "<stdin>":
            continue
        try:
            now = file_digest(path)
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read {path}: {exc.strerror}") from None
        if now["sha256"] != recorded["sha256"]:
            raise ConfigError(
                f"{source}: {path} has changed since the report was made (SHA-256 "
                f"{now['sha256'][:12]}..., {now['size_bytes']:,} bytes; recorded "
                f"{recorded['sha256'][:12]}..., {recorded['size_bytes']:,} bytes)"
            )
    return replace(config, keep_records=args.per_request_jsonl is not None)


def _print(document: dict[str, Any]) -> None:
    """The terminal report on stdout: the terminal's width and colours, or 100 plain columns."""
    from servesim.metrics.terminal import render_text

    tty = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if tty else 100
    print(render_text(document, width=width, color=tty))


def _report_command(args: argparse.Namespace) -> int:
    """``servesim report REPORT.json [--html PATH]``."""
    from servesim.metrics.html import write_html
    from servesim.metrics.terminal import report_lines

    html = args.html
    if html is not None and html.is_dir():
        html = html / "servesim_report.html"
    try:
        if html is not None:
            check_writable(html, "--html")
        document = read_report_json(args.report_file)
        report_lines(document)  # every key the report needs is there (or KeyError below)
        if html is not None:
            write_html(html, document)
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"servesim: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except (KeyError, TypeError) as exc:  # a section that lacks what the renderers read
        print(
            f"servesim: error: {args.report_file}: not a servesim report (missing or malformed {exc})",
            file=sys.stderr,
        )
        return 2
    if not args.quiet:
        _print(document)
        if html is not None:
            print(f"Saved HTML report to: {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
