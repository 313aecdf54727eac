"""Low-rank (EGGROLL) populations, esft.es.lowrank: the batched population forward equals member-by-member
forwards with the materialised perturbation, restore is exact, the update equals the explicit sum, and a
`noise="lowrank"` run trains and replays bit for bit.

Run: . .venv/bin/activate && pytest -q tests/test_es_lowrank.py   (~6 s, CPU)
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, bit_equal, state, stub_generate, tiny_llama
from esft.es.es_config import ESConfig
from esft.es.executor import LocalExecutor
from esft.es.lowrank import (LowRankExecutor, LowRankWeights, PopulationPerturbation, generate_population,
                             lowrank_factors, population_logits)
from esft.es.noise import Update
from esft.es.strategy import Member

MEMBERS = [Member(11, 1), Member(12, -1), Member(13, 1)]


def ids(batch=2, length=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (batch, length), generator=g)


def test_factors_and_noise_scale():
    model = tiny_llama()
    w = LowRankWeights(model, rank=4)
    assert all(w.master[n].dim() == 2 for n in w.names)
    assert w.frozen and all("norm" in n for n in w.frozen)  # RMSNorm gains: not perturbed in lowrank mode
    name = "model.layers.0.mlp.down_proj.weight"
    a, b = w.factors(7, name)
    assert a.shape == (64, 4) and b.shape == (128, 4)
    e = w.noise(7, name)
    torch.testing.assert_close(e, a @ b.t() / 2.0, rtol=1e-5, atol=1e-6)
    assert torch.linalg.matrix_rank(e).item() == 4
    big = LowRankWeights(tiny_llama(hidden=128), rank=2).noise(3, "model.embed_tokens.weight")
    assert abs(big.mean().item()) < 0.05 and big.var().item() == pytest.approx(1.0, abs=0.15)  # unit variance
    a2, _ = lowrank_factors(7, name, (64, 128), 4)
    assert torch.equal(a, a2)  # a pure function of (seed, name)


def member_logits_match(model, w, x, batched) -> list[torch.Tensor]:
    """Each member's logits from its materialised perturbation (perturb, forward, restore) equal the batched
    forward's row; returns them."""
    out = []
    for i, (seed, sign) in enumerate(MEMBERS):
        w.perturb(seed, sign, 0.05)
        with torch.inference_mode():
            out.append(model(input_ids=x).logits)
        w.restore()
        torch.testing.assert_close(batched[i], out[-1], rtol=1e-4, atol=1e-5)
    return out


@pytest.mark.parametrize("rank", [1, 3])
def test_batched_forward_equals_separate_materialised_forwards(rank):
    model = tiny_llama()
    w = LowRankWeights(model, rank=rank)
    x = ids()
    before = state(model)
    batched = population_logits(model, w, MEMBERS, 0.05, x)
    assert bit_equal(before, state(model))  # the fast path never touches the weights
    with torch.inference_mode():
        center = model(input_ids=x).logits
    for single in member_logits_match(model, w, x, batched):
        assert (single - center).abs().max() > 1e-3  # the perturbation is not negligible
    assert bit_equal(before, state(model))  # restore is exact
    with torch.inference_mode():  # hooks are gone
        assert torch.equal(model(input_ids=x).logits, center)


