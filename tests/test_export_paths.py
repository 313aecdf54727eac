"""`esft export` with the paths and run folders users give it: `.`, a symlink, a folder inside the run, damaged
checkpoint files, a model folder that is no run, and a training config holding a token."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from esft.cli import main


def run_folder(root, checkpoints=("iter_000001", "final"), config=None):
    """A run directory as the trainers leave it: config.yaml, held-out evaluations at steps 0-2 in metrics.jsonl and
    checkpoint folders (a one-tensor safetensors file, placeholder tokenizer config, es_state.json with the step)."""
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config or {"model": "m", "task": "boolq", "population_size": 2}))
    (root / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "eval", "step": s, "test_n": 4, "test_accuracy": 0.25 * s, "test_ci95": [0.0, 1.0]})
        + "\n" for s in range(3)))
    for name in checkpoints:
        folder = root / "checkpoints" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"eos_token_id": 2}))
        (folder / "tokenizer_config.json").write_text("{}")
        (folder / "es_state.json").write_text(json.dumps({"step": 1 if name == "iter_000001" else 2}))
        save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return root


def test_the_card_publishes_no_token_of_the_training_config(tmp_path):
    """A GRPO run given `trl_args: {hub_token: ...}` (TRL's option, accepted and recorded in config.yaml) had the
    token written into the card, which is made to be uploaded; transformers itself writes such keys as <HUB_TOKEN>."""
    run = run_folder(tmp_path / "run", config={"model": "m", "task": "boolq", "num_generations": 2, "trl_args": {
        "hub_token": "hf_SECRET1", "model_init_kwargs": {"token": "hf_SECRET2"}, "hub_model_id": "me/m"}})
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "hf_SECRET" not in card
    assert "hub_token: <HUB_TOKEN>" in card and "token: <TOKEN>" in card and "hub_model_id: me/m" in card
