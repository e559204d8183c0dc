"""Keeps the matmul plans measured at load on disk, so the next load of the same shapes on the same
machine, torch and thread count reuses them instead of timing again (2.3 s of the default model's
4.9 s start on a 2-core Zen 4).

Each plan is one small JSON file named for a digest of everything the timing depended on: the
CPU (torch's capability, its extensions, the CPU's name), torch's version, the C++ kernels' build (its
sources and flags, see kernels.kernels_digest), the thread count, the
weights' shapes and dtype, the forms they can run in, and the token counts measured. A file
that cannot be read or names a form this load lacks is measured again; one that cannot be
written is logged and skipped: neither can fail a load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine_proc.cpu.features import cpu_features, cpu_model_name
from engine_proc.cpu.kernels import kernels_digest
from engine_proc.cpu.matmul_forms import MatmulForms, Plan
from proto import envs

logger = logging.getLogger(__name__)

# NOTE: bumped when the forms or the way they are timed change, so older plans are not reused.
FORMAT = 2


def saved_plan(
    forms: Sequence[MatmulForms], measured_tokens: Sequence[int], is_invariant: bool = False
) -> tuple[Plan | None, Callable[[Plan], None]]:
    """(the plan an earlier load here measured for these weights, or None; a function that saves
    the plan this load measures for them). Without a plan folder, None and a no-op."""
    folder = envs.plan_cache_dir()
    if folder is None:
        return None, lambda plan: None
    what = {**_what_was_timed(forms, measured_tokens), "is_invariant": is_invariant}
    path = folder / (hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24] + ".json")

    def save(plan: Plan) -> None:
        _write(path, {"what": what, "plan": [list(entry) for entry in plan]})

    return _read(path, usable=set(forms[0].runs)), save


def _what_was_timed(forms: Sequence[MatmulForms], measured_tokens: Sequence[int]) -> dict[str, Any]:
    features = cpu_features()
    weight = forms[0].weight
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "kernels": kernels_digest(),
        "cpu": features.describe(),
        "cpu_name": cpu_model_name(),
        "num_threads": torch.get_num_threads(),
        "device": weight.device.type,
        "dtype": str(weight.dtype),
        "shapes": {"x".join(map(str, shape)): n for shape, n in Counter(tuple(f.weight.shape) for f in forms).items()},
        "forms": sorted(forms[0].runs),
        "measured_tokens": list(measured_tokens),
    }


def _read(path: Path, usable: set[str]) -> Plan | None:
    try:
        entries = json.loads(path.read_text())["plan"]
        plan = tuple((int(bound), str(form)) for bound, form in entries)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("saved matmul plan %s unreadable (%s): measuring again", path, exc)
        return None
    if not plan or not all(form in usable for _, form in plan):
        return None
    return plan


def _write(path: Path, content: dict[str, Any]) -> None:
    """Atomically (engines of one gateway may load at once); a failure is logged, not raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as file:
            json.dump(content, file)
        os.replace(file.name, path)
    except OSError as exc:
        logger.warning("matmul plan not saved to %s (%s): the next load measures again", path.parent, exc)