def test_a_position_embedding_looked_up_once_for_the_batch_gets_each_rows_member():
    """GPT-Neo looks up its position embedding with [1, T] positions and broadcasts it over the batch: the hook
    must still give each row its own member's term (it raised "batch has 1 rows but 3 rows are mapped")."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=256, max_position_embeddings=16, hidden_size=16, num_layers=1, num_heads=2,
                          attention_types=[[["global"], 1]], bos_token_id=0, eos_token_id=0)
    model = GPTNeoForCausalLM(config).eval().requires_grad_(False)
    w = LowRankWeights(model, rank=2)
    assert "transformer.wpe.weight" in w.names
    x = ids()
    batched = population_logits(model, w, MEMBERS, 0.05, x)
    member_logits_match(model, w, x, batched)
    only_positions = LowRankWeights(model, rank=2, include=["transformer.wpe.weight"])
    batched = population_logits(model, only_positions, MEMBERS, 0.05, x)
    singles = member_logits_match(model, only_positions, x, batched)
    assert (singles[0] - singles[2]).abs().max() > 1e-3  # the members' position terms differ row by row


def test_rows_follow_members_and_row_drops():
    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    x = ids(batch=3)
    ref = population_logits(model, w, MEMBERS, 0.05, x)  # [N, B, T, V]
    # rows in a scrambled member order, then a row drop: each row must stay its member
    order = [2, 0, 1, 1, 2]
    prompts = [0, 2, 1, 0, 1]
    with torch.inference_mode(), PopulationPerturbation(model, w, MEMBERS, 0.05) as pert:
        pert.set_rows(order)
        out = model(input_ids=x[prompts]).logits
        for k, (m, p) in enumerate(zip(order, prompts)):
            torch.testing.assert_close(out[k], ref[m, p], rtol=1e-4, atol=1e-5)
        keep = torch.tensor([1, 3])
        pert.select(keep)
        out2 = model(input_ids=x[[prompts[k] for k in keep.tolist()]]).logits
        for k, row in enumerate(keep.tolist()):
            torch.testing.assert_close(out2[k], ref[order[row], prompts[row]], rtol=1e-4, atol=1e-5)
        with pytest.raises(RuntimeError):  # a row count mismatch is an error, not a silent misalignment
            model(input_ids=x)


def test_update_equals_explicit_sum_and_is_full_rank():
    model = tiny_llama()
    r = 2
    w = LowRankWeights(model, rank=r)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n in w.frozen}
    before = {n: m.clone() for n, m in w.iter_masters()}
    seeds, coefs = tuple(range(100, 140)), tuple(float(c) for c in torch.linspace(-1, 1, 40).tolist())
    update = Update(seeds=seeds, coefficients=coefs, scale=0.01)
    norm = w.apply(update)
    sq = 0.0
    for name, m in w.iter_masters():
        expected = torch.zeros_like(m, dtype=torch.float64)
        for s, c in zip(seeds, coefs):
            a, b = w.factors(s, name)
            expected += c * (a.double() @ b.double().t()) / math.sqrt(r)
        delta = (m.double() - before[name].double())
        torch.testing.assert_close(delta, 0.01 * expected, rtol=1e-4, atol=1e-7)
        sq += float((delta ** 2).sum())
        if name == "model.layers.0.self_attn.q_proj.weight":  # 40 members x rank 2 > 64: full rank
            assert torch.linalg.matrix_rank(delta.float()).item() == 64
    assert norm == pytest.approx(sq ** 0.5, rel=1e-5)
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in frozen.items())  # non-matrix parameters never move


def test_rank_above_a_matrix_dimension_keeps_unit_variance_and_the_batched_forward():
    """r > min(m, n) (EGGROLL allows it): E = A B^T / sqrt(r) then has rank min(m, n), and every entry still has the
    unit variance of full-rank noise, E[E_ij^2] = sum_k E[a_ik^2 b_jk^2] / r = 1, estimated here over members."""
    model = tiny_llama(hidden=16, vocab_size=32)
    r = 24
    w = LowRankWeights(model, rank=r)
    name = "model.layers.0.self_attn.k_proj.weight"
    m, n = w.master[name].shape
    assert max(m, n) < r
    assert torch.linalg.matrix_rank(w.noise(5, name)).item() == min(m, n)
    second = torch.stack([w.noise(s, name) for s in range(400)]).double().pow(2).mean(0)  # per-entry E[E_ij^2]
    assert second.mean().item() == pytest.approx(1.0, abs=0.05) and (second - 1).abs().max().item() < 0.4
    x = torch.randint(3, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    member_logits_match(model, w, x, population_logits(model, w, MEMBERS, 0.05, x))


class TinyTokenizer:
    pad_token_id = 0
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def test_population_generation_matches_member_by_member():
    from esft.generation import GenerationConfig, generate

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    tok = TinyTokenizer()
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    cfg = GenerationConfig(max_new_tokens=6, batch_size=4)
    rows = [p for _ in MEMBERS for p in prompts]
    members = [i for i in range(len(MEMBERS)) for _ in prompts]
    with PopulationPerturbation(model, w, MEMBERS, 0.05) as pert:
        batched = generate_population(model, tok, rows, members, pert, cfg)
    for i, (seed, sign) in enumerate(MEMBERS):
        w.perturb(seed, sign, 0.05)
        single = generate(model, tok, [[]] * len(prompts), cfg, prompt_ids=prompts)
        w.restore()
        for j, g in enumerate(single):
            assert batched[i * len(prompts) + j].completion_ids == g.completion_ids
            assert batched[i * len(prompts) + j].prompt_tokens == g.prompt_tokens == len(prompts[j])


class _IdsTokenizer(TinyTokenizer):
    """ToyTask prompts are token ids already: the chat template returns them as they are."""

    def apply_chat_template(self, ids, add_generation_prompt=True, tokenize=True):
        return list(ids)


class _TokenTask(ToyTask):
    """Scores a completion by its token ids (position-weighted), so a row scored against the wrong example or
    member shows."""

    def score(self, completion: str, example) -> float:
        return float(sum((k + 1) * int(t) for k, t in enumerate(completion.split())))

    def is_well_formed(self, completion: str, example) -> bool:
        return True


def test_executor_default_path_scores_each_members_completion_of_each_example():
    """LowRankExecutor without a generate_fn (a run's path: encode once, `generate_population` over members x
    examples): score [i, j] is member i's completion of example j, as generated member by member."""
    from esft.generation import GenerationConfig, generate

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    tok, task = _IdsTokenizer(), _TokenTask()
    batch = task.load("train")[:3]
    cfg = GenerationConfig(max_new_tokens=4, batch_size=64)
    got = LowRankExecutor(model, tok, w, task, 0.05, cfg).evaluate_members(MEMBERS, batch)
    for i, (seed, sign) in enumerate(MEMBERS):
        w.perturb(seed, sign, 0.05)
        single = generate(model, tok, [[]] * len(batch), cfg, prompt_ids=[ex["ids"] for ex in batch])
        w.restore()
        assert got.scores[i].tolist() == [task.score(g.text, ex) for g, ex in zip(single, batch)]
    assert len(set(got.scores.ravel().tolist())) > len(batch)  # rows differ: a mix-up of rows would show


