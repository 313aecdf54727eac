"""ES lanes' memory (docs/performance.md, "Memory"): a lane copy's projections are freed while the lean engine holds
their packed copies (`esft.generation.releasing`) and re-allocated by the next perturb / restore
(`esft.es.param_writes.materialise`); with parallel lanes the masters share the model's storage and every lane is a copy.
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
from esft.es.noise import MasterWeights
from esft.es.param_writes import materialise

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
def test_a_released_copy_is_written_exactly_when_the_engine_reads_it(noise):
    """perturb / restore leave a bound copy's released parameters unwritten (`deferred`) and `fill` writes them
    later with the same bits as an immediate write, tensor by tensor; parameters with storage are written at once."""
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica

    model = tiny_llama()
    weights = MasterWeights(model, noise=noise, share_storage=True)
    replica = rollout_replica(model, torch.float32)
    bound = weights.bind(replica)
    params = dict(replica.named_parameters())
    freed = [n for n in params if "layers.0." in n]
    for n in freed:
        params[n].untyped_storage().resize_(0)
    bound.perturb(7, -1, 0.05, replace=True)
    assert sorted(bound.deferred) == sorted(freed) and set(_released(replica)) == set(freed)
    expected = {n: torch.add(m, weights.noise(7, n), alpha=-0.05) for n, m in weights.master.items()}
    assert all(torch.equal(params[n], expected[n]) for n in params if n not in freed)  # written at once
    first = params[freed[0]]
    bound.fill([first])  # one tensor: only that one is written
    assert torch.equal(first, expected[freed[0]]) and sorted(bound.deferred) == sorted(freed[1:])
    bound.fill()
    assert not bound.deferred and all(torch.equal(params[n], expected[n]) for n in params)
    # a later member replaces an older deferred write: the fill writes the newest member, not the first
    for n in freed:
        params[n].untyped_storage().resize_(0)
    bound.perturb(8, 1, 0.05, replace=True)
    bound.perturb(9, 1, 0.05, replace=True)
    bound.fill()
    assert all(torch.equal(params[n], torch.add(weights.master[n], weights.noise(9, n), alpha=0.05)) for n in params)
    for p in replica.parameters():
        p.untyped_storage().resize_(0)
    bound.restore()
    assert sorted(bound.deferred) == sorted(params)
    bound.fill()
    assert all(torch.equal(p, weights.master[n]) for n, p in replica.named_parameters())
    assert weights.deferred == []  # the masters' own object never defers
    kept = torch.ones(3)
    assert materialise(kept) is kept and torch.equal(kept, torch.ones(3))  # a full tensor is left as it is


def test_fill_passes_over_tensors_outside_the_selection():
    """The engine asks `fill` for every weight of a layer it packs; those the masters do not select (here the
    attention projections, with include=mlp) are not the copy's to write and are passed over."""
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica

    model = tiny_llama()
    weights = MasterWeights(model, noise="table", share_storage=True, include=[r"\.mlp\."])
    replica = rollout_replica(model, torch.float32)
    bound = weights.bind(replica)
    params = dict(replica.named_parameters())
    name = "model.layers.0.mlp.up_proj.weight"
    up, q = params[name], params["model.layers.0.self_attn.q_proj.weight"]
    assert name in bound.params and "model.layers.0.self_attn.q_proj.weight" not in bound.params
    up.untyped_storage().resize_(0)
    bound.perturb(5, 1, 0.1, replace=True)
    assert bound.deferred == [name]
    bound.fill([q, up])
    assert bound.deferred == [] and torch.equal(up, torch.add(weights.master[name], weights.noise(5, name), alpha=0.1))


