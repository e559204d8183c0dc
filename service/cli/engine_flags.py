"""The engine's command-line flags, shared by every command that starts an engine."""

from __future__ import annotations

import argparse

from proto.engine_config import EngineConfig
from service.cli.setting_flags import add_setting_flags, setting_values
from service.model_files.model_registry import DEFAULT_MODEL


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every engine setting (proto/engine_config.py), with its default, help and check."""
    add_setting_flags(parser, EngineConfig, "engine")


def engine_config_from(args: argparse.Namespace, model_path: str = "", model_name: str = "") -> EngineConfig:
    return EngineConfig(model_path=model_path, model_name=model_name, **setting_values(args, EngineConfig))
