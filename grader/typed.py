"""Dataclasses from plain data and back: the one validator of the rubric, the course policy, the
cluster profiles (slurm/profile.py) and the re-run protocol's messages, and the one `plain` that
makes results JSON-ready.

    build(Check, {"world_size": 4, ...}, "grader/rubric.yaml.checks[0]", RubricError) -> Check(...)
    plain(Check(...)) -> {"name": "default", "world_size": 4, ...}

`build` refuses a key the dataclass has no field for ("unknown key 'x'; valid keys: ...", with
`suggest` also "(did you mean 'y'?)"), a missing required field, and a value of the wrong type,
each as one line of the caller's error class that starts with `where` (the file, then the key's
path in it). Types it checks: bool, int, float, str, Enum, Optional and unions (`int | str`: the
first that takes the value), list[T], tuple[T, ...], dict[K, V] and nested dataclasses; another
annotation (a bare `list`, `datetime`, `Path`) takes the value as it is, for the caller to check.
A whole number is never a bool; a mapping key may be a whole number written as text, as JSON
writes keys. A field's metadata may add `check`, a function that returns the value (normalised)
or raises ValueError saying what the value must be ("a whole number >= 1": "...: must be a whole
number >= 1, not 0"), and `help`, what the key is for, which every message about the key ends with.

Why a helper and not pydantic, msgspec or cattrs: the three users need about 80 lines, the grader
runs inside the sandbox where every import is staged by hand (grader.rerun.bwrap.ENGINE), and a
rank's messages must be decoded with nothing imported that hand-in code could reach through the
interpreter; a dependency would add a compiled wheel per Python version for what these lines do.
"""

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from enum import Enum
from typing import Union