def test_the_models_own_weights_are_written_at_once_even_without_storage():
    """Only a bound copy defers writes to `fill`; the masters' own object writes every parameter at perturb and
    restore, giving storage back to one that has none, so its `deferred` is always empty."""
    from es_tiny import tiny_llama
    from esft.es.param_writes import released

    model = tiny_llama()
    weights = MasterWeights(model)
    name = "model.layers.1.self_attn.q_proj.weight"
    param = weights.params[name]
    param.untyped_storage().resize_(0)
    weights.perturb(3, 1, 0.1)
    assert weights.deferred == [] and not released(param)  # checked first: a released tensor must not be read
    assert torch.equal(param, torch.add(weights.master[name], weights.noise(3, name), alpha=0.1))
    param.untyped_storage().resize_(0)
    weights.restore()
    assert not released(param) and torch.equal(param, weights.master[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_of_a_copy_are_the_bits_of_its_whole_write(dtype):
    """`MasterWeights.rows`, the source of a freed vocabulary matrix (esft.generation.vocab), gives for row ids and
    for blocks the bits that perturb / restore write into the whole tensor (fp32, and bf16 copies rounded once),
    whether the copy's tensor is written or freed; a tensor freed after its write is written again by `fill`."""
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica

    model = tiny_llama(vocab_size=4096, hidden=128)
    weights = MasterWeights(model, noise="table", share_storage=True)
    replica = rollout_replica(model, dtype)
    bound = weights.bind(replica, cast=dtype != torch.float32)
    param = replica.model.embed_tokens.weight
    ids = torch.tensor([5, 0, 5, param.shape[0] - 1, 17, 2048])
    for member in ((11, -1), None, (12, 1)):
        if member is None:
            bound.restore()
        else:
            bound.perturb(*member, 0.03, replace=True)
        whole = param.detach().clone()
        assert torch.equal(bound.rows(param, ids), whole[ids])
        assert torch.equal(bound.rows(param, slice(1000, 3000)), whole[1000:3000])
        param.untyped_storage().resize_(0)  # freed by the engine after the write: rows are computed all the same
        assert torch.equal(bound.rows(param, ids), whole[ids])
        bound.fill([param])
        assert torch.equal(param, whole)
    per_tensor = MasterWeights(model, noise="per-tensor", share_storage=True).bind(rollout_replica(model, dtype),
                                                                                   cast=True)
    with pytest.raises(ValueError, match="table noise"):
        per_tensor.rows(dict(per_tensor.params.items())["model.embed_tokens.weight"], ids)


def test_vocab_rows_are_computed_only_for_aligned_matrices_the_context_may_free():
    """VocabRows reads through the context's `rows` only for a named weight whose rows are a multiple of 64
    elements (the same SIMD lanes as the whole-matrix write); otherwise it reads, and never frees, the weight."""
    from esft.generation import releasing
    from esft.generation.vocab import VocabRows

    aligned, odd, other = torch.randn(10, 64), torch.randn(10, 40), torch.randn(10, 64)
    asked = []

    def rows(weight, index, out):
        asked.append(index)
        n = len(range(weight.shape[0])[index]) if isinstance(index, slice) else len(index)
        return torch.full((n, weight.shape[1]), 7.0)

    with releasing([aligned, odd], rows=rows):
        vocab = [VocabRows(aligned), VocabRows(odd), VocabRows(other)]
        assert [v.computed for v in vocab] == [True, False, False]
        for v in vocab:
            v.free()
        assert [t.untyped_storage().nbytes() == 0 for t in (aligned, odd, other)] == [True, False, False]
        ids = torch.tensor([3, 1])
        assert torch.equal(vocab[0].embed(ids[None]), torch.full((1, 2, 64), 7.0))
        assert torch.equal(vocab[1].embed(ids[None]), odd[ids][None])
        assert [b.shape[0] for _, b in vocab[0].blocks(4)] == [4, 4, 2]
    assert len(asked) == 4


def test_a_deferred_write_is_dropped_once_the_tensor_is_written_directly():
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica

    model = tiny_llama()
    weights = MasterWeights(model, noise="table", share_storage=True)
    replica = rollout_replica(model, torch.float32)
    bound = weights.bind(replica)
    name, param = next((n, p) for n, p in replica.named_parameters() if "q_proj" in n)
    param.untyped_storage().resize_(0)
    bound.perturb(3, 1, 0.1, replace=True)
    assert bound.deferred == [name]
    bound.fill()  # storage again: the next perturb writes it at once and must forget the deferred one
    bound.perturb(4, 1, 0.1, replace=True)
    assert bound.deferred == []
    bound.fill()
    assert torch.equal(param, torch.add(weights.master[name], weights.noise(4, name), alpha=0.1))


def test_generation_fills_a_lanes_deferred_projections_layer_by_layer(tokenizer):
    """Inside `releasing(..., fill=)` the stacked path asks for each layer's projections just before packing them:
    the lane never holds two layers' plain projections at once, and the completions are those of weights written
    up front."""
    from esft.generation import GenerationConfig, generate, releasing
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    model = _tiny("llama")
    lane = copy.deepcopy(model)
    cfg = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=12, batch_size=len(PROMPTS))
    ref = generate(model, tokenizer, PROMPTS, cfg)
    backup = {n: p.detach().clone() for n, p in lane.named_parameters()}
    names = {id(p): n for n, p in lane.named_parameters()}
    projections = [p for n, p in lane.named_parameters() if any(k in n for k in PROJECTIONS)]
    for p in projections:
        p.untyped_storage().resize_(0)
    asked: list[list[str]] = []
    held: list[int] = []

    def fill(tensors):
        asked.append(sorted(names[id(t)] for t in tensors) if tensors is not None else ["*"])
        for t in tensors or projections:
            if t.untyped_storage().nbytes() == 0:
                materialise(t).copy_(backup[names[id(t)]])
        held.append(sum(1 for p in projections if p.untyped_storage().nbytes() > 0))

    with releasing(projections, fill=fill):
        ours = generate(lane, tokenizer, PROMPTS, cfg)
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    layers = model.config.num_hidden_layers
    assert len(asked) == layers
    assert all(len(a) == len(PROJECTIONS) and all(f"layers.{i}." in n for n in a) for i, a in enumerate(asked))
    assert max(held) == len(PROJECTIONS)  # one layer's plain projections at a time
    assert len(_released(lane)) == len(projections)  # and all freed again once packed

    # a path that reads the plain weights (here model.generate) asks for all of them first
    asked.clear()
    for p in projections:
        p.untyped_storage().resize_(0)
    hf = GenerationConfig(engine="hf", max_new_tokens=12, batch_size=len(PROMPTS))
    with releasing(projections, fill=fill):
        theirs = generate(lane, tokenizer, PROMPTS, hf)
    assert asked[0] == ["*"] and not _released(lane)
    assert [g.completion_ids for g in theirs] == [g.completion_ids for g in generate(model, tokenizer, PROMPTS, hf)]


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


def _two_members_in_place(tokenizer):
    """Chat prompts on the packed path, two members, and their completions on a tiny model perturbed in place."""
    from esft.generation import GenerationConfig
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    task = _Chat(PROMPTS)
    batch = task.load()
    gen = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=10, batch_size=5)
    members = [(21, 1), (22, -1)]
    plain = _tiny("llama")
    in_place = LocalExecutor(plain, tokenizer, MasterWeights(plain, noise="table"), task, 0.02, gen)
    return task, batch, gen, members, in_place.evaluate_members(members, batch).texts


