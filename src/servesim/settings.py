"""Settings: one run's configuration as a JSON-like object keyed by the replay's flags.

A settings object names each ``servesim replay`` flag without its dashes
(``num_workers``, ``router_mode``, ``sla_ttft_ms``); ``trace`` is the trace file
(or a list of shards); ``engine``, ``prefill_engine``, ``decode_engine`` and
``router`` are the objects ``--extra-engine-args``, ``--prefill-engine-args``,
``--decode-engine-args`` and ``--router-config`` take. A dotted key sets one key
inside such an object (``engine.max_num_seqs``). Settings become a
:class:`~servesim.simulation.RunConfig` through the replay's own parser, so they are
validated exactly as the flags are. Sweep files, search files and ``--config``
records (a report's ``provenance.config``) are settings.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from servesim.config import engine_keys, router_keys
from servesim.errors import ConfigError
from servesim.simulation import RunConfig

OBJECT_KEYS = {
    "engine": "extra_engine_args",
    "prefill_engine": "prefill_engine_args",
    "decode_engine": "decode_engine_args",
    "router": "router_config",
    "planner_config": "planner_config",
}
"""Settings keys holding an object, and the replay flag (dest) that takes it as JSON."""

OUTPUT_DESTS = frozenset(
    {"report_json", "per_request_jsonl", "html", "telemetry_jsonl", "quiet", "config", "help"}
)
"""Replay flags (dests) that choose outputs, or the record to replay: not settings."""
_FLAG = re.compile(r"argument (--[a-z0-9-]+)(/-\S+)?:")


class _SettingsParser(argparse.ArgumentParser):
    """The replay's flags, whose errors are raised (as :class:`ConfigError`) instead of
    printed with an exit, and name settings keys instead of flags."""

    def error(self, message: str) -> Any:
        raise ConfigError(
            _FLAG.sub(lambda m: f"'{m[1][2:].replace('-', '_')}':", message).replace(
                "argument TRACE:", "'trace':"
            )
        )


def _parser() -> _SettingsParser:
    from servesim.cli import add_replay_arguments  # the CLI imports this module's users

    parser = _SettingsParser(prog="settings", add_help=False, allow_abbrev=False)
    add_replay_arguments(parser)
    return parser


def _actions() -> dict[str, argparse.Action]:
    """Each settings key (not ``trace``) and the replay flag's action behind it."""
    by_dest = {a.dest: a for a in _parser()._actions if a.dest not in OUTPUT_DESTS}
    by_dest.pop("trace_files")
    renamed = {dest: key for key, dest in OBJECT_KEYS.items()}
    return {renamed.get(dest, dest): action for dest, action in by_dest.items()}


def setting_keys() -> list[str]:
    """Every top-level settings key, ``trace`` first."""
    return ["trace", *_actions()]


def _nested_names(head: str) -> list[str]:
    if head == "planner_config":
        from servesim.cluster.planner import PlannerConfig

        return [f.name for f in fields(PlannerConfig)]
    infos = router_keys() if head == "router" else engine_keys()
    return [info.name for info in infos]


def check_key(key: str, *, where: str) -> None:
    """Refuse a settings key that names no flag, engine key or router key.

    Raises:
        ConfigError: naming ``where`` (file and place), the key and the closest known one.
    """
    head, dot, rest = key.partition(".")
    if not dot:
        known = setting_keys()
        if key in known:
            return
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"{where}: unknown key '{key}'{hint} (keys are the replay's flags without dashes, "
            "such as num_workers, and engine.KEY or router.KEY; 'servesim keys' lists those)"
        )
    if head not in OBJECT_KEYS:
        raise ConfigError(
            f"{where}: unknown key '{key}': only {', '.join(OBJECT_KEYS)} take a dotted key"
        )
    names = _nested_names(head)
    # A nested object's own keys (engine.sglang.chunked_prefill_size) are listed dotted.
    if rest in names or any(name.startswith(rest + ".") for name in names):
        return
    close = difflib.get_close_matches(rest, names, n=1)
    hint = f"; did you mean '{head}.{close[0]}'?" if close else ""
    raise ConfigError(f"{where}: unknown {head} key '{rest}'{hint} ('servesim keys' lists them)")


def with_setting(settings: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``settings`` with ``key`` (dotted or not) set to ``value``, as a new object."""
    out = dict(settings)
    parts = key.split(".")
    if len(parts) == 1:
        out[key] = value
        return out
    inner = out.get(parts[0])
    out[parts[0]] = inner = dict(inner) if isinstance(inner, Mapping) else {}
    for part in parts[1:-1]:
        nested = inner.get(part)
        inner[part] = dict(nested) if isinstance(nested, Mapping) else {}
        inner = inner[part]
    inner[parts[-1]] = value
    return out


def _argv(settings: Mapping[str, Any]) -> list[str]:
    actions = _actions()
    argv: list[str] = []
    for key, value in settings.items():
        if value is None or key == "trace":
            continue
        action = actions.get(key)
        if action is None:
            check_key(key, where="settings")
            raise ConfigError(f"settings: '{key}' must be set as part of its object")
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ConfigError(f"'{key}' must be true or false, got {value!r}")
            argv += [flag] if value else []
        elif key in OBJECT_KEYS:
            if not isinstance(value, Mapping):
                raise ConfigError(f"'{key}' must be an object of keys, got {value!r}")
            argv += [flag, json.dumps(value)]
        elif isinstance(value, (bool, list, dict)):
            raise ConfigError(f"'{key}' must be a single number or name, got {value!r}")
        else:
            argv += [f"{flag}={value}"]
    trace = settings.get("trace")
    if trace is not None:
        paths = trace if isinstance(trace, list) else [trace]
        if not paths or not all(isinstance(p, str) and p for p in paths):
            raise ConfigError(f"'trace' must be a file name or a list of them, got {trace!r}")
        argv += ["--", *paths]
    return argv


def config_from_settings(settings: Mapping[str, Any], *, source: str) -> RunConfig:
    """The run ``settings`` describe, validated as the replay's flags are.

    Raises:
        ConfigError: an unknown key or a bad value, prefixed with ``source``.
    """
    from servesim.cli import config_from_args

    parser = _parser()
    try:
        args = parser.parse_args(_argv(settings))
        for dest in OUTPUT_DESTS - {"help", "config"}:
            setattr(args, dest, None)
        return config_from_args(args, parser)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_document(path: Path, *, what: str) -> Any:
    """A YAML (``.yaml``, ``.yml``) or JSON file's content.

    Raises:
        ConfigError: the file cannot be read or parsed, naming it and the line.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a {what} (not UTF-8 text)") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "invalid YAML"
            raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def record_settings(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The settings and recorded inputs of a ``--config`` file: a report (its
    ``provenance``), a provenance object, or a settings object (no inputs recorded).

    Raises:
        ConfigError: the file is not one of those.
    """
    document = load_document(path, what="configuration record")
    if isinstance(document, dict) and isinstance(document.get("provenance"), dict):
        document = document["provenance"]
    if isinstance(document, dict) and isinstance(document.get("config"), dict):
        inputs = document.get("inputs") or []
        if not isinstance(inputs, list) or not all(
            isinstance(i, dict) and "name" in i and "sha256" in i for i in inputs
        ):
            raise ConfigError(f"{path}: 'inputs' must be a list of {{name, size_bytes, sha256}}")
        return document["config"], inputs
    if not isinstance(document, dict):
        raise ConfigError(
            f"{path}: expected a report with a provenance section, or a settings object"
        )
    for key in document:
        check_key(key, where=str(path))
    return document, []
