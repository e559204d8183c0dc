"""Command-line flags generated from settings declared once as dataclass fields (proto/settings.py)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from proto.settings import check_value, flag_of

_PARSE: dict[str, Callable[[str], Any]] = {
    "str": str, "int": int, "float": float, "str | None": str, "int | None": int, "float | None": float,
    "tuple[str, ...]": str, "tuple[str, str] | None": str,
}


def add_setting_flags(
    parser: argparse.ArgumentParser, config_class: type[Any], group_title: str = "", *, is_checked: bool = True,
    names: Collection[str] | None = None,
) -> None:
    """A flag for each field of `config_class` that declares one (of `names`, when given), with its
    default and help, in its group (else `group_title`, else the parser's own list). `is_checked`:
    argparse refuses a bad value naming the flag; else only its type is parsed and the config's
    construction checks."""
    for config_field in settings_of(config_class, names):
        metadata = config_field.metadata
        container = argument_group(parser, metadata["group"] or group_title)
        container.add_argument(flag_of(config_field), **_flag_kwargs(config_field, is_checked))


def _flag_kwargs(config_field: dataclasses.Field[Any], is_checked: bool) -> dict[str, Any]:
    metadata = config_field.metadata
    # NOTE: a tuple setting's flag starts from None (argparse appends to its default), its field from ().
    is_tuple = _is_tuple(config_field)
    kwargs: dict[str, Any] = {"default": None if is_tuple else config_field.default, "dest": config_field.name}
    if config_field.type == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _flag_type(config_field, is_checked)
        kwargs["metavar"] = metadata["metavar"] or ("JSON" if metadata["is_json"] else None)
        if not kwargs["metavar"] and not metadata["choices"]:
            kwargs["metavar"] = flag_of(config_field).removeprefix("--").replace("-", "_").upper()
    if metadata["nargs"] is not None:
        kwargs["nargs"] = metadata["nargs"]
    if metadata["is_repeated"]:
        kwargs["action"] = "append"
    if metadata["choices"]:
        kwargs["choices"] = metadata["choices"]
    default = "" if "default:" in metadata["help"] else " (default: %(default)s)"
    kwargs["help"] = argparse.SUPPRESS if metadata["is_hidden"] else metadata["help"] + default
    return kwargs


def setting_values(
    args: argparse.Namespace, config_class: type[Any], names: Collection[str] | None = None
) -> dict[str, Any]:
    """The parsed value of each of `config_class`'s flags (of `names`), by field name (a list as a tuple)."""
    values = {}
    for config_field in settings_of(config_class, names):
        value = getattr(args, config_field.name)
        if _is_tuple(config_field):
            value = config_field.default if value is None else tuple(value)
        values[config_field.name] = value
    return values


def _is_tuple(config_field: dataclasses.Field[Any]) -> bool:
    return bool(config_field.metadata["nargs"] is not None or config_field.metadata["is_repeated"])


def settings_of(config_class: type[Any], names: Collection[str] | None = None) -> list[dataclasses.Field[Any]]:
    return [
        config_field for config_field in dataclasses.fields(config_class)
        if "flag" in config_field.metadata and (names is None or config_field.name in names)
    ]


def argument_group(parser: argparse.ArgumentParser, title: str) -> argparse.ArgumentParser | argparse._ArgumentGroup:
    """The parser's --help section `title` (made on first use), or the parser itself for no title."""
    if not title:
        return parser
    existing = next((group for group in parser._action_groups if group.title == title), None)
    return existing or parser.add_argument_group(title)


def _flag_type(config_field: dataclasses.Field[Any], is_checked: bool) -> Callable[[str], Any]:
    parse = config_field.metadata["parse"] or _PARSE[str(config_field.type)]

    def convert(text: str) -> Any:
        if parse in (int, float):
            try:
                parse(text)
            except ValueError:
                kind = "a whole number" if parse is int else "a number"
                raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        try:
            value = parse(text)
            if is_checked and not _is_tuple(config_field):
                check_value(config_field, value, label="-")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("-: ")) from exc
        return value

    convert.__name__ = parse.__name__
    return convert
