"""Settings, each defined once: a dataclass field whose metadata says how a config value is checked.

    trials_per_iter: int = setting(16, ge=1)
    cost_model: str = setting("xgb", choices=cost_model_names)

The engine's own dataclasses (``SearchConfig``, ``MeasureConfig``) and the config's sections are made of
such fields; :func:`field_checks` derives each field's check from its type and metadata, so the YAML
schema and the engine can never drift apart. Every check reports a problem as ``key.path: message`` (one
line) and returns the value normalised, or :data:`BAD`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

MAX_SEED = 2**32 - 1


def setting(
    default=dataclasses.MISSING,
    *,
    default_factory=dataclasses.MISSING,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    choices=None,
    check: str | None = None,
):
    """A dataclass field with its checks. ``choices``: names, or a function returning them (a registry);
    ``check``: the name of a custom check (see :func:`field_checks`) for structured values."""
    meta = {
        k: v
        for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices, check=check).items()
        if v is not None
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def field_checks(cls, c: "Checker", custom: dict | None = None) -> dict:
    """``{field name: check(value, path)}`` for every field of dataclass ``cls`` (dataclass-typed fields,
    the config's sections, are left to the caller)."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("section"):
            continue
        out[f.name] = _check_for(f, c, custom or {})
    return out


def _check_for(f, c, custom):
    md = f.metadata
    kind = str(f.type).replace(" ", "")
    nullable = kind.endswith("|None") or kind.startswith("None|")
    base = kind.replace("|None", "").replace("None|", "")
    if "check" in md:
        inner = custom[md["check"]]
    elif base == "bool":
        inner = c.boolean
    elif base == "int":
        lo = md.get("ge", md["gt"] + 1 if "gt" in md else None)
        inner = lambda v, p: c.integer(v, p, lo, md.get("le"))  # noqa: E731
    elif base == "float":
        inner = lambda v, p: c.number(
            v, p, gt=md.get("gt"), ge=md.get("ge"), lt=md.get("lt"), le=md.get("le")
        )  # noqa: E731
    elif base == "str":
        choices = md.get("choices")
        return lambda v, p: c.string(
            v, p, nullable=nullable, choices=tuple(choices()) if callable(choices) else choices
        )
    else:
        raise TypeError(f"setting {f.name}: no check for type {f.type}")
    if nullable:
        return lambda v, p: None if v is None else inner(v, p)
    return inner


class _Bad:
    """Marks a value that failed its check (the problem is already recorded)."""


BAD = _Bad()


class Checker:
    def __init__(self, problems: list[str]):
        self.problems = problems

    def fail(self, path: str, msg: str):
        self.problems.append(f"{path}: {msg}")
        return BAD

    # scalar checks: each returns the value (normalised) or BAD
    def boolean(self, v, path):
        if isinstance(v, bool):
            return v
        return self.fail(path, f"must be true or false, got {_describe(v)}")

    def integer(self, v, path, lo=None, hi=None):
        if isinstance(v, bool) or not isinstance(v, int):
            return self.fail(path, f"must be an integer, got {_describe(v)}")
        if lo is not None and hi is not None and not lo <= v <= hi:
            return self.fail(path, f"must be in [{lo}, {hi}], got {_short(v)}")
        if lo is not None and v < lo:
            return self.fail(path, f"must be >= {lo}, got {_short(v)}")
        return v

    def number(self, v, path, gt=None, ge=None, lt=None, le=None):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return self.fail(path, f"must be a number, got {_describe(v)}")
        try:
            x = float(v)
        except OverflowError:
            return self.fail(path, f"must be a finite number, got {_short(v)}")
        if not math.isfinite(x):
            return self.fail(path, f"must be a finite number, got {_short(v)}")
        lo_ok = (gt is None or x > gt) and (ge is None or x >= ge)
        hi_ok = (lt is None or x < lt) and (le is None or x <= le)
        if not (lo_ok and hi_ok):
            lo = gt if gt is not None else ge
            hi = lt if lt is not None else le
            if lo is not None and hi is not None:
                left, right = ("(" if gt is not None else "["), (")" if lt is not None else "]")
                return self.fail(path, f"must be in {left}{_num(lo)}, {_num(hi)}{right}, got {_short(v)}")
            if lo is not None:
                return self.fail(
                    path, f"must be {'>' if gt is not None else '>='} {_num(lo)}, got {_short(v)}"
                )
            return self.fail(path, f"must be {'<' if lt is not None else '<='} {_num(hi)}, got {_short(v)}")
        return x

    def string(self, v, path, nullable=False, choices=None):
        if v is None and nullable:
            return None
        if not isinstance(v, str):
            what = "a string or null" if nullable else "a string"
            quote = " (quote it)" if isinstance(v, (int, float)) or type(v).__module__ == "datetime" else ""
            return self.fail(path, f"must be {what}, got {_describe(v)}{quote}")
        if choices is not None and v not in choices:
            return self.fail(path, f"must be one of {', '.join(choices)}, got {_short(v)}")
        if not v.strip():
            return self.fail(path, "must not be empty")
        return v

    def plain(self, v, path, _stack=()):
        """Pass-through data: JSON-able (string keys, finite numbers), returned as a copy."""
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else self.fail(path, f"must be a finite number, got {_short(v)}")
        if isinstance(v, (list, dict)):
            if id(v) in _stack:
                return self.fail(path, "is a recursive structure")
            stack = (*_stack, id(v))
            if isinstance(v, list):
                out = [self.plain(x, f"{path}[{i}]", stack) for i, x in enumerate(v)]
                return BAD if any(x is BAD for x in out) else out
            return self.items(v, path, "keys", lambda x, p: self.plain(x, p, stack))
        return self.fail(
            path, f"must be plain data (string, number, bool, null, list, mapping), got {_describe(v)}"
        )

    def items(self, v: dict, path, what_keys: str, check):
        """Each value of mapping ``v`` checked by ``check(value, path)``; keys must be strings."""
        res, bad = {}, False
        for k, x in v.items():
            if not isinstance(k, str):
                self.fail(path, f"{what_keys} must be strings, got {_describe(k)}")
                bad = True
                continue
            y = check(x, _join(path, k))
            bad |= y is BAD
            res[k] = y
        return BAD if bad else res

    def mapping(self, v, path, fields: dict, nullable_section=True):
        """Check a section: known keys only; returns {key: checked value} for the keys present."""
        if v is None and nullable_section:
            return {}
        if not isinstance(v, dict):
            self.fail(path, f"must be a mapping, got {_describe(v)}")
            return None
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or k not in fields:
                self.unknown(path, k, fields)
                continue
            out[k] = fields[k](x, _join(path, k))
        return out

    def unknown(self, path, key, known):
        close = difflib.get_close_matches(key, list(known), n=1) if isinstance(key, str) else []
        hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(known)}"
        self.problems.append(f"{_join(path, key)}: unknown key ({hint})")


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def _join(path: str, key) -> str:
    k = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) and len(key) <= 60 else _short(key)
    return f"{path}.{k}" if path else k


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _clean(text: str) -> str:
    """One line, whatever the text holds."""
    return " ".join(str(text).split())


def _short(v, limit: int = 60) -> str:
    """A one-line, bounded rendering of a value for a message."""
    if v is None:
        s = "null"
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, float):
        s = repr(v)
    elif isinstance(v, int):
        s = str(v) if abs(v) < 10**30 else f"{'-' if v < 0 else ''}<{len(str(abs(v)))}-digit integer>"
    else:
        try:
            s = repr(v)
        except Exception:  # pragma: no cover - exotic objects
            s = f"<{type(v).__name__}>"
    s = _clean(s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _describe(v) -> str:
    """The kind of a value and the value itself, for type errors."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({_short(v)})"
    if isinstance(v, int):
        return f"an integer ({_short(v)})"
    if isinstance(v, float):
        return f"a float ({_short(v)})"
    if isinstance(v, str):
        return f"a string ({_short(v)})"
    if isinstance(v, dict):
        return f"a mapping ({_short(v)})"
    if isinstance(v, (list, tuple)):
        return f"a list ({_short(v)})"
    return f"a {type(v).__name__} ({_short(v)})"
