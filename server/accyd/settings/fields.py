"""Declaring a daemon setting once: its flag, its environment variable and its default.

A setting is a dataclass field whose metadata holds a ``Setting`` (made with
``setting(...)``). From it come the ``ACCYD_<FIELD>`` environment variable,
the command-line flag (``--<field-name>`` unless it names another) and the
``--help`` line, which shows both names and the default. The environment and
the flag go through the same parser, so they accept the same text; a flag may
take another unit (microseconds for a setting kept in seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_PREFIX",
    "Bound",
    "Setting",
    "add_flags",
    "bool_text",
    "choice",
    "flag_values",
    "from_environment",
    "optional",
    "setting",
    "settings_of",
    "size",
]

ENV_PREFIX = "ACCYD_"
_METADATA_KEY = "accyd.setting"


@dataclass(frozen=True, slots=True)
class Setting:
    """How one setting is read from text, and how ``--help`` shows it."""

    help: str
    parse: Callable[[str], Any]
    flag: str | None = None
    """The flag; ``None``: ``--`` and the field's name with dashes."""
    metavar: str | None = None
    group: str = "serving"
    switch: bool = False
    """A flag that takes no value and sets ``switch_value``; the environment takes true/false."""
    switch_value: Any = True
    flag_parse: Callable[[str], Any] | None = None
    """The flag's parser where its unit differs from the environment's."""
    separator: str | None = None
    """A repeatable flag; its environment variable lists values split by this."""
    shown_default: str | None = None


def setting(default: Any, help: str, parse: Callable[[str], Any], **options: Any) -> Any:
    """A dataclass field declaring a setting (``options``: the rest of ``Setting``)."""
    return field(default=default, metadata={_METADATA_KEY: Setting(help, parse, **options)})


@dataclass(frozen=True, slots=True)
class Bound:
    """A setting with its name, its environment variable and its default."""

    name: str
    env: str
    default: Any
    setting: Setting

    @property
    def flag(self) -> str:
        return self.setting.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def parse_env(self, raw: str) -> Any:
        try:
            return self._parse(raw, self.setting.parse)
        except ValueError as error:
            raise ValueError(f"{self.env}={raw!r}: {error}") from None

    def _parse(self, raw: str, parse: Callable[[str], Any]) -> Any:
        separator = self.setting.separator
        if separator is None:
            return parse(raw)
        return tuple(parse(part.strip()) for part in raw.split(separator) if part.strip())

    def help_line(self) -> str:
        shown = self.setting.shown_default or _render(self.default)
        text = f"{self.setting.help} [env {self.env}; default {shown}]"
        return text.replace("%", "%%")  # argparse formats help with %


def settings_of(cls: type, prefix: str = "") -> Iterator[Bound]:
    """The settings a dataclass declares; their variables are ``ACCYD_<prefix><FIELD>``."""
    for item in dataclasses.fields(cls):
        declared = item.metadata.get(_METADATA_KEY)
        if isinstance(declared, Setting):
            env = f"{ENV_PREFIX}{prefix}{item.name.upper()}"
            yield Bound(item.name, env, item.default, declared)


def from_environment(bound: Sequence[Bound], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the environment sets, by field name."""
    return {b.name: b.parse_env(environ[b.env]) for b in bound if b.env in environ}


def add_flags(parser: argparse.ArgumentParser, bound: Sequence[Bound]) -> None:
    """A flag for each setting, in argument groups; an absent flag leaves ``None``."""
    groups: dict[str, Any] = {}
    for b in bound:
        group = groups.get(b.setting.group)
        if group is None:
            group = groups[b.setting.group] = parser.add_argument_group(b.setting.group)
        if b.setting.switch:
            group.add_argument(
                b.flag, dest=b.dest, action="store_const", const=b.setting.switch_value,
                help=b.help_line(),
            )  # fmt: skip
            continue
        group.add_argument(
            b.flag,
            dest=b.dest,
            type=_flag_type(b.setting.flag_parse or b.setting.parse),
            action="append" if b.setting.separator is not None else "store",
            metavar=b.setting.metavar,
            help=b.help_line(),
        )


def flag_values(args: argparse.Namespace, bound: Sequence[Bound]) -> dict[str, Any]:
    """The settings given as flags, by field name."""
    values = {}
    for b in bound:
        value = getattr(args, b.dest, None)
        if value is not None:
            values[b.name] = tuple(value) if isinstance(value, list) else value
    return values


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{raw!r}: {error}") from None

    return convert


def _render(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(part) for part in value) or "none"
    return str(value)


# Parsers ---------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+)\s*(|k|kib|m|mib|g|gib|t|tib)\s*$", re.IGNORECASE)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def size(text: str) -> int:
    """A byte count: ``1073741824``, ``1024MiB`` or ``1G`` (powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError("not a size: bytes, or a number and KiB/MiB/GiB")
    return int(match[1]) << _UNITS[match[2][:1].lower()]


def bool_text(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def optional(parse: Callable[[str], Any], *nones: str) -> Callable[[str], Any]:
    """``parse``, with the empty text and each of ``nones`` meaning ``None``."""

    def parse_optional(raw: str) -> Any:
        return None if raw.strip() in ("", *nones) else parse(raw)

    return parse_optional


def choice(*names: str) -> Callable[[str], str]:
    def parse_choice(raw: str) -> str:
        if raw not in names:
            raise ValueError(f"choose one of {', '.join(names)}")
        return raw

    return parse_choice


def path(raw: str) -> Path:
    return Path(raw).expanduser()


def seconds_from_us(raw: str) -> float:
    return float(raw) / 1e6


def int_text(raw: str) -> int:
    return int(raw)


def index_pair(raw: str) -> tuple[int, int]:
    """``INDEX=ORDINAL`` as a pair of whole numbers."""
    index, sep, ordinal = raw.partition("=")
    if not sep:
        raise ValueError("expected INDEX=ORDINAL, for example 1=0")
    return int(index), int(ordinal)


def float_text(raw: str) -> float:
    return float(raw)


CATALOG_SEPARATOR = os.pathsep
