"""``accyd serve --config FILE``: the flags' settings from a TOML file, under the variables.

Each key is a flag's name without its dashes (``listen``, ``metrics-port``,
``quota-memory``, ``no-kserve``); its value is what the flag would take: a
string or a number, a list for a repeatable flag (``listen = ["unix:/run/accy.sock",
"0.0.0.0:7447"]``), and true or false for a flag that takes no value (``insecure =
true``; ``no-kserve = false`` leaves the door on). A value is read by the flag's own
parser, so it accepts the same text. Defaults, then the file, then ``ACCYD_*``
variables, then flags: each wins over the ones before. An unknown key, a value of the
wrong kind or one its parser refuses is an error naming the file and the key.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accyd.settings.fields import Bound

__all__ = ["CONFIG_ENV", "read_config_file"]

CONFIG_ENV = "ACCYD_CONFIG"
"""The variable that names the file where ``--config`` is not given."""


def read_config_file(path: Path, *groups: Sequence[Bound]) -> list[dict[str, Any]]:
    """The settings ``path`` gives, by field name, one dict for each of ``groups``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the config file: {error.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    keys = {
        b.flag.removeprefix("--"): (index, b) for index, group in enumerate(groups) for b in group
    }
    found: list[dict[str, Any]] = [{} for _ in groups]
    for key, value in data.items():
        if key not in keys:
            raise ValueError(f"{path}: unknown key {key!r}{_suggestion(key, keys)}")
        index, bound = keys[key]
        try:
            found[index][bound.name] = _value(bound, value)
        except ValueError as error:
            raise ValueError(f"{path}: {key} = {_shown(value)}: {error}") from None
    return found


def _value(bound: Bound, value: Any) -> Any:
    """One key's value, as its flag would have set it."""
    declared = bound.setting
    if isinstance(value, dict):
        raise ValueError("a table; each key is a flag's name at the top level of the file")
    if declared.switch and isinstance(value, bool):
        return declared.switch_value if value else not declared.switch_value
    parse = declared.parse if declared.switch else (declared.flag_parse or declared.parse)
    if declared.separator is not None:
        items = value if isinstance(value, list) else [value]
        return tuple(parse(_text(item)) for item in items)
    if isinstance(value, list):
        raise ValueError(f"a list, where --{bound.flag.removeprefix('--')} takes one value")
    return parse(_text(value))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"a {type(value).__name__}; give a string, a number or true/false")


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _suggestion(key: str, keys: dict[str, Any]) -> str:
    near = difflib.get_close_matches(key.replace("_", "-"), list(keys), n=1)
    if near:
        return f"; did you mean {near[0]!r}? (the keys are accyd serve's flags, without --)"
    return " (the keys are accyd serve's flags, without --; see accyd serve --help)"
