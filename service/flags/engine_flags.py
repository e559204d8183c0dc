"""The engine's command-line flags, shared by every command that starts an engine."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from proto import envs
from proto.engine_config import EngineConfig
from service.flags.setting_flags import add_setting_flags, setting_values
from service.model_files.model_registry import DEFAULT_MODEL


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )


def add_models_arg(parser: argparse.ArgumentParser) -> None:
    """`zeroserve serve`'s models: one, or several served by name (none with --models-dir)."""
    parser.add_argument(
        "model", nargs="*", metavar="MODEL",
        help="known model names, .gguf files or Hugging Face model directories; several are served by name, "
        f"each loaded when first asked for (default: {DEFAULT_MODEL}, or none with --models-dir)",
    )


def add_multiprocessing_arg(parser: argparse.ArgumentParser) -> None:
    """`--multiprocessing` of the commands that run `LLM` (its `multiprocess_mode`)."""
    parser.add_argument(
        "--multiprocessing", action=argparse.BooleanOptionalAction, default=None,
        help="run the engine in its own process (default: ZEROSERVE_ENABLE_MULTIPROCESSING, on)",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every engine setting (proto/engine_config.py), with its default, help and check."""
    add_setting_flags(parser, EngineConfig, "engine")


def engine_config_from(args: argparse.Namespace, model_path: str = "", model_name: str = "") -> EngineConfig:
    return EngineConfig(model_path=model_path, model_name=model_name, **setting_values(args, EngineConfig))


def engine_settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The engine settings ZEROSERVE_<FLAG> variables set (ZEROSERVE_DTYPE for `--dtype`), by field
    name, parsed and checked as the commands parse them: what `LLM()` starts from."""
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    values = envs.flag_defaults_from_env(parser, os.environ if environ is None else environ)
    return {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}