def test_executor_equals_local_executor_on_materialised_weights():
    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    task = ToyTask()
    batch = task.load("train")[:8]
    members = [Member(s, 1) for s in range(20, 26)]
    fast = LowRankExecutor(model, None, w, task, 0.05, None, generate_fn=stub_generate).evaluate_members(members, batch)
    slow = LocalExecutor(model, None, w, task, 0.05, None, generate_fn=stub_generate).evaluate_members(members, batch)
    assert (fast.scores == slow.scores).all() and (fast.well_formed == slow.well_formed).all()
    assert fast.scores.mean(axis=1).std() > 0  # members differ
    assert set(fast.timings) == {"perturb", "generate", "score", "restore"}


@pytest.mark.parametrize("change", [-1, 1])
def test_a_generate_that_returns_another_number_of_completions_is_refused(change):
    """One completion short left the last member's last example unscored (0, a wrong answer in its fitness); one
    extra raised an IndexError that named nothing: both are refused with the two counts, hooks removed."""
    def generate(model, tokenizer, prompts, cfg):
        gens = stub_generate(model, tokenizer, prompts, cfg)
        return gens[:change] if change < 0 else gens + gens[:change]

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    batch = ToyTask().load("train")[:4]
    executor = LowRankExecutor(model, None, w, ToyTask(), 0.05, None, generate_fn=generate)
    with pytest.raises(ValueError, match=r"returned (7|9) completions for 8 prompts \(2 members x 4\)"):
        executor.evaluate_members([Member(1, 1), Member(2, -1)], batch)
    assert not any(m._forward_hooks for m in model.modules())
    assert bit_equal(state(model), state(tiny_llama()))


def test_lowrank_run_replays_bit_for_bit(tmp_path):
    from esft.es.replay import matches_checkpoint, rebuild
    from esft.api import train_es

    config = ESConfig(model="tiny", task="toy", population_size=6, sigma=0.05, alpha=0.02, batch_size=8, iterations=4,
                      max_new_tokens=2, seed=5, output_dir=str(tmp_path / "lr"), eval_every=0, noise="lowrank", rank=2,
                      format_bonus=0.1)
    res = train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                   progress=False)
    from esft.es import es_rundir as runlog

    lines = runlog.read_jsonl(res.output_dir / "seeds.jsonl")
    assert any(r["update_norm"] > 0 for r in lines)
    model = tiny_llama()
    weights = rebuild(model, res.output_dir)
    assert isinstance(weights, LowRankWeights)
    assert matches_checkpoint(model, weights, res.final_checkpoint)


def test_lowrank_rejects_ray_and_bad_rank():
    from esft.es.distributed.factory import make_executor

    with pytest.raises(ValueError, match="lowrank"):
        make_executor(ESConfig(noise="lowrank", executor="ray"), model=None, tokenizer=None,
                      weights=SimpleNamespace(), task=None, gen_config=None)
    with pytest.raises(ValueError):
        LowRankWeights(tiny_llama(), rank=0)


