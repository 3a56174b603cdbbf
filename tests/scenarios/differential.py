"""Differential fuzzing: servesim against the reference on small random scenarios.

Run from the repository root, with the reference installed
(``../shared/reference/setup.sh .reference-venv``)::

    .venv/bin/python -m tests.scenarios.differential --seeds 0-39 \\
        [--family aggregated disaggregated offload disagg_offload] [--jobs 2] [--shrink --out DIR]

Each (family, seed) makes one small round-robin scenario in the reference's
scenario format (``shared/reference/README.md``), the same on any machine
(``random.Random`` seeded with the family and seed): a Mooncake trace of 3-30
requests whose hash ids come from a small alphabet, tiny blocks, tight KV.

- ``aggregated``: vLLM, SGLang or TRT-LLM; workers, data-parallel ranks,
  chunked prefill on or off, preemption order, ``max_model_len``,
  speculative decoding, fixed timing, speed-ups, closed loop;
- ``disaggregated``: prefill and decode pools, with and without a KV-transfer
  bandwidth (priced per transfer, ``kv_transfer_link_model: independent``);
- ``offload``: vLLM with a host tier (``native_host_offload``), half of the
  seeds with a disk tier (``g3_offload``) under it;
- ``disagg_offload``: vLLM prefill and decode pools, a host tier on either side
  or both (no disk tier: both reject one outside aggregated runs), with and
  without a KV-transfer bandwidth.

Round robin only: the reference's KV router breaks ties at random. The
generator keeps clear of inputs rejected on purpose
(``docs/reference-differences.md``): every sequence fits the KV alone, and
with chunked prefill off every prompt fits the token budget.

Each seed runs through the reference (``refcheck.py reference``) and servesim
(``refcheck.py argv`` plus ``--per-request-jsonl``). Records are sorted by
all their compared fields on both sides and compared field by field (times
to 1e-6 ms, counts and statuses exactly); the summary key by key as the
stored scenarios are (``harness.py``: host-speed keys and known differences
skipped). One line per seed, ``<family> <seed> <class> <detail>``, where the
class is one of ``agree``, ``differ`` (the fields), ``rejected`` (the
reference stops on a request servesim rejects: documented),
``reference-only failure``, ``servesim-only failure``, ``both fail`` and
``timeout``; then a tally per family. Exit status 1 when a seed differs or
fails in servesim alone.

With ``--shrink``, a differing seed is shrunk greedily (requests dropped,
then prompts and outputs shortened, while it still differs) and written to
``DIR/<family>-<seed>/``: ``scenario.json``, ``trace.jsonl`` and both sides'
reports and records. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from tests.scenarios.harness import Json, compared_keys, flatten, values_agree

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("aggregated", "disaggregated", "offload", "disagg_offload")

# Per-request fields compared (the same names in both simulators' records).
RECORD_KEYS = (
    "arrival_time_ms", "input_length", "output_length", "requested_output_length",
    "terminal_status", "first_admit_ms", "first_token_ms", "ttft_ms", "ttst_ms",
    "last_token_ms", "e2e_latency_ms", "reused_input_tokens",
    "first_admission_host_reused_input_tokens", "prefill_worker_idx", "decode_worker_idx",
    "prefill_admit_ms", "decode_admit_ms", "decode_reused_input_tokens",
    "destination_reserved_ms", "destination_activated_ms", "source_released_ms",
)  # fmt: skip
# Record times agree to this many ms. Both simulators print times to 6 decimals,
# so two equal times can print one unit of the last digit apart: the slack allows that.
TIME_TOL_MS = 1e-6
_PRINT_SLACK_MS = 1e-9
# The reference's words for a run it cannot finish (a request servesim rejects).
_REFERENCE_STALL = "effect-free zero-duration pass"


class Verdict(Enum):
    """What one seed showed."""

    AGREE = "agree"
    DIFFER = "differ"
    REJECTED = "rejected"
    REFERENCE_FAILURE = "reference-only failure"
    SERVESIM_FAILURE = "servesim-only failure"
    BOTH_FAIL = "both fail"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class Case:
    """One generated scenario: its spec (without the trace path) and its trace rows."""

    name: str
    spec: Json
    rows: list[Json]

    def texts(self, trace: Path) -> tuple[str, str]:
        """The scenario file (naming ``trace``) and the trace file, as written."""
        scenario = json.dumps({**self.spec, "trace": str(trace)}, indent=1) + "\n"
        return scenario, "".join(json.dumps(row) + "\n" for row in self.rows)


@dataclass(frozen=True, slots=True)
class Run:
    """One simulator's run: its summary and records, or why it has none."""

    summary: Json | None = None
    records: tuple[Json, ...] = ()
    error: str = ""
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """A seed's verdict and a line saying why."""

    verdict: Verdict
    detail: str = ""


