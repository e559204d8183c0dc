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
_SOURCES = re.compile(r"vllm/(entrypoints/.*protocol\.py|v1/metrics/(loggers|buckets)\.py)$")
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
    buckets = next(text for name, text in sources.items() if name.endswith("buckets.py"))
    return {"vllm_version": version, "models": models, "metrics": _metrics(loggers), "buckets": _buckets(buckets)}


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
    strings: dict[str, str] = {}  # NOTE: names given through a variable: `name = "vllm:..."`, `self.labelname_x = "x"`
    bucket_families: dict[str, str] = {}  # `x_buckets = histogram_buckets("family", ...)`
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "labelnames":
            common_labels = ast.literal_eval(node.value)
        elif (
            isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "histogram_buckets" and isinstance(node.value.args[0], ast.Constant)
        ):
            bucket_families[ast.unparse(node.targets[0])] = str(node.value.args[0].value)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings[ast.unparse(node.targets[0])] = node.value.value
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        kind = _METRIC_KINDS.get(node.func.attr)
        keywords = {k.arg: k.value for k in node.keywords}
        name_node = keywords.get("name")
        name = name_node.value if isinstance(name_node, ast.Constant) else strings.get(ast.unparse(name_node or ast.List([])))
        if kind is None or not str(name).startswith("vllm:"):
            continue
        family: dict[str, Any] = {"type": kind, "labels": _labels(keywords.get("labelnames"), common_labels, strings)}
        if "buckets" in keywords:
            buckets = ast.unparse(keywords["buckets"])
            family["buckets"] = bucket_families.get(buckets, buckets)
        metrics[str(name)] = family
    return dict(sorted(metrics.items()))


def _buckets(source: str) -> dict[str, Any]:
    """Each bucket family's bounds (`request_tokens`: its rule, a 1-2-5 series up to max_model_len)."""
    tree = ast.parse(source)
    constants: dict[str, Any] = {}
    for node in tree.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        try:
            constants[ast.unparse(target)] = list(ast.literal_eval(value))
        except (ValueError, TypeError):
            continue
    families = {"request_tokens": "1-2-5 series up to max_model_len"}
    for name, bounds in constants.items():
        if name.endswith("_BUCKETS"):
            families[name.removesuffix("_BUCKETS").lower()] = bounds
    return families


def _labels(labels: ast.expr | None, common_labels: list[str], strings: dict[str, str]) -> list[str]:
    """A family's label names: a list, `labelnames` (the common ones), or `labelnames + [...]`
    (a name given through a variable resolved; labels computed at run time as their source text)."""
    if labels is None:
        return []
    if isinstance(labels, ast.BinOp):
        return _labels(labels.left, common_labels, strings) + _labels(labels.right, common_labels, strings)
    if isinstance(labels, ast.Name) and labels.id == "labelnames":
        return list(common_labels)
    if isinstance(labels, ast.List | ast.Tuple):
        return [str(e.value) if isinstance(e, ast.Constant) else strings.get(ast.unparse(e), ast.unparse(e))
                for e in labels.elts]
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
