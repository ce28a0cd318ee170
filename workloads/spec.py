"""The compact ``name:key=value,...`` grammar shared by workload specs and format mappings.

Grammar (whitespace around tokens is ignored)::

    spec   := NAME [ ":" [ param ( "," param )* ] ]
    param  := KEY "=" value
    value  := ATOM | NAME "(" [ arg ( "," arg )* ] ")"
    arg    := ATOM | KEY "=" ATOM
    NAME, KEY := [A-Za-z_][A-Za-z0-9_-]*
    ATOM   := any text without "," "(" ")" "=" (a number, a word, a column name with spaces)

Commas inside parentheses belong to the call: ``prompt=lognormal(500,0.6),rate=5`` has two
params. Examples: ``sharegpt:rate=2,n=1000,seed=0``,
``synthetic:prompt=lognormal(mean=500,sigma=0.6),output=fixed(128),arrival=gamma(cv=2)``,
``generic:arrival=ts,prompt=Request tokens,output=Response tokens,time_unit=ms``.

This module only parses; what keys exist and what values mean is checked by the caller
(``workloads.synthetic``, ``workloads.loaders``), which names the offending key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kvsim.errors import InputError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


@dataclass(frozen=True)
class Call:
    """A value written as ``name(arg, key=arg, ...)``; ``inner`` is the raw text in the parens."""

    name: str
    args: tuple[str, ...]
    kwargs: tuple[tuple[str, str], ...]
    inner: str


Value = str | Call


@dataclass(frozen=True)
class Spec:
    """A parsed spec: ``name`` and ``params`` (key -> value, in the written order)."""

    name: str
    params: dict[str, Value]
    text: str

    def error(self, key: str, message: str) -> InputError:
        """An InputError about ``key`` of this spec."""
        return InputError(f"{message} (in '{self.text}')", field=key)

    def check_keys(self, allowed: set[str] | frozenset[str]) -> None:
        """Raise InputError naming the first key not in ``allowed``."""
        for key in self.params:
            if key not in allowed:
                raise self.error(key, f"unknown key for '{self.name}'; valid keys: "
                                      f"{', '.join(sorted(allowed))}")


def split_top(text: str, spec_text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise InputError(f"unbalanced ')' at column {i + 1} of spec '{spec_text}'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise InputError(f"unbalanced '(' in spec '{spec_text}'")
    parts.append(text[start:])
    return parts


def _parse_value(raw: str, key: str, spec_text: str) -> Value:
    raw = raw.strip()
    if "(" not in raw:
        if not raw or "=" in raw or ")" in raw:
            raise InputError(f"bad value {raw!r} (in '{spec_text}')", field=key)
        return raw
    if not raw.endswith(")"):
        raise InputError(f"bad value {raw!r}: text after ')' (in '{spec_text}')", field=key)
    name, inner = raw[:raw.index("(")].strip(), raw[raw.index("(") + 1:-1]
    if not _NAME.match(name):
        raise InputError(f"bad function name {name!r} (in '{spec_text}')", field=key)
    args: list[str] = []
    kwargs: list[tuple[str, str]] = []
    if inner.strip():
        for part in split_top(inner, spec_text):
            part = part.strip()
            if "(" in part or not part:
                raise InputError(f"bad argument {part!r} of {name}() (in '{spec_text}')",
                                 field=key)
            if "=" in part:
                k, v = (s.strip() for s in part.split("=", 1))
                if not _NAME.match(k) or not v or "=" in v:
                    raise InputError(f"bad argument {part!r} of {name}() (in '{spec_text}')",
                                     field=key)
                if kwargs and k in dict(kwargs):
                    raise InputError(f"argument {k!r} of {name}() given twice "
                                     f"(in '{spec_text}')", field=key)
                kwargs.append((k, v))
            elif kwargs:
                raise InputError(f"positional argument {part!r} after a named one in "
                                 f"{name}() (in '{spec_text}')", field=key)
            else:
                args.append(part)
    return Call(name, tuple(args), tuple(kwargs), inner)


def parse_spec(text: str) -> Spec:
    """Parse ``name[:key=value,...]``.

    Args:
        text: the spec.
    Returns:
        Spec with the params in written order.
    Raises:
        InputError: bad syntax, a repeated key, unbalanced parentheses.
    """
    text = text.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise InputError(f"bad workload spec '{text}': expected name[:key=value,...]")
    params: dict[str, Value] = {}
    if rest.strip():
        for part in split_top(rest, text):
            if not part.strip():
                raise InputError(f"empty parameter in spec '{text}'")
            if "=" not in part:
                raise InputError(f"parameter {part.strip()!r} has no '=' in spec '{text}'")
            key, raw = part.split("=", 1)
            key = key.strip()
            if not _NAME.match(key):
                raise InputError(f"bad key {key!r} in spec '{text}'")
            if key in params:
                raise InputError(f"key given twice (in '{text}')", field=key)
            params[key] = _parse_value(raw, key, text)
    return Spec(name, params, text)


def call_args(spec: Spec, key: str, call: Call, names: tuple[str, ...],
              required: int) -> dict[str, str]:
    """Bind a Call's positional and named arguments to ``names``.

    Args:
        spec: the spec (for error messages).
        key: the key whose value ``call`` is.
        call: the parsed call.
        names: parameter names in positional order.
        required: how many leading names must be given.
    Returns:
        name -> raw text, for the arguments given.
    """
    if len(call.args) > len(names):
        raise spec.error(key, f"{call.name}() takes at most {len(names)} arguments "
                              f"({', '.join(names)}), got {len(call.args)}")
    bound = dict(zip(names, call.args))
    for k, v in call.kwargs:
        if k not in names:
            raise spec.error(key, f"{call.name}() has no argument {k!r}; valid: "
                                  f"{', '.join(names)}")
        if k in bound:
            raise spec.error(key, f"{call.name}() got {k!r} twice")
        bound[k] = v
    missing = [n for n in names[:required] if n not in bound]
    if missing:
        raise spec.error(key, f"{call.name}() needs {', '.join(missing)}")
    return bound


def to_int(spec: Spec, key: str, raw: str, minimum: int) -> int:
    """``raw`` as an int >= minimum, else an InputError naming ``key``."""
    try:
        value = int(raw)
    except ValueError:
        raise spec.error(key, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise spec.error(key, f"must be >= {minimum}, got {value}")
    return value


def to_float(spec: Spec, key: str, raw: str, minimum: float, *, strict: bool = False) -> float:
    """``raw`` as a finite float >= minimum (> minimum if strict), else an InputError."""
    try:
        value = float(raw)
    except ValueError:
        raise spec.error(key, f"expected a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise spec.error(key, f"must be finite, got {raw!r}")
    if value < minimum or (strict and value == minimum):
        raise spec.error(key, f"must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
    return value


def plain(spec: Spec, key: str) -> str:
    """The value of ``key`` as plain text (not a call)."""
    value = spec.params[key]
    if isinstance(value, Call):
        raise spec.error(key, f"expected a plain value, got {value.name}(...)")
    return value
