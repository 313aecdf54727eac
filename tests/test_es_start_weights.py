"""ES's fp32 masters start from the start model's stored fp32 tensors where the model is loaded in bf16
(esft.es.start_weights): from `masters.safetensors` of an ES checkpoint, else from the model files; the trainer and
replay of such a run agree bit for bit.

Run: pytest -q tests/test_es_start_weights.py   (~15 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from conftest import bf16_es_checkpoint, make_tiny_model
from esft.es.noise import MasterWeights
from esft.es.start_weights import exact_start
from esft.models import load_model


def nudged(model, scale=1e-4):
    """`model` moved by less than bf16's spacing, as a GRPO stage moves most weights."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def test_masters_of_a_bf16_load_come_from_the_folders_fp32_tensors(tmp_path, tokenizer):
    folder = tmp_path / "stage1"
    nudged(make_tiny_model(hidden=32, layers=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved = load_file(str(folder / "model.safetensors"))
    model, _ = load_model(str(folder), dtype="bfloat16", device="cpu")
    weights = MasterWeights(model)
    assert any(not torch.equal(weights.master[n], saved[n]) for n in weights.master)  # rounded: the test can fail
    assert exact_start(weights, model, str(folder)) == len(weights.master)
    for name, master in weights.master.items():
        assert torch.equal(master, saved[name]), name
        assert torch.equal(weights.params[name], saved[name].bfloat16()), name  # the model: round(master)


def test_an_es_checkpoints_masters_file_wins_over_its_rounded_model_file(tmp_path, tokenizer):
    """An ES checkpoint of a bf16 model holds the model rounded in model.safetensors and the fp32 masters
    beside it: a later stage starts from the masters."""
    folder = tmp_path / "checkpoint"
    exact = bf16_es_checkpoint(folder, tokenizer, make_tiny_model(hidden=32, layers=1))
    loaded, _ = load_model(str(folder), dtype="bfloat16", device="cpu")
    weights = MasterWeights(loaded)
    assert exact_start(weights, loaded, str(folder)) == len(exact)
    assert all(torch.equal(weights.master[n], exact[n]) for n in weights.master)


def test_nothing_is_read_for_an_fp32_model_or_a_folder_without_fp32_tensors(tmp_path, tokenizer):
    folder = tmp_path / "bf16"
    make_tiny_model(hidden=32, layers=1).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    loaded, _ = load_model(str(folder), dtype="bfloat16", device="cpu")
    weights = MasterWeights(loaded)
    before = {n: m.clone() for n, m in weights.master.items()}
    assert exact_start(weights, loaded, str(folder)) == 0  # bf16 files: the loaded copy is exact
    assert all(torch.equal(weights.master[n], before[n]) for n in before)
    fp32, _ = load_model(str(folder), dtype="float32", device="cpu")
    assert exact_start(MasterWeights(fp32), fp32, str(folder)) == 0
    assert exact_start(weights, loaded, None) == 0


def test_a_bf16_run_from_an_fp32_folder_replays_to_its_checkpoint_bit_for_bit(tmp_path, tokenizer):
    """The trainer and replay both build their masters through make_weights: a bf16 run's final masters
    (masters.safetensors) are what replaying its seed log from the same start model gives, and the run started
    from the folder's fp32 weights (its first logged update moved them from there, not from their rounding)."""
    from esft.api import train_es
    from esft.es.es_config import ESConfig
    from esft.es.replay import rebuild

    from grpo_tiny import ParityTask

    folder = tmp_path / "start"
    nudged(make_tiny_model(hidden=32, layers=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    run = tmp_path / "run"
    config = ESConfig(model=str(folder), task="parity", output_dir=str(run), iterations=2, population_size=4,
                      batch_size=2, max_new_tokens=4, eval_every=0, device="cpu", dtype="bfloat16", sigma=0.05)
    train_es(config, task=ParityTask(), progress=False)
    final = load_file(str(run / "checkpoints" / "final" / "masters.safetensors"))
    base = load_file(str(folder / "model.safetensors"))
    assert any(not torch.equal(final[n], base[n]) for n in final)  # the run moved them
    model, _ = load_model(str(folder), dtype="bfloat16", device="cpu")
    weights = rebuild(model, run)
    for name, master in weights.master.items():
        assert torch.equal(master, final[name]), name
    start, _ = load_model(str(folder), dtype="bfloat16", device="cpu")
    replayed = rebuild(start, run, step=0)
    assert all(torch.equal(replayed.master[n], base[n]) for n in replayed.master)


def test_an_fp32_run_from_a_bf16_es_checkpoint_starts_from_its_masters(tmp_path, tokenizer):
    """ES in fp32 after an ES stage of a bf16 model: the masters (and the model the trainer, replicas and replay
    build them from) are the checkpoint's fp32 masters, not the widened rounding in its model file; a folder
    without a masters file keeps what was loaded."""
    from esft.es.build import make_weights
    from esft.es.es_config import ESConfig

    folder = tmp_path / "checkpoint"
    exact = bf16_es_checkpoint(folder, tokenizer, make_tiny_model(hidden=32, layers=1))
    loaded, _ = load_model(str(folder), dtype="float32", device="cpu")
    assert any(not torch.equal(p, exact[n]) for n, p in loaded.named_parameters())  # the test can fail
    weights = make_weights(loaded, ESConfig(model=str(folder), dtype="float32", device="cpu"))
    for name, master in weights.master.items():
        assert torch.equal(master, exact[name]), name
    assert all(torch.equal(p, exact[n]) for n, p in loaded.named_parameters())

    (folder / "masters.safetensors").unlink()
    plain, _ = load_model(str(folder), dtype="float32", device="cpu")
    before = {n: p.detach().clone() for n, p in plain.named_parameters()}
    weights = make_weights(plain, ESConfig(model=str(folder), dtype="float32", device="cpu"))
    assert all(torch.equal(weights.master[n], before[n]) for n in weights.master)
