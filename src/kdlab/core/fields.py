"""Settings fields that carry their own rule: a default, a type and a range, declared once.

A settings dataclass (the profile's sections in ``kdlab.study.config``, the engine's
``DistillSettings`` / ``RLVRSettings`` / ``RunConfig``) declares each field with ``setting(...)``:
its one default and its one rule (choices, bounds, a size bound from ``BOUNDS``). The same rule
checks a value read from a profile (``check_value``, with light coercion: YAML reads ``1e-4`` as
a string) and a dataclass built in code (``check_fields``, called from ``__post_init__``), so a
field has one rule wherever it is set. Nothing here imports from kdlab.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A parameter file, override or setting is invalid; the message names the key and the value."""


# Upper bounds of sizes, one per kind of size, each with its reason: a larger value has no sensible
# meaning in a study (a typo or a unit slip, such as --set distill.steps=100000000) and is refused
# before any work. A field names its kind with ``bound=``.
BOUNDS: dict[str, tuple[int, str]] = {
    "steps": (100_000, "optimisation steps: the paper distils for 150 and runs GRPO for 300; kdlab's longest "
                       "recipe, the 8,000-step countdown-3 teacher, takes three hours on a CPU"),
    "batch": (4_096, "rows per optimisation step: the paper uses 32 prompts, kdlab's pretraining 64; 4,096 rollouts "
                     "of the paper's 2,000-token traces do not fit in one GPU's memory"),
    "tokens": (32_768, "tokens in one prompt or response: the paper's traces are at most 2,000 tokens and the "
                       "longest context of the models it studies (Qwen2.5) is 32,768"),
    "problems": (100_000, "problems or rollouts: twenty times the 5,000 training problems a run draws from "
                          "(kdlab.study.runs.TRAIN_POOL) and far beyond any test set kdlab reads"),
    "samples": (1_024, "samples per problem: the paper's coverage is pass@10 from 16 samples"),
}

# The one rule of a learning rate (every optimiser kdlab sets up: distillation, SFT, GRPO).
LEARNING_RATE = dict(lo=0.0, lo_open=True, hi=1.0)


def setting(default: Any = dataclasses.MISSING, *, choices: tuple | None = None, lo: float | None = None,
            hi: float | None = None, factory: Any = None, doc: str = "", lo_open: bool = False,
            bound: str | None = None, kw_only: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its rule in its metadata (for a list, the rule holds for each item)."""
    assert bound is None or bound in BOUNDS, bound
    meta = {"choices": choices, "lo": lo, "hi": hi, "doc": doc, "lo_open": lo_open, "bound": bound}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta, kw_only=kw_only)
    return dataclasses.field(default=default, metadata=meta, kw_only=kw_only)


def check_range(key: str, value: Any, meta: Any) -> None:
    """``ConfigError`` naming ``key`` when ``value`` (or an item of it) breaks the rule in ``meta``."""
    items = value if isinstance(value, list) else [value]
    for v in items:
        if v is None:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key}: {v!r} is not a finite number")
        if meta.get("choices") and v not in meta["choices"]:
            raise ConfigError(f"{key}: {v!r} is not a valid choice; choose from {list(meta['choices'])}")
        if meta.get("lo_open") and v <= meta["lo"]:
            raise ConfigError(f"{key}: {v!r} must be above {meta['lo']}" +
                              (f" and at most {meta['hi']}" if meta.get("hi") is not None else ""))
        if meta.get("lo") is not None and v < meta["lo"]:
            raise ConfigError(f"{key}: {v!r} is below the minimum {meta['lo']}")
        if meta.get("hi") is not None and v > meta["hi"]:
            raise ConfigError(f"{key}: {v!r} is above the maximum {meta['hi']}")
        if meta.get("bound") is not None:
            check_bound(key, v, meta["bound"])


def check_bound(key: str, value: Any, kind: str) -> None:
    """``ConfigError`` when ``value`` is above the bound of its kind of size (``BOUNDS``)."""
    top, why = BOUNDS[kind]
    if value > top:
        raise ConfigError(f"{key}: {value!r} is above the bound {top:,} ({why})")


def coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Check (and lightly coerce) ``value`` against a type hint; returns (ok, value)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = coerce(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if origin is dict:
        return isinstance(value, dict), value
    if origin is list:
        if not isinstance(value, list):
            return False, value
        (arg,) = typing.get_args(tp)
        out = []
        for item in value:
            ok, v = coerce(item, arg)
            if not ok:
                return False, value
            out.append(v)
        return True, out
    return isinstance(value, tp), value


def type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def check_value(key: str, value: Any, tp: Any, meta: Any) -> Any:
    """``value`` checked against its field's type and rule (and coerced); ``ConfigError`` names ``key``."""
    ok, value = coerce(value, tp)
    if not ok:
        raise ConfigError(f"{key}: {value!r} has the wrong type; expected {type_name(tp)}")
    check_range(key, value, meta)
    return value


def check_fields(obj: Any, path: str = "") -> None:
    """Every plain field of dataclass ``obj`` checked in place by its rule (``check_value``): what
    a settings dataclass's ``__post_init__`` calls, so a value set in code meets the same rule as
    one read from a profile. Nested dataclasses are checked where they are built."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) or (isinstance(value, list) and value and dataclasses.is_dataclass(value[0])):
            continue
        setattr(obj, f.name, check_value(path + f.name, value, hints[f.name], f.metadata))
