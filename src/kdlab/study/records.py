"""Run records: the fields and types of a run's ``metrics.json`` and ``history.json``, in one place.

A run is complete when both files parse and hold what the results table and the report read
(``record_problems`` finds nothing): the study runner redoes anything less and names it, the
results table (``kdlab.study.results``) takes its columns and its rows from here, and the tests check
against the same fields. Two kinds of record:

- ``run`` (a grid or style run, ``notebooks/10_run``): ``RUN_METRICS``; the measured metrics
  marked ``finite`` must be finite numbers (a collapsed run's are: its evaluation reads whatever
  weights it ended with); ``history.json`` is a list of ``RUN_HISTORY`` entries, one per step;
- ``rlvr`` (an RLVR start, ``notebooks/11_rlvr``): ``RLVR_METRICS`` and ``RLVR_HISTORY``.

A leaf module: it imports nothing from kdlab.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Field:
    """One field of a record: its JSON type (``str``, ``int``, ``number``, ``bool``), whether it
    may be null, must be a finite number, or may be absent."""

    name: str
    type: str
    nullable: bool = False
    finite: bool = False
    required: bool = True


RUN_METRICS = (
    Field("run_id", "str"), Field("task", "str"), Field("policy", "str"), Field("lam", "number"),
    Field("kl", "str"), Field("lr", "number"), Field("seed", "int"), Field("dtype", "str"),
    Field("grid_lr", "number", required=False),  # the grid.lrs entry whose role lr plays (grid.task_lrs)
    Field("grad_clip", "number", nullable=True),
    Field("accuracy", "number", finite=True), Field("base_accuracy", "number", finite=True),
    Field("pass_at_10", "number", nullable=True, required=False),  # only when eval.pass_n >= 10
    Field("forgetting", "number", finite=True), Field("sparsity", "number", finite=True),
    Field("collapsed", "bool"), Field("wall_s", "number"),
)
RUN_HISTORY = (Field("step", "int"), Field("loss", "number"))  # loss: NaN at a collapse
RLVR_METRICS = (
    Field("start", "str"), Field("task", "str"), Field("seed", "int"), Field("steps_done", "int"),
    Field("initial_accuracy", "number", nullable=True), Field("final_accuracy", "number", nullable=True),
    Field("collapsed", "bool"), Field("wall_s", "number"),
)
RLVR_HISTORY = (Field("step", "int"), Field("reward_mean", "number"))
SCHEMAS = {"run": (RUN_METRICS, RUN_HISTORY), "rlvr": (RLVR_METRICS, RLVR_HISTORY)}

_TYPE_NAMES = {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false"}


def _has_type(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, {"str": str, "int": int, "number": (int, float)}[kind])


def field_problems(record: Any, fields: tuple[Field, ...], where: str) -> list[str]:
    """What ``record`` (a parsed JSON value) lacks against ``fields``, one phrase each ([] when
    nothing): a missing field, a value of the wrong type, a measured value that is not finite."""
    if not isinstance(record, dict):
        return [f"{where} holds {type(record).__name__ if record is not None else 'null'}, not an object"]
    out = []
    for f in fields:
        if f.name not in record:
            if f.required:
                out.append(f"{where}: {f.name!r} is missing")
            continue
        value = record[f.name]
        if value is None:
            if not f.nullable:
                out.append(f"{where}: {f.name!r} is null, expected {_TYPE_NAMES[f.type]}")
        elif not _has_type(value, f.type):
            out.append(f"{where}: {f.name!r} is {value!r}, expected {_TYPE_NAMES[f.type]}")
        elif f.finite and not math.isfinite(value):
            out.append(f"{where}: {f.name!r} is {value!r}, not a finite number")
    return out


def metrics_problems(metrics: Any, kind: str = "run") -> list[str]:
    """``field_problems`` of a parsed ``metrics.json`` of a ``kind`` record."""
    return field_problems(metrics, SCHEMAS[kind][0], "metrics.json")


def history_problems(history: Any, kind: str = "run") -> list[str]:
    """What a parsed ``history.json`` lacks: a list with one object per step, each with the
    fields of its kind (the first faulty entry is named)."""
    if not isinstance(history, list):
        return [f"history.json holds {type(history).__name__ if history is not None else 'null'}, not a list"]
    for i, entry in enumerate(history):
        problems = field_problems(entry, SCHEMAS[kind][1], f"history.json entry {i}")
        if problems:
            return problems
    return []


def _read(path: Path) -> tuple[Any, str | None]:
    """(parsed JSON, None) or (None, why it is not a record file)."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as e:  # ValueError: truncated or not JSON, not UTF-8
        return None, f"{path.name} is not whole JSON ({type(e).__name__})"


def record_problems(run_dir: str | Path, kind: str = "run") -> list[str]:
    """Why the run in ``run_dir`` is not complete, one phrase each ([]: it is): its
    ``metrics.json`` and ``history.json`` must parse and hold the fields of ``kind``."""
    run_dir = Path(run_dir)
    out = []
    for name, check in (("metrics.json", metrics_problems), ("history.json", history_problems)):
        value, why = _read(run_dir / name)
        out += [why] if why else check(value, kind)
    return out


def only_nonfinite(problems: list[str]) -> bool:
    """True when every problem is a measured value that is not finite (a run whose arithmetic
    failed, not a record written wrong)."""
    return bool(problems) and all(p.endswith("not a finite number") for p in problems)


def columns(kind: str = "run") -> tuple[str, ...]:
    """The fields of a ``kind`` metrics record, in order: the results table's first columns."""
    return tuple(f.name for f in SCHEMAS[kind][0])
