"""A model in memory and its saved folder are read as the same canonical tensors (esft.analysis.sources), rows cut
where a chunk or a fused tensor's segment ends. Run: `pytest tests/test_analysis_sources_mutmutcli.py -q`."""

from __future__ import annotations

import torch


def test_a_module_and_its_saved_folder_have_the_same_canonical_tensors(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from esft.analysis.sources import CheckpointSource, module_source, refs_of

    torch.manual_seed(0)
    # GPT-2's fused c_attn is split into q, k, v by its config: a module read without it would keep one tensor
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=16))
    model.save_pretrained(tmp_path)
    source = module_source(model)
    assert source.config == model.config.to_dict()
    in_memory, on_disk = refs_of(source), refs_of(CheckpointSource(tmp_path))
    assert {n: r.shape for n, r in in_memory.items()} == {n: r.shape for n, r in on_disk.items()}
    assert {"layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj"} <= set(in_memory)


def test_a_read_with_one_end_open_is_the_slice_to_that_end(tmp_path):
    from safetensors.torch import save_file

    from esft.analysis.sources import CheckpointSource, StateDictSource

    t = torch.arange(12.0).reshape(4, 3)
    save_file({"w": t, "s": torch.tensor(5.0)}, str(tmp_path / "model.safetensors"))
    for source in (CheckpointSource(tmp_path), StateDictSource({"w": t, "s": torch.tensor(5.0)})):
        assert torch.equal(source.read("w", 1), t[1:])
        assert torch.equal(source.read("w", None, 2), t[:2])
        assert torch.equal(source.read("w", 1, 3), t[1:3]) and torch.equal(source.read("w"), t)
        assert torch.equal(source.read("s", 0, 1), torch.tensor(5.0))  # a 0-d tensor has no rows: itself
