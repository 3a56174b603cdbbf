"""The command line as a new user meets it: --version, help, one-line usage errors with a
suggestion, no abbreviations, ``servesim keys``, report paths checked before the run, and the
large-memory warning."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

import servesim
from servesim import cli
from servesim.cli import check_writable, estimate_memory_bytes, main
from servesim.config import (
    _DISK_OFFLOAD_KEYS,
    _ENGINE_KEY_MEANINGS,
    _ENGINE_KEYS,
    _HOST_OFFLOAD_KEYS,
    _REASONING_KEY_MEANINGS,
    _REASONING_KEYS,
    _ROUTER_KEY_MEANINGS,
    _ROUTER_KEYS,
    _SGLANG_KEY_MEANINGS,
    _SGLANG_KEYS,
    _TRTLLM_KEY_MEANINGS,
    _TRTLLM_KEYS,
    EngineConfig,
    engine_keys,
    router_keys,
)
from servesim.simulation import RunConfig, SyntheticWorkload
from tests.support import run_cli

SYNTHETIC = [
    *("--input-tokens", "100", "--output-tokens", "5", "--request-count", "3"),
    *("--arrival-interval-ms", "0"),
]


# --- version ------------------------------------------------------------------------------


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``servesim --version`` prints the installed package's version."""
    code, out, _ = run_cli(capsys, "--version")
    assert (code, out) == (0, f"servesim {version('servesim')}\n")
    assert servesim.__version__ == version("servesim")


