"""Settings declared once, as dataclass fields: a flag, a help text, allowed values and a check
each, from which command lines are generated and by which every value is checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any


def setting(
    default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] = (),
    check: Callable[[Any], None] | None = None, is_json: bool = False, group: str = "", metavar: str = "",
    nargs: int | str | None = None, is_repeated: bool = False, parse: Callable[[str], Any] | None = None,
    is_hidden: bool = False,
) -> Any:
    """A field with a command-line flag (`--name-with-dashes` unless `flag`) and its check.

    `check` raises ValueError saying what is wrong with a value; `choices` and the field's type
    are checked too. `is_json`: a JSON object as text (`LLM` also takes it as a dict).
    `group`: the --help section it is listed in (else the command's own). A tuple's items follow
    one flag (`nargs`, as argparse's) or each its own (`is_repeated`). `parse`: the value of the
    flag's text, where the field's type does not say. `is_hidden`: no --help line, for a flag
    that one zeroserve process passes another.
    """
    return field(default=default, metadata={
        "help": help, "flag": flag, "choices": choices, "check": check, "is_json": is_json, "group": group,
        "metavar": metavar, "nargs": nargs, "is_repeated": is_repeated, "parse": parse, "is_hidden": is_hidden,
    })


def flag_of(config_field: dataclasses.Field[Any]) -> str:
    return config_field.metadata.get("flag") or "--" + config_field.name.replace("_", "-")


def at_least(minimum: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and not value >= minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")

    return check


def in_range(low: int, high: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not low <= value <= high:
            raise ValueError(f"must be in [{low}, {high}], got {value}")

    return check


def positive(value: Any) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"must be > 0, got {value}")


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (float, int), "bool": (bool,), "str | None": (str, type(None)),
    "int | None": (int, type(None)), "float | None": (float, int, type(None)),
    "tuple[str, ...]": (tuple,), "tuple[str, str] | None": (tuple, type(None)), "tuple[tuple[str, float], ...]": (tuple,),
}


def check_value(config_field: dataclasses.Field[Any], value: Any, label: str = "") -> None:
    """Raises ValueError naming the setting (`label`, else its field name) when `value` is not one it takes."""
    name = label or config_field.name
    kinds = _TYPES[str(config_field.type)]
    items = value if isinstance(value, tuple) and str(config_field.type).startswith("tuple[str") else ()
    if (
        not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
        or not all(isinstance(item, str) for item in items)
    ):
        raise ValueError(f"{name} must be {str(config_field.type).replace(' | None', ' or None')}, got {value!r}")
    choices = config_field.metadata.get("choices") or ()
    if choices and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    check = config_field.metadata.get("check")
    if check is not None:
        try:
            check(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc


def check_settings(config: Any) -> None:
    """Raises ValueError naming the flag of the first of `config`'s settings whose value it does not take."""
    for config_field in dataclasses.fields(config):
        if "flag" in config_field.metadata:
            check_value(config_field, getattr(config, config_field.name), label=flag_of(config_field))
