"""Writes `vllm_fields.json`: the fields (and defaults) of vLLM's OpenAI request and response models
and its metric families, read from a vLLM wheel's sources without importing vLLM.

    pip download vllm==0.34.0 --no-deps -d /tmp/vllm
    python -m service.openai.vllm_snapshot /tmp/vllm/vllm-0.34.0-*.whl

The conformance table (`conformance.py`) is checked against the snapshot by its tests.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import zipfile
from pathlib import Path
from typing import Any

SNAPSHOT_PATH = Path(__file__).with_name("vllm_fields.json")

# The models a vLLM client sends or reads, by the name the table calls them.
MODELS = {
    "chat": "ChatCompletionRequest",
    "completions": "CompletionRequest",
    "tokenize_completion": "TokenizeCompletionRequest",
    "tokenize_chat": "TokenizeChatRequest",
    "detokenize": "DetokenizeRequest",
    "stream_options": "StreamOptions",
    "chat_response": "ChatCompletionResponse",
    "chat_response_choice": "ChatCompletionResponseChoice",
    "chat_chunk": "ChatCompletionStreamResponse",
    "chat_chunk_choice": "ChatCompletionResponseStreamChoice",
    "completions_response": "CompletionResponse",
    "completions_response_choice": "CompletionResponseChoice",
    "completions_chunk": "CompletionStreamResponse",
    "completions_chunk_choice": "CompletionResponseStreamChoice",
    "tokenize_response": "TokenizeResponse",
    "detokenize_response": "DetokenizeResponse",
    "model_card": "ModelCard",
    "usage": "UsageInfo",
}
_SOURCES = re.compile(r"vllm/(entrypoints/.*protocol\.py|v1/metrics/loggers\.py)$")
_METRIC_KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}


def read_sources(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name).decode() for name in archive.namelist() if _SOURCES.search(name)}


def snapshot(sources: dict[str, str], version: str) -> dict[str, Any]:
    classes: dict[str, ast.ClassDef] = {}
    for name, text in sorted(sources.items()):
        if name.endswith("protocol.py"):
            for node in ast.parse(text).body:
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, node)
    models = {key: _fields(classes, class_name) for key, class_name in MODELS.items()}
    loggers = next(text for name, text in sources.items() if name.endswith("loggers.py"))
    return {"vllm_version": version, "models": models, "metrics": _metrics(loggers)}


def _fields(classes: dict[str, ast.ClassDef], class_name: str) -> dict[str, Any]:
    """A model's fields (its bases' first) with their defaults: a literal, or its source text."""
    node = classes[class_name]
    fields: dict[str, Any] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            fields.update(_fields(classes, base.id))
    for statement in node.body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        name = statement.target.id
        if name.startswith("_") or "ClassVar" in ast.unparse(statement.annotation):
            continue
        fields[name] = {"default": _default(statement.value)}
    return fields


def _default(value: ast.expr | None) -> Any:
    if value is None:
        return {"required": True}
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
        keywords = {k.arg: k.value for k in value.keywords}
        if "default" in keywords:
            return _default(keywords["default"])
        if value.args:
            return _default(value.args[0])
        if "default_factory" in keywords:
            factory = ast.unparse(keywords["default_factory"])
            return {"list": [], "dict": {}}.get(factory, {"factory": factory})
        return {"required": True}
    try:
        return ast.literal_eval(value)
    except ValueError:
        return {"expression": ast.unparse(value)}


def _metrics(loggers: str) -> dict[str, Any]:
    """Every `self._<kind>_cls(name="vllm:...", ...)` family: its type and label names."""
    metrics: dict[str, Any] = {}
    tree = ast.parse(loggers)
    common_labels: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "labelnames":
            common_labels = ast.literal_eval(node.value)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        kind = _METRIC_KINDS.get(node.func.attr)
        keywords = {k.arg: k.value for k in node.keywords}
        name = keywords.get("name")
        if kind is None or not isinstance(name, ast.Constant) or not str(name.value).startswith("vllm:"):
            continue
        family: dict[str, Any] = {"type": kind, "labels": _labels(keywords.get("labelnames"), common_labels)}
        if "buckets" in keywords:
            family["buckets"] = ast.unparse(keywords["buckets"])
        metrics[str(name.value)] = family
    return dict(sorted(metrics.items()))


def _labels(labels: ast.expr | None, common_labels: list[str]) -> list[str]:
    """A family's label names: a list, `labelnames` (the common ones), or `labelnames + [...]`."""
    if labels is None:
        return []
    if isinstance(labels, ast.BinOp):
        return _labels(labels.left, common_labels) + _labels(labels.right, common_labels)
    if isinstance(labels, ast.Name) and labels.id == "labelnames":
        return list(common_labels)
    if isinstance(labels, ast.List | ast.Tuple):
        return [str(e.value) if isinstance(e, ast.Constant) else ast.unparse(e) for e in labels.elts]
    return [ast.unparse(labels)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a vllm-<version>-*.whl (pip download vllm --no-deps)")
    parser.add_argument("--output", type=Path, default=SNAPSHOT_PATH)
    args = parser.parse_args()
    version = args.wheel.name.split("-")[1]
    data = snapshot(read_sources(args.wheel), version)
    args.output.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{args.output}: vLLM {version}, {sum(map(len, data['models'].values()))} fields, {len(data['metrics'])} metrics")


if __name__ == "__main__":
    main()
