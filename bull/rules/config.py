"""Shared configuration plumbing: one error type, one way to read settings.

Every variant's config is a frozen dataclass built from a *settings* mapping of
dotted keys (``multipliers.bomb``) to raw values. The raw values come from three
places that must agree on names and spelling: a JSON or TOML file, repeated
``--set key=value`` strings on the command line, and plain Python mappings in
code and tests. This module turns all three into one flat ``dict`` so each
variant validates a single shape, and it provides the value parsers so every
variant reports a bad value the same way: a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

Settings = Mapping[str, object]


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; ``key`` names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key


class ConfigFileError(ValueError):
    """A settings file that cannot be read or is not a table of settings; ``path`` names it."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"config file {str(path)!r}: {problem}")
        self.path = str(path)


def shown(value: object) -> str:
    """A value as the user wrote it, cut short: an error must not echo ``1e400`` as 401 digits."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def flatten(settings: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested tables (``{"multipliers": {"bomb": 4}}``) become dotted keys."""
    flat: dict[str, object] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def parse_sets(items: Iterable[str]) -> dict[str, object]:
    """``["mode=stake_capped", "multipliers.bomb=5"]`` -> flat settings (strings)."""
    flat: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "expected key=value")
        flat[key.strip()] = value.strip()
    return flat


def load_file(path: str | Path) -> dict[str, object]:
    """Read a ``.json`` or ``.toml`` settings file into flat settings."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read it: {exc.strerror}") from exc
    try:
        data: object = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigFileError(path, f"not valid {file.suffix.lstrip('.') or 'json'}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigFileError(path, "top level must be a table/object")
    return flatten(data)


def merge(file_path: str | Path | None, sets: Iterable[str]) -> dict[str, object]:
    """File settings first, ``--set`` strings override them (the CLI's precedence)."""
    flat = load_file(file_path) if file_path is not None else {}
    flat.update(parse_sets(sets))
    return flat


def check_keys(settings: Settings, allowed: Iterable[str]) -> dict[str, object]:
    """Flatten and reject unknown keys, so a typo never silently keeps a default."""
    flat = flatten(settings)
    known = set(allowed)
    for key in flat:
        if key not in known:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(known))})")
    return flat


def as_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"false", "0", "no", "off"}:
        return False
    raise ConfigError(key, f"expected true or false, not {value!r}")


def as_int(key: str, value: object, *, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected an integer, not {value!r}")
    try:
        number = int(value) if isinstance(value, int | str) else None
    except ValueError:
        number = None
    if number is None:
        raise ConfigError(key, f"expected an integer, not {shown(value)}")
    if not low <= number <= high:
        raise ConfigError(key, f"must be between {low} and {high}, not {shown(value)}")
    return number


def as_fraction(key: str, value: object, *, low: Fraction, high: Fraction) -> Fraction:
    """An exact rational from ``3``, ``"2.5"``, ``"5/2"`` (floats go through their repr)."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a number, not {value!r}")
    try:
        if isinstance(value, int | Fraction):
            number = Fraction(value)
        elif isinstance(value, float | Decimal):
            number = Fraction(Decimal(repr(value)) if isinstance(value, float) else value)
        elif isinstance(value, str):
            number = Fraction(value.strip())
        else:
            raise ConfigError(key, f"expected a number, not {value!r}")
    except (ValueError, ZeroDivisionError, InvalidOperation) as exc:
        raise ConfigError(key, f"expected a number like 3, 2.5 or 5/2, not {shown(value)}") from exc
    if not low <= number <= high:
        raise ConfigError(key, f"must be between {low} and {high}, not {shown(value)}")
    return number


def as_choice(key: str, value: object, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if isinstance(value, str) and value.strip() in options:
        return value.strip()
    raise ConfigError(key, f"expected one of {', '.join(options)}, not {value!r}")