# ---- the generator ----


def _trace(rng: random.Random, block_size: int, *, max_blocks: int, max_output: int) -> list[Json]:
    """3-30 Mooncake rows sharing prefixes from a small alphabet of hash ids, in timestamp order."""
    alphabet = rng.randint(2, 6)
    rows = []
    for _ in range(rng.randint(3, 30)):
        ids = [rng.randint(0, alphabet) for _ in range(rng.randint(1, max_blocks))]
        at = round(rng.uniform(0, 150), 3) if rng.random() < 0.5 else float(rng.randint(0, 10) * 10)
        length = (len(ids) - 1) * block_size + rng.randint(1, block_size)
        rows.append(
            {
                "timestamp": at,
                "input_length": length,
                "output_length": rng.randint(1, max_output),
                "hash_ids": ids,
            }
        )
    return sorted(rows, key=lambda row: row["timestamp"])  # stable: ties keep their draw order


def _blocks_for(rows: Sequence[Json], block_size: int, lookahead: int = 0) -> int:
    """Blocks that hold the longest sequence alone, with one to spare (a sequence that outgrows
    the KV stops both simulators, differently: documented)."""
    longest = max(r["input_length"] + r["output_length"] for r in rows) + lookahead
    return int(-(-longest // block_size)) + 1


def _sglang(rng: random.Random, block_size: int) -> Json:
    options: Json = {}
    if rng.random() < 0.5:
        options["schedule_policy"] = rng.choice(["fifo", "lpm"])
    if rng.random() < 0.6:
        options["chunked_prefill_size"] = block_size * rng.randint(1, max(1, 32 // block_size) + 1)
    if rng.random() < 0.4:
        options["max_prefill_tokens"] = rng.choice([8, 16, 32, 64])
    if rng.random() < 0.3:
        options["clip_max_new_tokens"] = rng.choice([1, 4, 8])
    if rng.random() < 0.3:
        options["schedule_conservativeness"] = rng.choice([0.0, 0.3, 1.0])
    return options


def _engine(rng: random.Random, backend: str, rows: Sequence[Json], *, dp: bool) -> Json:
    """A tight engine of ``backend`` for ``rows`` (see :func:`_blocks_for`)."""
    block_size = rng.choice([1, 2, 4, 8, 16] if backend == "sglang" else [2, 4, 4, 8, 16])
    engine: Json = {"block_size": block_size} | ({} if backend == "vllm" else {"backend": backend})
    nextn = rng.randint(1, 3) if rng.random() < 0.15 else 0
    tight = rng.choice([24, 48, 64, 96, 128, 200, 400]) // block_size + rng.randint(-1, 2)
    engine["num_gpu_blocks"] = max(tight, _blocks_for(rows, block_size, nextn + 1))
    if rng.random() < 0.6:
        engine["max_num_seqs"] = rng.randint(1, 6)
    if backend != "sglang" and rng.random() < 0.7:
        engine["max_num_batched_tokens"] = rng.choice([4, 8, 12, 16, 24, 32, 48, 64, 100])
    if backend != "sglang" and rng.random() < 0.25:
        # Without chunking, a prompt over the budget never runs (documented): keep them under.
        prompt = max(r["input_length"] for r in rows)
        engine["enable_chunked_prefill"] = False
        engine["max_num_batched_tokens"] = max(
            engine.get("max_num_batched_tokens", 0), prompt + rng.choice([0, 8, 40])
        )
    if backend == "vllm" and rng.random() < 0.4:
        engine["preemption_mode"] = rng.choice(["lifo", "fifo"])
    if backend == "vllm" and rng.random() < 0.15:
        prompt = max(r["input_length"] for r in rows)
        engine["max_model_len"] = rng.randint(prompt + 1, prompt + 24)
    if rng.random() < 0.1:
        engine["enable_prefix_caching"] = False
    if dp and rng.random() < 0.2:
        engine["dp_size"] = 2
    if rng.random() < 0.15:
        engine["timing_model"] = {
            "type": "fixed",
            "prefill_ms": rng.choice([1.0, 5.0, 2.5]),
            "decode_ms": rng.choice([1.0, 0.5, 3.0]),
        }
    if rng.random() < 0.1:
        engine["speedup_ratio"] = rng.choice([0.5, 2.0])
    if nextn:
        engine["aic_nextn"] = nextn
        rates = [rng.choice(["1.0", "0.0", "0.7", "0.3"]) for _ in range(nextn)]
        engine["aic_nextn_accept_rates"] = ",".join(rates)
    elif rng.random() < 0.08:
        engine["decode_speedup_ratio"] = rng.choice([1.5, 2.0])
    if backend == "sglang" and (options := _sglang(rng, block_size)):
        engine["sglang"] = options
    return engine


def _disaggregated(rng: random.Random, backend: str, rows: Sequence[Json]) -> Json:
    """Prefill and decode pools of one backend and block size, maybe with a transfer bandwidth."""
    prefill = _engine(rng, backend, rows, dp=False)
    decode = _engine(rng, backend, rows, dp=False)
    size = decode["block_size"] = prefill["block_size"]
    decode["num_gpu_blocks"] = max(decode["num_gpu_blocks"], _blocks_for(rows, size, 4))
    if "chunked_prefill_size" in decode.get("sglang", {}):
        chunk = decode["sglang"]["chunked_prefill_size"]
        decode["sglang"]["chunked_prefill_size"] = size * max(1, chunk // size)
    spec: Json = {"num_prefill_workers": rng.randint(1, 2), "num_decode_workers": rng.randint(1, 2)}
    if rng.random() < 0.5:
        link = {
            "kv_transfer_bandwidth": rng.choice([1.0, 10.0, 64.0]),
            "kv_transfer_bytes_per_token": rng.choice([131072, 1000000]),
        }
        prefill.update(link)
        decode.update(link)
        spec["servesim_engine_overrides"] = {"kv_transfer_link_model": "independent"}
        if rng.random() < 0.4:
            prefill["kv_transfer_timing_mode"] = "destination_missing"
    if rng.random() < 0.2:
        prefill["dp_size"] = rng.choice([1, 2])
        decode["dp_size"] = rng.choice([1, 2])
    return spec | {"prefill_engine": prefill, "decode_engine": decode}


def _offload(rng: random.Random, rows: Sequence[Json]) -> Json:
    """A vLLM engine with a host tier and, half the time, a disk tier under it."""
    engine = _offload_engine(rng, rows)
    return {"num_workers": rng.randint(1, 2), "engine": engine}


def _offload_engine(rng: random.Random, rows: Sequence[Json]) -> Json:
    """A tight vLLM engine of 4-token blocks with a host tier and, half the time, a disk tier."""
    engine: Json = {
        "block_size": 4,
        "num_gpu_blocks": max(rng.randint(12, 24), _blocks_for(rows, 4)),
        "max_num_batched_tokens": rng.randint(4, 64),
        "kv_cache_bytes_per_token": 250000,
        "native_host_offload": {
            "num_host_blocks": rng.randint(1, 8),
            "d2h_bandwidth_gbps": rng.choice([0.25, 1.0, 4.0]),
            "h2d_bandwidth_gbps": rng.choice([0.5, 2.0]),
            "latency_to_first_byte_ms": rng.choice([0.0, 0.5]),
        },
    }
    if rng.random() < 0.5:
        engine["g3_offload"] = {
            "scope": rng.choice(["worker_local", "cluster_shared"]),
            "num_g3_blocks": rng.randint(4, 30),
            "read_bandwidth_gbps": 0.5,
            "write_bandwidth_gbps": 1.0,
        }
    return engine


def _disagg_offload(rng: random.Random, rows: Sequence[Json]) -> Json:
    """vLLM prefill and decode pools, a host tier on one side or both, maybe a transfer link."""
    sides = rng.choice([("prefill",), ("decode",), ("prefill", "decode")])
    spec: Json = {"num_prefill_workers": rng.randint(1, 2), "num_decode_workers": rng.randint(1, 2)}
    for side in ("prefill", "decode"):
        engine = _offload_engine(rng, rows)
        engine.pop("g3_offload", None)
        if side not in sides:
            del engine["native_host_offload"]
        spec[f"{side}_engine"] = engine
    decode = spec["decode_engine"]
    decode["num_gpu_blocks"] = max(decode["num_gpu_blocks"], _blocks_for(rows, 4, 4))
    if rng.random() < 0.5:
        link = {
            "kv_transfer_bandwidth": rng.choice([1.0, 10.0]),
            "kv_transfer_bytes_per_token": rng.choice([131072, 1000000]),
        }
        spec["prefill_engine"].update(link)
        decode.update(link)
        spec["servesim_engine_overrides"] = {"kv_transfer_link_model": "independent"}
    return spec


def generate(family: str, seed: int) -> Case:
    """The scenario of ``family`` for ``seed`` (a string seed is hashed with SHA-512, not ``hash()``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
    rng = random.Random(f"{family}-{seed}")
    offload = family in ("offload", "disagg_offload")
    block_size = 8 if offload else rng.choice([4, 8, 8, 16])
    max_blocks, max_output = (6, 12) if offload else (5, 16)
    rows = _trace(rng, block_size, max_blocks=max_blocks, max_output=max_output)
    spec: Json = {"name": f"{family}-{seed}", "trace_block_size": block_size}
    spec["router_mode"] = "round_robin"
    if concurrency := rng.choice([None, None, 1, 2, 3, 4, 6]):
        spec["replay_concurrency"] = concurrency
    backend = rng.choice(["vllm", "vllm", "vllm", "sglang", "sglang", "trtllm"])
    if family == "aggregated":
        spec |= {"num_workers": rng.randint(1, 3), "engine": _engine(rng, backend, rows, dp=True)}
    elif family == "disaggregated":
        spec |= _disaggregated(rng, backend, rows)
    elif family == "offload":
        spec |= _offload(rng, rows)
    else:
        spec |= _disagg_offload(rng, rows)
    return Case(spec["name"], spec, rows)


# ---- running and comparing ----


@dataclass(frozen=True, slots=True)
class Tools:
    """Where the two simulators are, and how long a run may take."""

    reference_python: Path
    refcheck: Path
    servesim: Path
    timeout_s: float


def _run(argv: list[str], timeout_s: float, report: Path, records: Path) -> Run:
    env = {**os.environ, "RUST_LOG": "error", "DYN_LOG": "error"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Run(error="timeout", timed_out=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        return Run(error=lines[-1][:200])
    rows = tuple(json.loads(line) for line in records.read_text().splitlines() if line)
    return Run(summary=json.loads(report.read_text())["summary"], records=rows)


def run_both(case: Case, workdir: Path, tools: Tools) -> tuple[Run, Run]:
    """Write ``case`` into ``workdir`` and run the reference, then servesim, on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    scenario_path, trace_path = workdir / "scenario.json", workdir / "trace.jsonl"
    scenario, trace = case.texts(trace_path)
    scenario_path.write_text(scenario)
    trace_path.write_text(trace)
    report, records = workdir / "reference.json", workdir / "reference.jsonl"
    refcheck = [str(tools.refcheck)]
    argv = [str(tools.reference_python), *refcheck, "reference", str(scenario_path), str(report)]
    reference = _run([*argv, "--requests", str(records)], tools.timeout_s, report, records)
    report, records = workdir / "servesim.json", workdir / "servesim.jsonl"
    build = [sys.executable, *refcheck, "argv", str(scenario_path), str(report)]
    command = subprocess.run(
        [*build, "--servesim", str(tools.servesim)], capture_output=True, text=True, check=True
    ).stdout
    argv = [*shlex.split(command), "--per-request-jsonl", str(records)]
    return reference, _run(argv, tools.timeout_s, report, records)


def _sort_key(row: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    return tuple((value is not None, 0 if value is None else value) for value in row)


def reduce_records(records: Sequence[Json]) -> list[tuple[Any, ...]]:
    """Records as tuples of :data:`RECORD_KEYS`, sorted by all of them (``None`` first).

    The reference's uuids are random and several requests can share arrival
    and lengths, so only the whole tuple orders both sides the same way.
    """
    return sorted((tuple(r.get(k) for k in RECORD_KEYS) for r in records), key=_sort_key)


def record_value_agrees(ref: Any, ours: Any) -> bool:
    """Floats (times) to :data:`TIME_TOL_MS`; counts, statuses and ``None`` exactly."""
    if isinstance(ref, float) or isinstance(ours, float):
        numbers = all(isinstance(v, int | float) for v in (ref, ours))
        return numbers and abs(ref - ours) <= TIME_TOL_MS + _PRINT_SLACK_MS
    return type(ref) is type(ours) and bool(ref == ours)


def differing_record_fields(reference: Sequence[Json], ours: Sequence[Json]) -> dict[str, int]:
    """How many records differ in each field (``records`` when the counts differ)."""
    ref_rows, our_rows = reduce_records(reference), reduce_records(ours)
    if len(ref_rows) != len(our_rows):
        return {"records": abs(len(ref_rows) - len(our_rows))}
    counts: Counter[str] = Counter()
    for ref_row, our_row in zip(ref_rows, our_rows, strict=True):
        for key, r, o in zip(RECORD_KEYS, ref_row, our_row, strict=True):
            if not record_value_agrees(r, o):
                counts[key] += 1
    return dict(counts)


def differing_summary_keys(reference: Json, ours: Json) -> list[str]:
    """Compared summary keys (``harness.compared_keys``) missing from servesim's or disagreeing."""
    ref, our = flatten(reference), flatten(ours)
    return [k for k in compared_keys(ref) if k not in our or not values_agree(ref[k], our[k])]


def classify(reference: Run, ours: Run) -> Outcome:
    """The verdict on one seed's two runs."""
    if reference.timed_out or ours.timed_out:
        who = " and ".join(
            n for n, r in (("reference", reference), ("servesim", ours)) if r.timed_out
        )
        return Outcome(Verdict.TIMEOUT, who)
    if reference.summary is None:
        rejected = ours.summary is not None and ours.summary.get("rejected_requests", 0) > 0
        if _REFERENCE_STALL in reference.error and (rejected or "dead end" in ours.error):
            return Outcome(Verdict.REJECTED, reference.error)
        if ours.summary is None:
            return Outcome(Verdict.BOTH_FAIL, f"{reference.error} | {ours.error}")
        return Outcome(Verdict.REFERENCE_FAILURE, reference.error)
    if ours.summary is None:
        return Outcome(Verdict.SERVESIM_FAILURE, ours.error)
    fields = differing_record_fields(reference.records, ours.records)
    keys = differing_summary_keys(reference.summary, ours.summary)
    if not fields and not keys:
        return Outcome(Verdict.AGREE)
    parts = [", ".join(f"{k} ({n})" for k, n in sorted(fields.items()))] if fields else []
    if keys:
        parts.append("summary " + ", ".join(keys[:6]) + (" ..." if len(keys) > 6 else ""))
    return Outcome(Verdict.DIFFER, "; ".join(parts))


def check(case: Case, workdir: Path, tools: Tools) -> Outcome:
    """Run both simulators on ``case`` in ``workdir`` and classify the result."""
    return classify(*run_both(case, workdir, tools))


# ---- shrinking ----


def _shorter(row: Json, block_size: int) -> Iterator[Json]:
    """Smaller versions of one trace row: a shorter output, then a shorter prompt."""
    out = row["output_length"]
    for smaller in sorted({1, out // 2, out - 1} - {0, out}):
        yield row | {"output_length": smaller}
    ids = row["hash_ids"]
    if len(ids) > 1:
        yield row | {"hash_ids": ids[:-1], "input_length": (len(ids) - 1) * block_size}
    if row["input_length"] > (len(ids) - 1) * block_size + 1:
        yield row | {"input_length": row["input_length"] - 1}


def shrink(case: Case, still_differs: Callable[[Case], bool]) -> Case:
    """A smaller case that still differs: requests dropped, then each shortened, to a fixed point."""
    block_size = case.spec["trace_block_size"]
    progress = True
    while progress:
        progress = False
        i = 0
        while i < len(case.rows) > 1:
            smaller = replace(case, rows=case.rows[:i] + case.rows[i + 1 :])
            if still_differs(smaller):
                case, progress = smaller, True
            else:
                i += 1
        for i, row in enumerate(case.rows):
            for shorter in _shorter(row, block_size):
                smaller = replace(case, rows=[*case.rows[:i], shorter, *case.rows[i + 1 :]])
                if still_differs(smaller):
                    case, progress = smaller, True
                    break
    return case


# ---- the command line ----


def parse_seeds(text: str) -> range:
    """``A-B`` (both included) or a count ``N`` (seeds 0 to N-1)."""
    first, dash, last = text.partition("-")
    try:
        return range(int(first), int(last) + 1) if dash else range(int(first))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be A-B or a count, got {text!r}") from None


def _one(family: str, seed: int, tools: Tools, out: Path | None) -> Outcome:
    """Check one seed in a scratch directory; with ``out``, shrink a difference and keep it."""
    case = generate(family, seed)
    with tempfile.TemporaryDirectory(prefix="servesim-differential-") as tmp:
        outcome = check(case, Path(tmp), tools)
        if out is None or outcome.verdict is not Verdict.DIFFER:
            return outcome

        def still_differs(candidate: Case) -> bool:
            return check(candidate, Path(tmp), tools).verdict is Verdict.DIFFER

        small = shrink(case, still_differs)
    final = check(small, out / case.name, tools)
    return replace(
        outcome, detail=f"{outcome.detail} -> {len(small.rows)} requests: {final.detail}"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, check every (family, seed) and print the tally."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=parse_seeds, default=range(40), help="A-B or N (40)")
    parser.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--jobs", type=int, default=1, help="seeds checked at once (1)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per run (20)")
    parser.add_argument("--shrink", action="store_true", help="shrink differing seeds into --out")
    parser.add_argument("--out", type=Path, default=Path("differential-out"))
    parser.add_argument("--venv", type=Path, default=REPO / ".reference-venv")
    parser.add_argument(
        "--refcheck", type=Path, default=REPO.parent / "shared" / "reference" / "refcheck.py"
    )
    parser.add_argument("--servesim", type=Path, default=REPO / ".venv" / "bin" / "servesim")
    args = parser.parse_args(argv)
    tools = Tools(
        (args.venv / "bin" / "python").absolute(),
        args.refcheck.resolve(),
        args.servesim.absolute(),
        args.timeout,
    )
    out = args.out.resolve() if args.shrink else None
    jobs = [(family, seed) for family in args.family for seed in args.seeds]
    tally: dict[str, Counter[Verdict]] = {family: Counter() for family in args.family}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        outcomes = pool.map(lambda job: _one(job[0], job[1], tools, out), jobs)
        for (family, seed), outcome in zip(jobs, outcomes, strict=True):
            tally[family][outcome.verdict] += 1
            print(f"{family} {seed} {outcome.verdict.value} {outcome.detail}".rstrip(), flush=True)
    for family, counts in tally.items():
        print(f"{family}: " + ", ".join(f"{v.value} {counts[v]}" for v in Verdict if counts[v]))
    bad = (Verdict.DIFFER, Verdict.SERVESIM_FAILURE)
    return 1 if any(counts[v] for counts in tally.values() for v in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