def test_bench_lowrank_workload(tokenizer):
    """`esft bench --noise lowrank`: the same prompts and token counts as the full-rank iteration (min_new_tokens
    honoured by the population decode loop), a non-zero update."""
    from conftest import make_tiny_model
    from esft import bench

    prompts = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(3)]
    work = bench.Workload("small", prompts, max_new_tokens=4, min_new_tokens=4, generation_batch_size=4,
                          sigma=1e-2, alpha=1e-3)
    model = make_tiny_model()
    before = {n: p.clone() for n, p in model.named_parameters()}
    low = bench.esft_iteration(model, tokenizer, work, population=2, noise="lowrank", gen_overrides={}, rank=2)
    assert not low["zero_update"]
    bench._reset(model, before)
    full = bench.esft_iteration(model, tokenizer, work, population=2, noise="per-tensor", gen_overrides={})
    assert low["generated_tokens"] == full["generated_tokens"] == 2 * 3 * 4
    assert low["prompt_tokens"] == full["prompt_tokens"]
    assert {"perturb", "generate", "restore", "update", "iteration"} <= set(low["timings"])


@pytest.mark.parametrize("fast, sigma", [(False, 0.05), (True, 0.05), (True, 1.0)])
def test_population_generation_lean_equals_hf_hooks(fast, sigma, monkeypatch):
    """The lean decode step adds the population's per-row terms itself (hooks do not fire there): same tokens as
    the HF forward with hooks, bit for bit without the fast CPU options, greedy-equal with them; rows that emit
    eos are dropped from the batch and from the row -> member mapping in step. sigma 1.0 makes the per-row terms of
    the lm_head decide the first token too (a prefill through the lean head without them would differ)."""
    import dataclasses

    from esft.generation import GenerationConfig
    from esft.generation.lean_step import fused_attention_reason
    from esft.generation.packed import packed_linear_reason

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    tok = TinyTokenizer()
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
    rows = [p for _ in MEMBERS for p in prompts]
    members = [i for i in range(len(MEMBERS)) for _ in prompts]
    hf_cfg = GenerationConfig(max_new_tokens=30, batch_size=len(rows), lean=False)
    with PopulationPerturbation(model, w, MEMBERS, sigma) as pert:
        probe = generate_population(model, tok, rows, members, pert, hf_cfg)
    tok.eos_token_id = probe[0].completion_ids[4]  # a token row 0 emits at step 4 now ends rows: some stop early
    lean_cfg = dataclasses.replace(hf_cfg, lean=True)
    if fast:
        options = {k: True for k, why in (("packed_linear", packed_linear_reason(torch.float32)),
                                          ("fused_attention", fused_attention_reason(torch.float32))) if why is None}
        if not options:
            pytest.skip("no fast CPU option available here")
        lean_cfg = dataclasses.replace(lean_cfg, **options)
    with PopulationPerturbation(model, w, MEMBERS, sigma) as pert:
        ref = generate_population(model, tok, rows, members, pert, hf_cfg)
    from esft.generation import engine

    lean_calls = []
    lean_decode = engine.lean_decode

    def spy(*args, delta=None, **kw):
        lean_calls.append(delta)
        return lean_decode(*args, delta=delta, **kw)

    monkeypatch.setattr(engine, "lean_decode", spy)
    with PopulationPerturbation(model, w, MEMBERS, sigma) as pert:
        ours = generate_population(model, tok, rows, members, pert, lean_cfg)
    assert lean_calls and all(d is pert for d in lean_calls)  # the lean step ran, adding the population's terms
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    lengths = [len(g.completion_ids) for g in ref]
    assert min(lengths) < 30 and max(lengths) == 30  # rows were dropped mid-generation


def test_bench_lowrank_script_refuses_a_rank_below_one():
    """`scripts/bench_lowrank.py --rank 0` ended in a traceback from inside the noise code after the model loaded."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_lowrank.py"
    done = subprocess.run([sys.executable, str(script), "--rank", "0", "--population", "0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "error: --rank, --population must be at least 1"), done.stderr


def test_unmapped_rows_and_an_empty_population_are_refused_clearly():
    """A forward pass (already) or a select() (an AttributeError on None before) with no rows mapped raises a
    RuntimeError that says to call set_rows(); an empty population is refused at construction (it was
    torch.cat's "expected a non-empty list of Tensors"), with no hook left on the model."""
    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    x = ids()
    with torch.inference_mode():
        center = model(input_ids=x).logits
    with torch.inference_mode(), PopulationPerturbation(model, w, MEMBERS, 0.05) as pert:
        with pytest.raises(RuntimeError, match=r"call PopulationPerturbation\.set_rows\(member_of_row\)"):
            model(input_ids=x)
        with pytest.raises(RuntimeError, match=r"set_rows\(member_of_row\)"):
            pert.select(torch.tensor([0]))
    with pytest.raises(ValueError, match="at least one member"):
        PopulationPerturbation(model, w, [], 0.05)
    with torch.inference_mode():
        assert torch.equal(model(input_ids=x).logits, center)
