"""The models a multi-model gateway serves: those named, the files and folders of --models-dir (a broken
one listed with its reason), those --models-config adds, each with its own settings over the command line's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from service.cli.main import config_from_args, parse_args
from service.config import GatewayConfig
from service.models.catalog import ModelEntry, find_models
from tests.small_model_files import cut_short, write_gguf

SETTINGS_TOML = """
[models.llama-a]
aliases = ["gpt-4o-mini", "a"]
max_model_len = 256
kv-cache-memory = 0.5
speculative_config = {method = "ngram", num_speculative_tokens = 2}
reasoning_parser = "qwen3"
override_generation_config = {temperature = 0.2}
"""
SETTINGS_YAML = """
models:
  llama-a:
    aliases: [gpt-4o-mini, a]
    max-model-len: 256
    kv_cache_memory_gib: 0.5
    speculative_config: '{"method": "ngram", "num_speculative_tokens": 2}'
    reasoning-parser: qwen3
    generation_config: {temperature: 0.2}
"""


@pytest.fixture
def models_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """Two Hugging Face folders, a GGUF, a broken GGUF, and what is not a model."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(tiny_model_dir, folder / "llama-b")
    shutil.copytree(tiny_model_dir, folder / "llama-a")
    write_gguf(folder / "small.gguf")
    (folder / "broken.gguf").write_bytes(b"not a gguf")
    (folder / "notes.txt").write_text("not a model")
    (folder / "empty").mkdir()
    return folder


def serve(*argv: str) -> GatewayConfig:
    return config_from_args(parse_args(["serve", *argv, "--kv-cache-memory", "0.1"], environ={}))


def by_id(entries: list[ModelEntry]) -> dict[str, ModelEntry]:
    return {entry.id: entry for entry in entries}


def test_a_models_dir_serves_each_gguf_and_folder_by_its_name_and_lists_a_broken_one_with_why(models_dir: Path) -> None:
    entries = find_models(serve("--models-dir", str(models_dir)))
    assert [entry.id for entry in entries] == ["broken", "llama-a", "llama-b", "small"]
    broken, *servable = entries
    assert broken.path == models_dir / "broken.gguf"
    assert broken.error is not None and "broken.gguf is not a GGUF file" in broken.error
    assert [entry.error for entry in servable] == [None, None, None]
    assert [entry.path for entry in servable] == [models_dir / "llama-a", models_dir / "llama-b", models_dir / "small.gguf"]


def damaged_and_unsupported(folder: Path) -> dict[str, str]:
    """Files an interrupted download or a model zeroserve does not run leave in the folder, by id: what their
    reason says."""
    cut_short(write_gguf(folder / "cut-in-header.gguf"), 100)
    size = (write_gguf(folder / "cut-in-tensors.gguf", num_tensors=2)).stat().st_size
    cut_short(folder / "cut-in-tensors.gguf", size - 40)
    write_gguf(
        folder / "experts.gguf", arch="qwen2", metadata={"qwen2.expert_count": 8}, tensor_names=["blk.0.ffn_up_exps.weight"]
    )
    return {
        "cut-in-header": "cut-in-header.gguf is cut short: the file ends inside its header",
        "cut-in-tensors": f"cut-in-tensors.gguf is cut short: its tensors need {size:,} bytes, the file has {size - 40:,}",
        "experts": "experts.gguf: mixture-of-experts layers (8 experts) are not supported for 'qwen2'",
    }


def test_a_cut_short_or_unsupported_file_in_a_models_dir_is_listed_with_why(models_dir: Path) -> None:
    reasons = damaged_and_unsupported(models_dir)
    entries = by_id(find_models(serve("--models-dir", str(models_dir))))
    for model_id, reason in reasons.items():
        error = entries[model_id].error
        assert error is not None and error.startswith(reason) and "\n" not in error
    assert [entries[model_id].error for model_id in ("llama-a", "llama-b", "small")] == [None, None, None]


