"""Dataclasses from plain data and back: the one validator of the rubric, the course policy and the
re-run protocol's messages, and the one `plain` that makes results JSON-ready.

    build(Check, {"world_size": 4, ...}, "grader/rubric.yaml.checks[0]", RubricError) -> Check(...)
    plain(Check(...)) -> {"name": "default", "world_size": 4, ...}

`build` refuses a key the dataclass has no field for ("unknown key 'x'; valid keys: ..."), a
missing required field, and a value of the wrong type, each as one line of the caller's error
class that starts with `where` (the file, then the key's path in it). Types it checks: bool, int,
float, str, Enum, Optional, list[T], dict[K, V] and nested dataclasses; another annotation (a
bare `list`, `datetime`, `Path`) takes the value as it is, for the caller to check. A whole
number is never a bool; a mapping key may be a whole number written as text, as JSON writes keys.

Why a helper and not pydantic, msgspec or cattrs: the three users need about 80 lines, the grader
runs inside the sandbox where every import is staged by hand (grader.rerun.bwrap.ENGINE), and a
rank's messages must be decoded with nothing imported that hand-in code could reach through the
interpreter; a dependency would add a compiled wheel per Python version for what these lines do.
"""

import dataclasses
import functools
import math
import typing
from enum import Enum
from typing import Union


@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple:
    """(name, type, required) of each field of dataclass `cls`, its type hints resolved once."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name],
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


def refuse_unknown(data: dict, allowed, where: str, error=ValueError) -> None:
    """`error` naming the first key of `data` that is not in `allowed`, with the allowed ones."""
    unknown = sorted(str(k) for k in set(data) - set(allowed))
    if unknown:
        raise error(f"{where}: unknown key '{unknown[0][:60]}'; valid keys: {', '.join(allowed)}")


def build(cls, data, where: str, error=ValueError, ignore=()):
    """Dataclass `cls` from the mapping `data`; `error` (one line, starting with `where`) on an
    unknown key (but those in `ignore`), a missing required field or a value of the wrong type."""
    fields = _fields(cls)
    if not isinstance(data, dict):
        raise error(f"{where}: expected a mapping of {', '.join(name for name, _, _ in fields)}")
    names = [name for name, _, _ in fields]
    if len(data) > len(names) + len(ignore) or not set(data) <= set(names).union(ignore):
        refuse_unknown({k: v for k, v in data.items() if k not in ignore}, names, where, error)
    values = {}
    for name, kind, required in fields:
        if name in data:
            values[name] = convert(kind, data[name], f"{where}.{name}", error)
        elif required:
            raise error(f"{where}: '{name}' is missing; expected {', '.join(names)}")
    return cls(**values)


def convert(kind, value, where: str, error=ValueError, key: bool = False):
    """`value` checked (and converted: an int to a float, a text to an Enum) as annotation `kind`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        return convert(next(a for a in args if a is not type(None)), value, where, error, key)
    if dataclasses.is_dataclass(kind):
        return build(kind, value, where, error)
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except (ValueError, TypeError):
            raise error(f"{where}: {str(value)[:60]!r} is not one of {', '.join(str(m.value) for m in kind)}") from None
    if origin is list or kind is list:
        if not isinstance(value, list):
            raise error(f"{where}: expected a list, got {type(value).__name__}")
        return [convert(args[0], v, f"{where}[{i}]", error) for i, v in enumerate(value)] if args else value
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise error(f"{where}: expected a mapping, got {type(value).__name__}")
        if not args:
            return value
        return {convert(args[0], k, f"{where} key", error, key=True):
                convert(args[1], v, f"{where}.{str(k)[:40]}", error) for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise error(f"{where}: expected true or false, got {_shown(value)}")
        return value
    if kind is int:
        if key and isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 20:
            return int(value)   # JSON writes every mapping key as text
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{where}: expected a whole number, got {_shown(value)}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"{where}: expected a number, got {_shown(value)}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise error(f"{where}: expected text, got {_shown(value)}")
        return value
    return value


def _shown(value) -> str:
    """A wrong value as a message shows it: short, whatever sent it."""
    return repr(value)[:60] if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__


def plain(value, finite: bool = False):
    """`value` made JSON-ready: dataclasses as mappings of their fields, enums as their values,
    mapping keys as text, tuples as lists; with `finite`, inf and nan as the text "inf", "nan"
    (strict JSON has no such numbers)."""
    if isinstance(value, Enum):
        return value.value
    if finite and isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), finite) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(plain(k, finite)): plain(v, finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, finite) for v in value]
    return value
