"""servesim's classes keep the shape CPython 3.11's specialising interpreter needs.

An instance's attributes live in a dict that shares its keys with its class's
other instances while there are at most 30 of them. Past that the dict stops
sharing, and CPython 3.11 then specialises no call of a method on the
instance (``self._schedule(...)``): each one looks the method up in the
instance's dict and its type's MRO. On the vLLM rank and the runtime, whose
methods the replay loop calls a few dozen times a request, that cost 3% of a
replay's instructions. Such a class declares ``__slots__`` instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import servesim
from servesim.cluster.flows import AggregatedFlow
from servesim.cluster.runtime import Ledger, Runtime
from servesim.engine.vllm import VllmScheduler
from servesim.engine.worker import Worker

SHARED_KEYS_MAX = 30
"""CPython's ``SHARED_KEYS_MAX_SIZE``: the most keys a class's instances share."""


def _slotted(cls: ast.ClassDef) -> bool:
    for statement in cls.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__slots__"
            for target in statement.targets
        ):
            return True
    return any(
        isinstance(decorator, ast.Call)
        and any(
            keyword.arg == "slots"
            and isinstance(keyword.value, ast.Constant)
            and keyword.value.value is True
            for keyword in decorator.keywords
        )
        for decorator in cls.decorator_list
    )


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """The attributes its methods assign on ``self``, and its annotated fields (a dataclass's)."""
    names = {
        statement.target.id
        for statement in cls.body
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and "ClassVar" not in ast.unparse(statement.annotation)
    }
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == "self"
                ):
                    names.add(part.attr)
    return names


def _classes() -> list[tuple[str, ast.ClassDef]]:
    root = Path(servesim.__file__).parent
    return [
        (f"{path.relative_to(root)}:{node.name}", node)
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
    ]


def test_a_class_with_more_attributes_than_a_shared_dict_holds_declares_slots() -> None:
    too_many = {
        name: len(attributes)
        for name, cls in _classes()
        if not _slotted(cls) and len(attributes := _instance_attributes(cls)) > SHARED_KEYS_MAX
    }
    assert too_many == {}


def test_the_check_sees_the_classes_it_guards() -> None:
    """The rank schedulers and the runtime are past the limit: slots keep them specialised."""
    classes = dict(_classes())
    for name in (
        "engine/vllm.py:VllmScheduler",
        "engine/sglang.py:SglangScheduler",
        "cluster/runtime.py:Runtime",
    ):
        assert _slotted(classes[name]), name
        assert len(_instance_attributes(classes[name])) > SHARED_KEYS_MAX, name


def test_the_functions_run_every_pass_allocate_no_cells() -> None:
    every_pass = {
        VllmScheduler: "execute_pass plan_decode _plan_through_finishes _schedule_cohort "
        "_schedule_waiting _schedule _emit commit_decode _visit_due _join _leave",
        Worker: "submit cut start_pass _start_window _apply finish_pass",
        Runtime: "run _upcoming _settle _apply_completions _release_arrivals _start_passes "
        "_start_pass",
        Ledger: "deliver_tokens end",
        AggregatedFlow: "admit on_pass_start on_pass_end",
    }
    cells = {
        f"{cls.__name__}.{name}": getattr(cls, name).__code__.co_cellvars
        for cls, names in every_pass.items()
        for name in names.split()
    }
    assert {name: found for name, found in cells.items() if found} == {}