async def test_the_models_list_says_failed_with_the_reason_from_the_start(models_dir: Path) -> None:
    from service.models.model_pool import ModelPool
    from service.serving.gateway import Gateway

    reasons = damaged_and_unsupported(models_dir)
    config = serve("--models-dir", str(models_dir), "--responses-store", str(models_dir.parent / "store.sqlite"))
    gateway = Gateway(config)
    pool = ModelPool(find_models(config), config, gateway.model_state)
    gateway.serve_models(pool)
    transport = httpx.ASGITransport(gateway.app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            cards = {card["id"]: card for card in (await client.get("/v1/models")).json()["data"]}
    finally:
        await pool.close()
    for model_id, reason in reasons.items():
        status = cards[model_id]["status"]
        assert status["failed"] is True and status["reason"].startswith(reason)
    assert [cards[model_id]["status"] for model_id in ("llama-a", "llama-b", "small")] == [{"value": "unloaded"}] * 3


def test_each_model_has_a_single_model_config_of_its_own_file(models_dir: Path) -> None:
    entries = by_id(find_models(serve("--models-dir", str(models_dir))))
    config = entries["small"].config
    assert (config.model, config.models, config.engine.model_path) == ((path := str(models_dir / "small.gguf")), (path,), path)
    assert config.engine.model_name == "small"
    assert not config.is_multi_model
    assert config.engine.kv_cache_memory_gib == 0.1
    assert not entries["broken"].config.is_multi_model
    assert entries["broken"].config.engine.model_path == ""


def test_the_size_is_the_gguf_file_or_the_folder_weights(models_dir: Path) -> None:
    entries = by_id(find_models(serve("--models-dir", str(models_dir))))
    weights = sum(path.stat().st_size for path in (models_dir / "llama-a").glob("*.safetensors"))
    assert weights > 0
    assert entries["llama-a"].num_file_bytes == weights
    assert entries["small"].num_file_bytes == (models_dir / "small.gguf").stat().st_size


def test_the_models_named_come_first_and_the_same_file_named_twice_is_one_model(models_dir: Path, tmp_path: Path) -> None:
    other = write_gguf(tmp_path / "other.gguf")
    entries = find_models(serve(str(other), str(models_dir / "small.gguf"), "--models-dir", str(models_dir)))
    assert [entry.id for entry in entries] == ["other", "small", "broken", "llama-a", "llama-b"]


def test_a_named_model_zeroserve_cannot_serve_stops_the_start(models_dir: Path) -> None:
    with pytest.raises(ValueError, match="broken.gguf is not a GGUF file"):
        find_models(serve(str(models_dir / "broken.gguf"), "--models-dir", str(models_dir)))


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_models_config_settings_override_the_command_line_for_their_model_only(models_dir: Path, suffix: str) -> None:
    settings = models_dir.parent / f"models{suffix}"
    settings.write_text(SETTINGS_TOML if suffix == ".toml" else SETTINGS_YAML)
    entries = by_id(find_models(serve("--models-dir", str(models_dir), "--models-config", str(settings))))
    configured, other = entries["llama-a"], entries["llama-b"]
    assert configured.names == ("llama-a", "gpt-4o-mini", "a")
    assert (configured.config.engine.max_model_len, configured.config.engine.kv_cache_memory_gib) == (256, 0.5)
    assert json.loads(configured.config.engine.speculative_config)["num_speculative_tokens"] == 2
    assert configured.config.reasoning_parser == "qwen3"
    assert configured.config.generation_config == (("temperature", 0.2),)
    assert other.names == ("llama-b",)
    assert (other.config.engine.max_model_len, other.config.engine.kv_cache_memory_gib) == (None, 0.1)
    assert (other.config.reasoning_parser, other.config.generation_config) == ("auto", ())


def test_the_toml_and_yaml_forms_give_the_same_models(models_dir: Path) -> None:
    (toml := models_dir.parent / "models.toml").write_text(SETTINGS_TOML)
    (yaml := models_dir.parent / "models.yaml").write_text(SETTINGS_YAML)
    assert find_models(serve("--models-dir", str(models_dir), "--models-config", str(toml))) == find_models(
        serve("--models-dir", str(models_dir), "--models-config", str(yaml))
    )


def test_a_model_only_the_config_names_is_served_from_its_model_path(models_dir: Path, tmp_path: Path) -> None:
    extra = write_gguf(tmp_path / "elsewhere.gguf")
    (settings := tmp_path / "models.toml").write_text(f'[models.extra]\nmodel = "{extra}"\nmax_num_seqs = 2\n')
    entries = find_models(serve("--models-dir", str(models_dir), "--models-config", str(settings)))
    assert entries[-1].id == "extra"
    assert (entries[-1].path, entries[-1].config.engine.model_name, entries[-1].config.engine.max_num_seqs) == (
        extra, "extra", 2
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[models.llama-b]\naliases = ["a"]\n[models.llama-a]\naliases = ["a"]',
         "model 'llama-b': aliases: 'a' is already an alias of model 'llama-a'"),
        ('[models.llama-b]\naliases = ["small"]', "model 'llama-b': aliases: 'small' is already the id of model 'small'"),
        ('[models.small]\nmodel = "DIR/llama-a"', "model 'small' (model = 'DIR/llama-a'): another model has the id"),
        ("[models.ghost]\nmax_num_seqs = 2", "model 'ghost': is named nowhere"),
        ('[models.ghost]\nmodel = "/no/such.gguf"', "model 'ghost': model: /no/such.gguf: no such file or folder"),
        ("[models.llama-a]\nmax_num_seqs = 0", "model 'llama-a': max_num_seqs: must be >= 1, got 0"),
        ("[models.llama-a]\ndata_parallel_size = 0", "model 'llama-a': --data-parallel-size must be >= 1"),
    ],
)
def test_a_bad_models_config_stops_the_start_naming_file_model_and_key(models_dir: Path, text: str, named: str) -> None:
    (settings := models_dir.parent / "models.toml").write_text(text.replace("DIR", str(models_dir)))
    with pytest.raises(ValueError, match=f"^--models-config {settings}: ") as caught:
        find_models(serve("--models-dir", str(models_dir), "--models-config", str(settings)))
    assert named.replace("DIR", str(models_dir)) in str(caught.value)


def test_an_alias_clash_names_both_models(models_dir: Path) -> None:
    (settings := models_dir.parent / "models.toml").write_text('[models.llama-b]\naliases = ["llama-a"]')
    with pytest.raises(ValueError) as caught:
        find_models(serve("--models-dir", str(models_dir), "--models-config", str(settings)))
    assert str(caught.value).startswith(f"--models-config {settings}: model 'llama-b': aliases: 'llama-a' is already")
    assert str(models_dir / "llama-a") in str(caught.value)


def test_a_model_dir_that_is_not_there_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^--models-dir .*missing: cannot be listed"):
        find_models(serve("--models-dir", str(tmp_path / "missing")))


def test_a_models_dir_without_models_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match="^no models to serve"):
        find_models(serve("--models-dir", str(tmp_path)))