@pytest.mark.parametrize("screen", ["as this CPU has it", "off"])
def test_one_lane_on_the_packed_path_generates_on_a_released_copy(tokenizer, monkeypatch, screen):
    """One lane with packed linears: the masters are the model's parameters and the lane a copy whose projections
    are freed while packed (no second fp32 model, no restore), with the completions of the in-place path. With or
    without the bf16 screen ("off": as on a CPU without native bf16, whatever this one has) the vocabulary matrix
    is freed too: the screened path reads its rows and blocks, the unscreened one packs the head whole first."""
    from esft.generation import lean, packed
    from test_lean import _tiny

    if screen == "off":
        for module in (lean, packed):
            monkeypatch.setattr(module, "bf16_matmul_is_native", lambda: False)
    task, batch, gen, members, expected = _two_members_in_place(tokenizer)
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
    # table noise: the vocabulary matrix is freed too, its rows computed from the masters (esft.generation.vocab)
    assert "model.embed_tokens.weight" in _released(lane)
    ex.close()


def test_a_new_lane_copy_starts_with_its_matrices_released_and_generates_the_in_place_completions(tokenizer):
    """A lane copy made for esft's engine holds no plain matrices before its first member: the engine writes each
    one as it reads it (`MasterWeights.fill`), so the first member never leaves a whole plain model in the heap.
    Vectors (norm gains) keep their storage, and an injected generate function, which may read the copy's
    parameters directly, gets a copy with all of them."""
    from test_lean import _tiny

    task, batch, gen, members, expected = _two_members_in_place(tokenizer)
    model = _tiny("llama")
    weights = make_weights(model, ESConfig(noise="table", generation_options=dict(FAST_CPU_GENERATION)))
    ex = LocalExecutor(model, tokenizer, weights, task, 0.02, gen)
    ex.start()
    lane = ex._lane(0)[0]
    matrices = {n for n, p in lane.named_parameters() if p.dim() >= 2}
    assert matrices and _released(lane) == matrices
    assert ex.evaluate_members(members, batch).texts == expected

    other = _tiny("llama")
    ex = LocalExecutor(other, tokenizer, make_weights(other, ESConfig(noise="table", parallel_members=2)), task, 0.02,
                       gen, generate_fn=lambda *a, **kw: [])
    ex.start()
    assert not _released(ex._lane(0)[0])


