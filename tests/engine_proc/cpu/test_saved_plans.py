"""Matmul plans measured at load are kept for the next load of the same shapes on the same machine."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine_proc.cpu import saved_plans
from engine_proc.cpu.kernels import kernels_digest
from engine_proc.cpu.policy import FASTEST
from engine_proc.loader import load_model
from engine_proc.models.llama import LlamaForCausalLM
from proto import envs
from tests.engine_proc.cpu.stand_in_timer import stand_in_timer
from tests.engine_proc.models.tiny_llama import save_tiny_checkpoint


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_tiny_checkpoint(tmp_path / "model", "llama")
    return tmp_path / "model"


def use_plan_folder(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ZEROSERVE_PLAN_CACHE", value)
    envs.read.cache_clear()


@pytest.fixture(autouse=True)
def fresh_env() -> Iterator[None]:
    yield
    envs.read.cache_clear()


def time_int8_head_as(monkeypatch: pytest.MonkeyPatch, is_int8_faster: bool) -> list[set[str]]:
    """Makes every timing say the int8 head is faster (or slower), on a clock that stands still (no
    budget runs out); returns the list of the matmul timings done."""
    timer = stand_in_timer(monkeypatch, lambda form: 0.5 if (form == "int8") is is_int8_faster else 1.0)
    return timer.timed


def load(checkpoint: Path) -> LlamaForCausalLM:
    model = load_model(checkpoint, dtype=torch.bfloat16)
    model.set_int8_lm_head(model.lm_head_weight.float())
    model.prepack(FASTEST)
    return model


def test_a_second_load_reuses_the_plans_the_first_measured_and_says_so(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use_plan_folder(monkeypatch, str(tmp_path / "plans"))
    first_timings = time_int8_head_as(monkeypatch, is_int8_faster=True)
    first = load(checkpoint)
    assert first.choices["head"] == "int8" and first_timings
    saved = [json.loads(path.read_text()) for path in (tmp_path / "plans").glob("*.json")]
    assert {"int8"} in [{form for _, form in plan["plan"]} for plan in saved]
    assert all(plan["what"]["num_threads"] == torch.get_num_threads() for plan in saved)

    # The timings would now pick another head; the saved plans are used without timing any matmul.
    second_timings = time_int8_head_as(monkeypatch, is_int8_faster=False)
    with caplog.at_level(logging.INFO, logger="engine_proc.loader"):
        second = load(checkpoint)
    assert second.choices == first.choices and second.num_saved_plans > 0 and not second_timings
    assert "plans measured by an earlier load" in caplog.text

    # Another thread count is another machine as far as timings go: measured again.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        third = load(checkpoint)
    finally:
        torch.set_num_threads(threads)
    assert third.choices["head"] != "int8" and second_timings

    # So are other kernels (their sources or flags changed): a plan names the build it timed.
    assert all(plan["what"]["kernels"] == kernels_digest() for plan in saved)
    num_timed = len(second_timings)
    monkeypatch.setattr(saved_plans, "kernels_digest", lambda: "another build")
    fourth = load(checkpoint)
    assert fourth.choices["head"] != "int8" and len(second_timings) > num_timed


def test_an_unreadable_plan_or_folder_never_fails_a_load(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "plans"
    use_plan_folder(monkeypatch, str(folder))
    time_int8_head_as(monkeypatch, is_int8_faster=True)
    load(checkpoint)
    for path in folder.glob("*.json"):
        path.write_text("{not json")
    timings = time_int8_head_as(monkeypatch, is_int8_faster=False)
    model = load(checkpoint)
    assert timings and model.choices["head"] != "int8"  # measured anew

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    use_plan_folder(monkeypatch, str(blocked / "plans"))
    assert load(checkpoint).num_saved_plans == 0 and not (blocked / "plans").exists()


def test_off_measures_at_every_load(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_plan_folder(monkeypatch, "off")
    assert envs.plan_cache_dir() is None
    for is_int8_faster in (True, False):
        timings = time_int8_head_as(monkeypatch, is_int8_faster)
        model = load(checkpoint)
        assert timings and (model.choices["head"] == "int8") is is_int8_faster


def test_the_folder_defaults_to_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROSERVE_PLAN_CACHE")
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path))
    envs.read.cache_clear()
    assert envs.plan_cache_dir() == tmp_path / "plans"