@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple:
    """(name, type, required, metadata) of each field of dataclass `cls`, its type hints resolved once."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name],
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.metadata)
                 for f in dataclasses.fields(cls))


def resolve(cls) -> None:
    """Resolve the type hints of dataclass `cls` and of every dataclass its fields hold, now: a
    process that forks (the re-run's zygote) does it once for all its children, each of which would
    otherwise pay for it again (about 0.2 ms a class)."""
    kinds = [cls]
    while kinds:
        kind = kinds.pop()
        _form(kind)
        if dataclasses.is_dataclass(kind) and isinstance(kind, type):
            _names(kind)
            kinds += [hint for _, hint, _, _ in _fields(kind)]
        else:
            kinds += typing.get_args(kind)


def refuse_unknown(data: dict, allowed, where: str, error=ValueError, suggest: bool = False) -> None:
    """`error` naming the first key of `data` that is not in `allowed`, with the allowed ones (and,
    with `suggest`, the allowed key it most likely meant)."""
    unknown = sorted(str(k) for k in set(data) - set(allowed))
    if unknown:
        key = unknown[0][:60]
        close = ([k for k in allowed if len(key) >= 3 and (key in k or k in key)]
                 or difflib.get_close_matches(key, list(allowed), n=1)) if suggest else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise error(f"{where}: unknown key '{key}'{hint}; valid keys: {', '.join(allowed)}")


def build(cls, data, where: str, error=ValueError, ignore=(), suggest: bool = False):
    """Dataclass `cls` from the mapping `data`; `error` (one line, starting with `where`) on an
    unknown key (but those in `ignore`; with `suggest`, naming the key it most likely meant), a
    missing required field, a value of the wrong type or one its field's `check` refuses."""
    fields = _fields(cls)
    names = [name for name, _, _, _ in fields]
    if not isinstance(data, dict):
        raise error(f"{where}: expected a mapping of {', '.join(names)}")
    if len(data) > len(names) + len(ignore) or not set(data) <= set(names).union(ignore):
        refuse_unknown({k: v for k, v in data.items() if k not in ignore}, names, where, error, suggest)
    values = {}
    for name, kind, required, metadata in fields:
        if name in data:
            values[name] = _field(kind, data[name], f"{where}.{name}", error, metadata)
        elif required:
            raise error(f"{where}: '{name}' is missing; expected {', '.join(names)}")
    return cls(**values)


def _field(kind, value, where: str, error, metadata):
    """One field's value converted as `kind` and passed through its metadata's `check`; a message
    about it ends with its metadata's `help`."""
    about = f" ({where.rsplit('.', 1)[-1]}: {metadata['help']})" if "help" in metadata else ""
    try:
        value = convert(kind, value, where, error)
    except error as e:
        raise error(f"{e}{about}") from None
    if value is not None and "check" in metadata:
        try:
            value = metadata["check"](value)
        except ValueError as e:
            raise error(f"{where}: must be {e}, not {_shown(value)}{about}") from None
    return value


def convert(kind, value, where: str, error=ValueError, key: bool = False):
    """`value` checked (and converted: an int to a float, a text to an Enum) as annotation `kind`."""
    form, args = _form(kind)
    if form is Union:
        return _union(args, value, where, error, key)
    if form is dataclasses.dataclass:
        return build(kind, value, where, error)
    if form is Enum:
        try:
            return kind(value)
        except (ValueError, TypeError):
            raise error(f"{where}: {str(value)[:60]!r} is not one of {', '.join(str(m.value) for m in kind)}") from None
    if form is list:
        if not isinstance(value, list):
            raise error(f"{where}: expected a list, got {type(value).__name__}")
        return [convert(args[0], v, f"{where}[{i}]", error) for i, v in enumerate(value)] if args else value
    if form is tuple:
        if not isinstance(value, (list, tuple)):
            raise error(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert(args[0], v, f"{where}[{i}]", error) for i, v in enumerate(value))
        return tuple(value)
    if form is dict:
        if not isinstance(value, dict):
            raise error(f"{where}: expected a mapping, got {type(value).__name__}")
        if not args:
            return value
        return {convert(args[0], k, f"{where} key", error, key=True):
                convert(args[1], v, f"{where}.{str(k)[:40]}", error) for k, v in value.items()}
    return _scalar(kind, value, where, error, key)


def _form(kind) -> tuple:
    """(what annotation `kind` is: Union, dataclasses.dataclass, Enum, list, tuple, dict or None for
    a scalar or anything else; its arguments), worked out once per annotation."""
    try:
        return _forms(kind)
    except TypeError:   # an annotation that cannot be a key: worked out each time
        return _forms.__wrapped__(kind)


@functools.lru_cache(maxsize=None)
def _forms(kind) -> tuple:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union or origin is types.UnionType:
        return Union, args
    if dataclasses.is_dataclass(kind):
        return dataclasses.dataclass, args
    if isinstance(kind, type) and issubclass(kind, Enum):
        return Enum, args
    for form in (list, tuple, dict):
        if origin is form or kind is form:
            return form, args
    return None, args


def _union(args: tuple, value, where: str, error, key: bool):
    """`value` as the first of the union's kinds it converts to (None where the union allows it)."""
    if value is None and type(None) in args:
        return None
    kinds = [a for a in args if a is not type(None)]
    for each in kinds[:-1]:
        try:
            return convert(each, value, where, error, key)
        except error:
            pass
    try:
        return convert(kinds[-1], value, where, error, key)
    except error:
        if len(kinds) == 1:
            raise
    raise error(f"{where}: expected {' or '.join(map(_describe, kinds))}, got {_shown(value)}")


def _scalar(kind, value, where: str, error, key: bool):
    """`value` checked as bool, int, float or str (anything else is taken as it is)."""
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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                isinstance(value, int) and abs(value) > FLOAT_MAX:   # a whole number past any float
            raise error(f"{where}: expected a number, got {_shown(value)}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise error(f"{where}: expected text, got {_shown(value)}")
        return value
    return value


def _describe(kind) -> str:
    """What a value of annotation `kind` is, in a message's words."""
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    origin = typing.get_origin(kind) or kind
    return words.get(kind) or {list: "a list", tuple: "a list", dict: "a mapping"}.get(origin, getattr(kind, "__name__", str(kind)))


def _shown(value) -> str:
    """A wrong value as a message shows it: short, whatever sent it."""
    return repr(value)[:60] if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__


@functools.lru_cache(maxsize=None)
def _names(cls):
    """The field names of dataclass `cls`, None for any other type."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def plain(value, finite: bool = False):
    """`value` made JSON-ready: dataclasses as mappings of their fields, enums as their values,
    mapping keys as text, tuples as lists; with `finite`, inf and nan as the text "inf", "nan"
    (strict JSON has no such numbers)."""
    if value is None or type(value) in (str, int, bool):   # most of what a message holds: as it is
        return value
    if isinstance(value, Enum):
        return value.value
    if finite and isinstance(value, float) and not math.isfinite(value):
        return str(value)
    names = _names(type(value))
    if names is not None:
        return {name: plain(getattr(value, name), finite) for name in names}
    if isinstance(value, dict):
        return {str(plain(k, finite)): plain(v, finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, finite) for v in value]
    return value


FLOAT_MAX = int(1.7976931348623157e308)
SURROGATES = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value):
    """`value` (JSON read, or a part of it) with every lone surrogate of its strings, keys too,
    replaced by U+FFFD: a page, CSV or log written from it cannot fail on it."""
    if isinstance(value, str):
        return SURROGATES.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    return value