# --- one-line usage errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "lines"),
    [
        (
            ["replay", *SYNTHETIC, "--num-worker", "4"],
            [
                "servesim: error: unrecognized arguments: --num-worker; did you mean --num-workers?",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["replay", *SYNTHETIC, "--num-worker=4"],
            [
                "servesim: error: unrecognized arguments: --num-worker=4; did you mean --num-workers?",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["replay", *SYNTHETIC, "--request-cnt", "4"],
            [
                "servesim: error: unrecognized arguments: --request-cnt; did you mean --request-count?",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["replay", *SYNTHETIC, "--zzz"],
            ["servesim: error: unrecognized arguments: --zzz", "try 'servesim replay --help'"],
        ),
        (
            ["replay", *SYNTHETIC, "--router-mode", "kv-router"],
            [
                "servesim: error: argument --router-mode: invalid choice: 'kv-router' (choose from "
                "'round_robin', 'kv_router'); did you mean 'kv_router'?",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["repaly"],
            [
                "servesim: error: argument command: invalid choice: 'repaly' (choose from "
                "'replay', 'keys', 'report', 'timing', 'trace', 'sweep', 'search'); did you mean 'replay'?",
                "try 'servesim --help'",
            ],
        ),
        (
            ["replay", *SYNTHETIC, "--num-workers", "x"],
            [
                "servesim: error: argument --num-workers: expected an integer >= 1, got 'x'",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["replay", "--input-tokens", "5"],
            [
                "servesim: error: synthetic replay is missing --output-tokens, --request-count "
                "(or give a trace file instead)",
                "try 'servesim replay --help'",
            ],
        ),
        (
            ["keys", "--all"],
            ["servesim: error: unrecognized arguments: --all", "try 'servesim keys --help'"],
        ),
    ],
    ids=[
        "abbreviation",
        "abbreviation-equals",
        "typo",
        "unknown-flag",
        "choice",
        "command",
        "bad-value",
        "missing-flags",
        "keys-flag",
    ],
)
def test_usage_error_is_one_line_and_a_hint(
    capsys: pytest.CaptureFixture[str], argv: list[str], lines: list[str]
) -> None:
    """A usage error is one line (with a suggestion when a known name is close) and a hint,
    never the usage block; exit code 2. Abbreviated flags are not accepted."""
    code, out, err = run_cli(capsys, *argv)
    assert (code, out, err.splitlines()) == (2, "", lines)


@pytest.mark.parametrize(
    ("flag", "value", "line"),
    [
        (
            "--extra-engine-args",
            '{"block_sise": 4}',
            "servesim: error: --extra-engine-args: unknown engine key 'block_sise'; did you mean "
            "'block_size'? ('servesim keys' lists every key)",
        ),
        (
            "--extra-engine-args",
            '{"zzz": 4}',
            "servesim: error: --extra-engine-args: unknown engine key 'zzz' "
            "('servesim keys' lists every key)",
        ),
        (
            "--extra-engine-args",
            '{"backend": "sglang", "sglang": {"schedule_polcy": "lpm"}}',
            "servesim: error: --extra-engine-args: engine key 'sglang': unknown sglang key "
            "'schedule_polcy'; did you mean 'schedule_policy'? (known keys: chunked_prefill_size, "
            "clip_max_new_tokens, max_prefill_tokens, page_size, schedule_conservativeness, "
            "schedule_policy)",
        ),
        (
            "--router-config",
            '{"router_temprature": 0.5}',
            "servesim: error: --router-config: unknown router key 'router_temprature'; did you "
            "mean 'router_temperature'? ('servesim keys' lists every key)",
        ),
    ],
    ids=["engine", "engine-nothing-close", "sglang", "router"],
)
def test_unknown_key_suggests_the_closest(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, line: str
) -> None:
    """An engine or router key typo names the key and the closest known one, on one line."""
    argv = ["replay", *SYNTHETIC, "--router-mode", "kv_router", flag, value]
    code, out, err = run_cli(capsys, *argv)
    assert (code, out, err.splitlines()) == (2, "", [line])


# --- help -----------------------------------------------------------------------------------


def test_replay_help_groups_defaults_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """``replay --help`` groups the flags, shows defaults that exist and ends with examples."""
    code, out, _ = run_cli(capsys, "replay", "--help")
    assert code == 0
    headings = [line for line in out.splitlines() if re.fullmatch(r"[a-z ]+:", line)]
    assert headings == [
        "options:",
        "workload:",
        "cluster:",
        "engine:",
        "router:",
        "goodput and limits:",
        "output:",
        "examples:",
    ]
    flat = " ".join(out.split())
    assert "how requests are placed on workers (default: round_robin)" in flat
    assert (
        "--trace-block-size N tokens per hash id (default 512; dynamo and agentic_mooncake "
        "traces carry their own)" in flat
    )
    assert "--trace-format FORMAT trace format: mooncake, mooncake-delta" in flat
    assert "--num-workers N aggregated workers (default: 1)" in flat
    assert "(default: None)" not in flat and "(default: False)" not in flat
    examples = out[out.index("examples:") :].splitlines()
    assert (
        examples[1] == "  servesim replay examples/mooncake_conversation_200.jsonl --num-workers 4"
    )


def test_readme_example_in_the_help_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The first example of the help runs as written (from the repository root)."""
    trace = Path(__file__).parents[1] / "examples" / "mooncake_conversation_200.jsonl"
    code, out, err = run_cli(capsys, "replay", str(trace), "--num-workers", "4")
    assert (code, err) == (0, "")
    assert "200 arrived · 200 completed · 0 rejected · 0 incomplete" in out


# --- servesim keys --------------------------------------------------------------------------


def test_every_key_has_a_meaning() -> None:
    """Each key the parsers accept has a one-line meaning, and no meaning is left for a key
    they do not accept (so the listing cannot drift from the tables)."""
    pairs = [
        (_ENGINE_KEYS, _ENGINE_KEY_MEANINGS),
        (_SGLANG_KEYS, _SGLANG_KEY_MEANINGS),
        (_TRTLLM_KEYS, _TRTLLM_KEY_MEANINGS),
        (_REASONING_KEYS, _REASONING_KEY_MEANINGS),
        (_ROUTER_KEYS, _ROUTER_KEY_MEANINGS),
    ]
    for table, meanings in pairs:
        assert list(meanings) == list(table)
        assert all(m and "\n" not in m for m in meanings.values())


def test_keys_lists_every_key_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    """``servesim keys`` lists the parsers' keys, nested ones dotted, with defaults."""
    code, out, err = run_cli(capsys, "keys")
    assert (code, err) == (0, "")
    listed = [
        line for line in out.splitlines() if line.startswith("  ") and line.split()[0] != "key"
    ]
    rows = {line.split()[0]: line for line in listed}  # the router's keys win a shared name
    names = [*_ENGINE_KEYS, *(f"sglang.{k}" for k in _SGLANG_KEYS)]
    names += [*(f"trtllm.{k}" for k in _TRTLLM_KEYS), *(f"reasoning.{k}" for k in _REASONING_KEYS)]
    names += [f"native_host_offload.{k}" for k in _HOST_OFFLOAD_KEYS]
    names += [f"g3_offload.{k}" for k in _DISK_OFFLOAD_KEYS]
    assert [line.split()[0] for line in listed] == [*names, *_ROUTER_KEYS]
    assert [info.name for info in engine_keys()] == names
    assert [info.name for info in router_keys()] == list(_ROUTER_KEYS)
    assert rows["num_gpu_blocks"].split()[:2] == ["num_gpu_blocks", "16384"]
    assert rows["preemption_mode"].split()[:2] == ["preemption_mode", '"lifo"']
    assert rows["block_size"].split()[:7] == [
        "block_size",
        "64",
        "vllm,",
        "32",
        "trtllm,",
        "1",
        "sglang",
    ]
    assert rows["router_queue_policy"].split()[:3] == ["router_queue_policy", '"fcfs"', "order"]
    assert rows["sglang.chunked_prefill_size"].split()[:2] == [
        "sglang.chunked_prefill_size",
        "8192",
    ]
    assert out.splitlines()[0].startswith("Engine keys (--extra-engine-args")


def test_shown_engine_defaults_are_the_parsed_ones() -> None:
    """Every default ``servesim keys`` shows for a flat engine key that sets a field is the
    default :class:`EngineConfig` has (block_size and timing_model shown by hand)."""
    config = EngineConfig()
    shown = {info.name: info.default for info in engine_keys()}
    for key, (attribute, _parse, _default) in _ENGINE_KEYS.items():
        if attribute is None or key in ("block_size", "timing_model", "sglang", "trtllm"):
            continue
        if key in ("is_prefill", "is_decode"):  # legacy spellings of worker_type
            assert shown[key] == "false"
            continue
        assert shown[key] == json.dumps(getattr(config, attribute)), key
    assert (
        shown["timing_model"] == '{"type": "polynomial"}'
        and config.timing_model.type == "polynomial"
    )


# --- report paths, before the run -----------------------------------------------------------


@pytest.mark.parametrize("flag", ["--report-json", "--per-request-jsonl"])
def test_report_path_under_a_file_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """A report path under a regular file is refused with exit 2 before anything runs."""
    blocker = tmp_path / "file"
    blocker.write_text("")

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the simulation ran")

    monkeypatch.setattr(cli, "run", no_run)
    target = blocker / "deeper" / "out.json"
    code, out, err = run_cli(capsys, "replay", *SYNTHETIC, flag, str(target))
    assert (code, out) == (2, "")
    assert err == f"servesim: error: {flag}: cannot write {target}: {blocker} is not a directory\n"


def test_report_path_in_a_missing_directory_is_created(tmp_path: Path) -> None:
    """As the reference: missing directories of a report path are created, so it passes."""
    target = tmp_path / "a" / "b" / "report.json"
    check_writable(target, "--report-json")
    assert main(["replay", *SYNTHETIC, "--quiet", "--report-json", str(target)]) == 0
    assert "summary" in json.loads(target.read_text())


def _main_as_user_without_write_access(argv: list[str]) -> tuple[int, str]:
    """Run ``main(argv)`` in a forked child that cannot write where root could: as root the
    child becomes user nobody first (permissions do not bind root). servesim is already
    imported, so the child needs no access to the checkout. Returns (exit code, stderr)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(read_end)
            os.dup2(write_end, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (pytest replaced it)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as stream:
        err = stream.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def test_report_path_without_permission_fails_before_the_run() -> None:
    """A directory the user may not write in is refused at once, before any simulation."""
    directory = Path(tempfile.mkdtemp(prefix="servesim-readonly-"))
    try:
        # Root's directory, readable but not writable by others (nobody, as root); the
        # owner's own directory made read-only otherwise.
        directory.chmod(0o755 if os.geteuid() == 0 else 0o555)
        target = directory / "sub" / "report.json"
        argv = ["replay", *SYNTHETIC, "--max-sim-time-seconds", "0", "--report-json", str(target)]
        expected = f"servesim: error: --report-json: cannot write {target}: no permission to write in {directory}\n"
        assert _main_as_user_without_write_access(argv) == (2, expected)
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


def test_check_writable_accepts_an_existing_special_file() -> None:
    """A path that exists and is not a regular file (a device) is written in place: it is
    accepted when writable."""
    check_writable(Path(os.devnull), "--report-json")


# --- memory warning -------------------------------------------------------------------------


def test_memory_estimate() -> None:
    """The estimate: 35 MB, 6 KB per DP rank, 1.2 KB per synthetic request."""
    synthetic = SyntheticWorkload(input_tokens=10, output_tokens=2, request_count=1000)
    config = RunConfig(synthetic=synthetic, num_workers=1000, engine=EngineConfig(dp_size=4))
    assert estimate_memory_bytes(config) == (
        35_000_000 + 4000 * 6_000 + 1000 * 1_200,
        "4,000 DP ranks, 1,000 requests",
    )
    disagg = RunConfig(
        synthetic=synthetic,
        num_prefill_workers=3,
        num_decode_workers=5,
        prefill_engine=EngineConfig(dp_size=2),
        decode_engine=EngineConfig(),
    )
    assert estimate_memory_bytes(disagg)[1] == "11 DP ranks, 1,000 requests"


def test_memory_estimate_of_traces(tmp_path: Path) -> None:
    """A trace counts 40 bytes per byte, a gzip trace as four times its size."""
    plain = tmp_path / "t.jsonl"
    plain.write_bytes(b"x" * 1000)
    packed = tmp_path / "t.bin"
    packed.write_bytes(b"\x1f\x8b" + b"x" * 998)
    assert estimate_memory_bytes(RunConfig(trace=plain)) == (
        35_000_000 + 6_000 + 40_000,
        "1 DP rank, a 0.0 MB trace",
    )
    assert estimate_memory_bytes(RunConfig(trace=packed))[0] == 35_000_000 + 6_000 + 160_000


def test_large_configuration_warns_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the threshold the run warns once on stderr, then runs as usual."""
    monkeypatch.setattr(cli, "MEMORY_WARNING_BYTES", 35_000_000 + 6_000 * 2)
    code, _, err = run_cli(capsys, "replay", *SYNTHETIC, "--num-workers", "2", "--quiet")
    assert (code, err) == (
        0,
        "servesim: warning: this run may need about 0.0 GB of memory (2 DP ranks, 3 requests)\n",
    )
    code, _, err = run_cli(capsys, "replay", *SYNTHETIC, "--num-workers", "1", "--quiet")
    assert (code, err) == (0, "")