def test_large_blocks_are_mapped_one_by_one_under_glibc():
    import platform

    from esft.es.executor import map_large_blocks

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert map_large_blocks() is True


def _amx_ready(weight: torch.Tensor) -> None:
    from esft.generation.packed import amx_linear_reason

    if (why := amx_linear_reason(weight)) is not None:
        pytest.skip(why)


@pytest.mark.parametrize("noise", ["table", "per-tensor"])
def test_a_bf16_copys_freed_layer_comes_packed_from_its_owner_with_the_bits_of_write_stack_pack(noise):
    """`MasterWeights.tiles` (CPUs with AMX): a bound bf16 copy's freed projections, stacked by rows, straight in
    the AMX linear's layout, for members and the centre: the bits that perturb / restore's write, a torch.cat and
    `pack_weight` give. An fp32 copy is not packed so (None: the engine fills and packs)."""
    from es_tiny import tiny_llama
    from esft.es.executor import rollout_replica
    from esft.generation.packed import pack_weight

    model = tiny_llama(hidden=64)
    replica = rollout_replica(model, torch.bfloat16)
    a, m = replica.model.layers[1].self_attn, replica.model.layers[1].mlp
    _amx_ready(a.k_proj.weight)
    groups = [(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), (a.o_proj.weight,),
              (m.gate_proj.weight, m.up_proj.weight), (m.down_proj.weight,)]
    bound = MasterWeights(model, noise=noise, share_storage=True).bind(replica, cast=True)
    for member in ((11, -1), None, (12, 1)):
        if member is None:
            bound.restore()
        else:
            bound.perturb(*member, 0.03, replace=True)
        bound.fill()  # every freed parameter written as this member has it
        for g in groups:
            expected = pack_weight(torch.cat(g).detach(), 32)
            for t in g:
                t.untyped_storage().resize_(0)
            got = bound.tiles(g)
            assert got.shape == expected.shape and torch.equal(got, expected)
    fp32 = rollout_replica(model, torch.float32)
    plain = MasterWeights(model, noise=noise, share_storage=True).bind(fp32)
    assert plain.tiles([fp32.model.layers[0].self_attn.o_proj.weight]) is None


def test_a_bf16_lane_packs_its_freed_layers_from_the_masters_and_keeps_its_completions(tokenizer, monkeypatch):
    """One bf16 lane on the packed path (CPUs with AMX): the engine asks the lane's owner for each freed layer
    already packed (`released_tiles` -> `MasterWeights.tiles`), so no projection of the copy is ever written, and
    the completions are those of the path that writes, stacks and packs them."""
    from esft.es import noise as noise_module
    from esft.generation import GenerationConfig
    from test_lean import PROMPTS, _tiny

    _fast_ready()
    task = _Chat(PROMPTS)
    batch = task.load()
    gen = GenerationConfig(**FAST_CPU_GENERATION, max_new_tokens=10, batch_size=5)
    members = [(21, 1), (22, -1)]
    config = ESConfig(noise="table", rollout_dtype="bfloat16", generation_options=dict(FAST_CPU_GENERATION))
    written: list[bool] = []
    real_materialise = noise_module.materialise
    texts = {}
    for packed_by_owner in (True, False):
        if not packed_by_owner:
            monkeypatch.setattr(MasterWeights, "tiles", lambda self, tensors: None)
        model = _tiny("llama")
        ex = LocalExecutor(model, tokenizer, make_weights(model, config), task, 0.02, gen,
                           rollout_dtype=torch.bfloat16)
        ex.start()
        lane = ex._lane(0)[0]
        _amx_ready(lane.model.layers[0].self_attn.k_proj.weight)
        projections = {id(p) for n, p in lane.named_parameters() if any(k in n for k in PROJECTIONS)}
        written.clear()
        monkeypatch.setattr(noise_module, "materialise", lambda p: (written.append(id(p) in projections),
                                                                     real_materialise(p))[1])
        texts[packed_by_owner] = ex.evaluate_members(members, batch).texts + ex.evaluate_center(batch).texts
        ex.close()
        monkeypatch.setattr(noise_module, "materialise", real_materialise)
        assert any(written) != packed_by_owner  # projections written only where the engine packs them itself
    assert texts[True] == texts[False]
