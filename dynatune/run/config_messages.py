"""A config's problems as one-line messages: pydantic's validation errors turned into ``key.path: message``
lines (``budget_s: must be > 0, got -5``, ``slot: unknown key (did you mean 'slot_s'?)``), and the
renderings of values those messages use. :mod:`dynatune.run.config` joins the lines into one error."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

import typing_extensions
from pydantic import BaseModel, ValidationError

from dynatune.search.section import CONFIG_ERROR


def problem_lines(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """pydantic's errors for the config model ``root`` as ``key.path: message`` lines."""
    out: list = []
    missing: dict[tuple, list[str]] = {}  # parent's loc -> missing keys, one line per parent
    for e in exc.errors(include_url=False):
        loc, kind, value, ctx = tuple(e["loc"]), e["type"], e.get("input"), e.get("ctx") or {}
        path = key_path(loc)
        if kind == CONFIG_ERROR:  # a validator's own check: one problem or several, under this path
            out += [f"{path}{at}: {msg}" for at, msg in ctx["at"]]
        elif kind in ("extra_forbidden", "invalid_key"):  # invalid_key: not a string (its input is the key)
            key = value if kind == "invalid_key" else loc[-1]
            where = join_key(key_path(loc[:-1]), key)
            out.append(f"{where}: unknown key ({_suggest((*loc[:-1], key), root)})")
        elif kind == "missing":
            if loc[:-1] not in missing:
                missing[loc[:-1]] = []
                out.append(loc[:-1])  # the line goes here, written below
            missing[loc[:-1]].append(str(loc[-1]))
        else:
            out.append(f"{path}: {_message(loc, kind, value, e['msg'], root)}")
    return [
        f"{key_path(x) or 'config'}: missing {', '.join(missing[x])}" if isinstance(x, tuple) else x
        for x in out
    ]


def _message(loc: tuple, kind: str, v, fallback: str, root) -> str:
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping, got {describe(v)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {describe(v)}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        if kind == "finite_number" or (isinstance(v, int) and not isinstance(v, bool)):  # 10**400
            return f"must be a finite number, got {short(v)}"
        return f"must be a number, got {describe(v)}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {describe(v)}"
    if kind == "string_type":
        node = _node(loc, root)
        what = "a string or null" if node is not None and node[2] else "a string"
        return f"must be {what}, got {describe(v)}{quote_hint(v)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _bounds_message(loc, v, root)
    return one_line(fallback)


def _bounds_message(loc: tuple, v, root) -> str:
    """A bound's problem, with the setting's whole range (``must be in (0, 1)``), not just the bound."""
    tp, meta, _ = _node(loc, root) or (float, [], False)
    b = {k: getattr(m, k) for m in meta for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None}
    gt, ge, lt, le = b.get("gt"), b.get("ge"), b.get("lt"), b.get("le")
    got = short(v)
    if tp is int:
        lo = ge if ge is not None else (gt + 1 if gt is not None else None)
        hi = le if le is not None else (lt - 1 if lt is not None else None)
        if lo is not None and hi is not None:
            return f"must be in [{lo}, {hi}], got {got}"
        return f"must be >= {lo}, got {got}" if lo is not None else f"must be <= {hi}, got {got}"
    lo, hi = (gt if gt is not None else ge), (lt if lt is not None else le)
    if lo is not None and hi is not None:
        left, right = ("(" if gt is not None else "["), (")" if lt is not None else "]")
        return f"must be in {left}{number(lo)}, {number(hi)}{right}, got {got}"
    if lo is not None:
        return f"must be {'>' if gt is not None else '>='} {number(lo)}, got {got}"
    return f"must be {'<' if lt is not None else '<='} {number(hi)}, got {got}"


def _suggest(loc: tuple, root) -> str:
    key, known = loc[-1], list(_fields_of((_node(loc[:-1], root) or (None,))[0]) or {})
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
    return f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(known)}"


def _node(loc: tuple, root):
    """``(type, constraints, nullable)`` of the setting at ``loc`` (the config ``root`` itself at ``()``);
    None where ``loc`` leads out of the config's models."""
    node = (root, [], False)
    for key in loc:
        fields = _fields_of(node[0])
        if not fields or key not in fields:
            return None
        node = _unwrap(*fields[key])
    return node


def _fields_of(tp) -> dict[str, tuple[Any, list]] | None:
    """A section's settings, ``{name: (annotation, constraints)}``; None for a plain value."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: (f.annotation, list(f.metadata)) for name, f in tp.model_fields.items()}
    if typing_extensions.is_typeddict(tp):
        return {
            name: (hint, [])
            for name, hint in typing_extensions.get_type_hints(tp, include_extras=True).items()
        }
    return None


def _unwrap(annotation, meta: list):
    nullable = False
    while True:
        origin, args = typing_extensions.get_origin(annotation), typing_extensions.get_args(annotation)
        if origin is typing_extensions.Annotated:
            annotation = args[0]
            meta = [*meta, *(m for a in args[1:] for m in getattr(a, "metadata", [a]))]
        elif origin in (typing_extensions.Required, typing_extensions.NotRequired):
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType) and type(None) in args:
            nullable = True
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                break
            annotation = rest[0]
        else:
            break
    return annotation, meta, nullable


# -- values in messages ----------------------------------------------------------------------------
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def join_key(path: str, key) -> str:
    k = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) and len(key) <= 60 else short(key)
    return f"{path}.{k}" if path else k


def dotted(key) -> str:
    """A key's part of a path under a setting: ``.name``."""
    return "." + join_key("", key)


def key_path(loc: tuple) -> str:
    """pydantic's ``loc`` as a key path: ``measure.rel_tol``."""
    path = ""
    for key in loc:
        path = join_key(path, key)
    return path


def number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def one_line(text: str) -> str:
    """One line, whatever the text holds."""
    return " ".join(str(text).split())


def short(v, limit: int = 60) -> str:
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
    s = one_line(s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def describe(v) -> str:
    """The kind of a value and the value itself, for type errors."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({short(v)})"
    if isinstance(v, int):
        return f"an integer ({short(v)})"
    if isinstance(v, float):
        return f"a float ({short(v)})"
    if isinstance(v, str):
        return f"a string ({short(v)})"
    if isinstance(v, dict):
        return f"a mapping ({short(v)})"
    if isinstance(v, (list, tuple)):
        return f"a list ({short(v)})"
    return f"a {type(v).__name__} ({short(v)})"


def quote_hint(v) -> str:
    """For a number or a date where a string was expected: YAML read it as one."""
    return " (quote it)" if isinstance(v, (int, float)) or type(v).__module__ == "datetime" else ""
