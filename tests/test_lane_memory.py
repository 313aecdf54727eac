"""ES lanes' memory (docs/performance.md, "Memory"): a lane copy's projections are freed while the lean engine holds
their packed copies (`esft.generation.releasing`) and re-allocated by the next perturb / restore
(`esft.es.noise.materialise`); with parallel lanes the masters share the model's storage and every lane is a copy.
None of it changes a completion.

Run: pytest -q tests/test_lane_memory.py   (~1 min on 2 cores, no download)
"""

from __future__ import annotations

import copy

import pytest
import torch

from es_tiny import bit_equal, state
from esft.config import FAST_CPU_GENERATION
from esft.es.build import make_weights
from esft.es.es_config import ESConfig
from esft.es.executor import LocalExecutor
from esft.es.noise import MasterWeights, materialise

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fast_ready() -> None:
    from esft.generation import lean

    if lean.packed_linear_reason(torch.float32) or lean.fused_attention_reason(torch.float32):
        pytest.skip("no oneDNN packed linear or no compiled kernel here")


def _released(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.untyped_storage().nbytes() == 0}


def test_generation_frees_only_the_named_projections_and_completions_do_not_change(tokenizer):
    from esft.generation import GenerationConfig, generate, releasing
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    model = _tiny("llama")
    lane = copy.deepcopy(model)
    # three batches: the projections are packed again for each, and freed by the last one only
    cfg = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=12, batch_size=2)
    ref = generate(model, tokenizer, PROMPTS, cfg)
    named = [p for n, p in lane.named_parameters() if "layers.0." in n or "lm_head" in n or "embed" in n]
    with releasing(named):
        ours = generate(lane, tokenizer, PROMPTS, cfg)
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    # layer 0's projections only: not layer 1's (not named), never the embedding / lm_head or a norm gain
    assert _released(lane) == {n for n, _ in lane.named_parameters()
                               if "layers.0." in n and any(k in n for k in PROJECTIONS)}
    assert not _released(model)
    generate(model, tokenizer, PROMPTS, cfg)  # outside the context nothing is freed
    assert not _released(model)


@pytest.mark.parametrize("noise", ["table", "per-tensor"])
def test_a_released_copy_is_rewritten_exactly_by_perturb_and_restore(noise):
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica

    model = tiny_llama()
    weights = MasterWeights(model, noise=noise, share_storage=True)
    replica = rollout_replica(model, torch.float32)
    bound = weights.bind(replica)
    for p in replica.parameters():
        p.untyped_storage().resize_(0)
    bound.perturb(7, -1, 0.05, replace=True)
    params = dict(replica.named_parameters())
    for name, master in weights.master.items():
        assert torch.equal(params[name], torch.add(master, weights.noise(7, name), alpha=-0.05)), name
    for p in replica.parameters():
        p.untyped_storage().resize_(0)
    bound.restore()
    assert all(torch.equal(p, weights.master[n]) for n, p in replica.named_parameters())
    kept = torch.ones(3)
    assert materialise(kept) is kept and torch.equal(kept, torch.ones(3))  # a full tensor is left as it is


class _Chat:
    """Chat prompts, scored 0: the test compares completions."""

    name = "chat"

    def __init__(self, prompts):
        self.rows = [{"messages": p} for p in prompts]

    def load(self, split="train", limit=None):
        return self.rows

    def prompt(self, example):
        return example["messages"]

    def score(self, completion, example):
        return 0.0

    def is_well_formed(self, completion, example):
        return True


def test_parallel_lanes_on_copies_give_the_completions_of_the_model_perturbed_in_place(tokenizer):
    from esft.generation import GenerationConfig
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    torch.set_num_threads(2)
    task = _Chat(PROMPTS)
    batch = task.load()
    gen = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=10, batch_size=5)
    members = [(21, 1), (21, -1), (22, 1)]
    config = ESConfig(noise="table", parallel_members=2)

    plain = _tiny("llama")
    one_lane = LocalExecutor(plain, tokenizer, MasterWeights(plain, noise="table"), task, 0.02, gen)
    expected = one_lane.evaluate_members(members, batch).texts + one_lane.evaluate_center(batch).texts

    model = _tiny("llama")
    centre = state(model)
    weights = make_weights(model, config)
    assert weights.shared  # parallel lanes: the model's parameters are the masters (no second fp32 model)
    ex = LocalExecutor(model, tokenizer, weights, task, 0.02, gen, parallel_members=2)
    got = ex.evaluate_members(members, batch).texts
    lane_models = [ex._lane(k)[0] for k in range(ex.lanes_for(len(members)))]
    got += ex.evaluate_center(batch).texts
    assert got == expected
    assert bit_equal(state(model), centre) and not _released(model)  # the model is never perturbed nor freed
    assert all(m is not model for m in lane_models)
    # the lanes' projections were freed after packing (lane 0 generated the centre last, so it holds them freed)
    assert any(n.endswith("q_proj.weight") for n in _released(lane_models[0]))
    ex.close()


def test_one_lane_on_the_packed_path_generates_on_a_released_copy(tokenizer):
    """One lane with packed linears: the masters are the model's parameters and the lane a copy whose projections
    are freed while packed (no second fp32 model, no restore), with the completions of the in-place path."""
    from esft.generation import GenerationConfig
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    task = _Chat(PROMPTS)
    batch = task.load()
    gen = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=10, batch_size=5)
    members = [(21, 1), (22, -1)]

    plain = _tiny("llama")
    in_place = LocalExecutor(plain, tokenizer, MasterWeights(plain, noise="table"), task, 0.02, gen)
    expected = in_place.evaluate_members(members, batch).texts

    model = _tiny("llama")
    centre = state(model)
    weights = make_weights(model, ESConfig(noise="table", generation_options=dict(FAST_CPU_GENERATION)))
    assert weights.shared
    assert not make_weights(_tiny("llama"), ESConfig(noise="table")).shared  # exact path: in place, as before
    ex = LocalExecutor(model, tokenizer, weights, task, 0.02, gen)
    assert ex.evaluate_members(members, batch).texts == expected
    lane = ex._lane(0)[0]
    assert lane is not model and bit_equal(state(model), centre) and not _released(model)
    assert any(n.endswith("q_proj.weight") for n in _released(lane))
    ex.close()


def test_large_blocks_are_mapped_one_by_one_under_glibc():
    import platform

    from esft.es.executor import map_large_blocks

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert map_large_blocks() is True
