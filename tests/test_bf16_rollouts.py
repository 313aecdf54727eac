"""bf16 rollouts (esft.generation.precision, esft.es.executor.rollout_replica, MasterWeights.bind(cast=True)):
the dispatch on both kinds of CPU (flags and probe mocked), rollout weights equal round(master + sigma * eps) for
every tensor, masters / noise / updates fp32 so runs resume and replay exactly, the choice recorded in the run
directory (and a run directory made before the option resumes in fp32), and the lean engine's bf16 path.

Run: pytest -q tests/test_bf16_rollouts.py   (~30 s on 2 cores, no download)
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import yaml

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, bit_equal, state, stub_generate, tiny_llama
from esft.config import FAST_CPU_GENERATION
from esft.es import es_rundir
from esft.es.build import rollout_precision
from esft.es.es_config import ESConfig, read_run_config, resume_config
from esft.es.executor import LocalExecutor, rollout_replica
from esft.es.noise import MasterWeights, Update
from esft.generation import precision

FAST = dict(FAST_CPU_GENERATION)


@pytest.fixture(autouse=True)
def _kernel_built(monkeypatch):
    """The machines of these tests are mocked (flags, probe): so is whether the fused-attention kernel builds."""
    monkeypatch.setattr(precision, "fused_kernel_reason", lambda: None, raising=False)


def _never():
    raise AssertionError("the probe must not run")


# ---- dispatch ---------------------------------------------------------------------------------------------------

def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16_confirmed_by_the_probe():
    resolve = precision.resolve_rollout_dtype
    amx = ["fpu", "avx512f", "amx_bf16", "amx_tile"]
    chosen = resolve("auto", generation_options=FAST, flags=amx, probe=lambda: 2.4)
    assert chosen.dtype == "bfloat16" and chosen.torch_dtype == torch.bfloat16
    assert chosen.native_flags == ("amx_bf16",) and chosen.probe_speedup == 2.4
    assert chosen.record()["rollout_dtype"] == "bfloat16"
    # AMD's AVX512-BF16 counts too; a CPU without any native bf16 (emulated by oneDNN) stays fp32, unprobed
    assert resolve("auto", generation_options=FAST, flags=["avx512_bf16"], probe=lambda: 1.9).dtype == "bfloat16"
    plain = resolve("auto", generation_options=FAST, flags=["avx2", "avx512f"], probe=_never)
    assert plain.dtype == "float32" and "no native bf16" in plain.reason
    # the probe must confirm it
    slow = resolve("auto", generation_options=FAST, flags=amx, probe=lambda: 1.05)
    assert slow.dtype == "float32" and "probe" in slow.reason
    assert resolve("auto", generation_options=FAST, flags=amx, probe=lambda: None).dtype == "float32"
    # not a CPU, or not the packed fused rollout path: fp32
    assert resolve("auto", device="cuda", generation_options=FAST, flags=amx, probe=_never).dtype == "float32"
    assert resolve("auto", generation_options={}, flags=amx, probe=_never).dtype == "float32"
    # explicit requests are honoured everywhere; None (a config from before the option) is the exact mode
    assert resolve("float32", generation_options=FAST, flags=amx, probe=_never).dtype == "float32"
    assert resolve("bfloat16", generation_options={}, flags=[], probe=_never).dtype == "bfloat16"
    assert resolve(None, generation_options=FAST, flags=amx, probe=_never).dtype == "float32"
    with pytest.raises(ValueError, match="rollout_dtype"):
        resolve("float16")


def test_native_flags_and_the_probe_on_this_machine():
    assert precision.native_bf16_flags(["sse", "avx512_bf16", "amx_bf16"]) == ["avx512_bf16", "amx_bf16"]
    assert precision.native_bf16_flags(["sse", "avx512f"]) == []
    speedup = precision.probe_bf16_speedup()
    assert speedup is None or speedup > 0


def test_only_the_local_member_by_member_executor_rolls_out_in_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx512_bf16"])
    monkeypatch.setattr(precision, "probe_bf16_speedup", lambda: 2.0)
    assert rollout_precision(ESConfig(generation_options=FAST)).dtype == "bfloat16"
    on_ray = rollout_precision(ESConfig(generation_options=FAST, executor="ray"))
    assert on_ray.dtype == "float32"
    # the reason recorded in the run directory reads as a sentence (it read "executor 'ray' roll out ...")
    assert on_ray.reason == "executor 'ray': members roll out in the model's dtype"
    lowrank = rollout_precision(ESConfig(generation_options=FAST, noise="lowrank"))
    assert lowrank.dtype == "float32"
    assert lowrank.reason == "low-rank populations: members roll out in the model's dtype"
    with pytest.raises(ValueError, match="local executor"):
        rollout_precision(ESConfig(generation_options=FAST, executor="ray", rollout_dtype="bfloat16"))
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx2"])
    assert rollout_precision(ESConfig(generation_options=FAST)).dtype == "float32"


# ---- rollout weights ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("noise", ["per-tensor", "table"])
def test_bf16_rollout_weights_are_the_rounded_fp32_perturbation_for_every_tensor(noise):
    model = tiny_llama()
    centre = state(model)
    weights = MasterWeights(model, noise=noise, share_storage=True)
    # the masters are the model's fp32 parameters (no second copy) and that model is never perturbed
    assert all(weights.master[n].data_ptr() == p.data_ptr() for n, p in weights.params.items())
    with pytest.raises(RuntimeError, match="bound copy"):
        weights.perturb(1, 1, 0.05)
    replica = rollout_replica(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in replica.parameters())
    assert replica.lm_head.weight is replica.model.embed_tokens.weight  # tied weights stay tied
    bound = weights.bind(replica, cast=True)
    for seed, sign, sigma in ((7, 1, 0.05), (8, -1, 0.003)):
        bound.perturb(seed, sign, sigma, replace=True)
        params = dict(replica.named_parameters())
        for name, master in weights.master.items():  # perturb in fp32, round once
            eps = weights.noise(seed, name)
            expected = torch.add(master, eps, alpha=sign * sigma).to(torch.bfloat16)
            assert torch.equal(params[name], expected), name
    bound.restore()
    assert all(torch.equal(p, weights.master[n].to(torch.bfloat16)) for n, p in replica.named_parameters())
    assert bit_equal(state(model), centre)
    # updates stay fp32 on the masters; the copy follows at its next restore / perturb
    weights.apply(Update(seeds=(3, 4), coefficients=(1.0, -0.5), scale=0.01))
    assert not bit_equal(state(model), centre) and model.lm_head.weight.dtype == torch.float32
    bound.restore()
    assert all(torch.equal(p, weights.master[n].to(torch.bfloat16)) for n, p in replica.named_parameters())
    with pytest.raises(ValueError, match="dtypes"):
        weights.bind(rollout_replica(model, torch.bfloat16))  # another dtype only when asked for


@pytest.mark.parametrize("threads", [1, 2])
def test_blockwise_rounding_is_the_whole_tensor_sum_rounded(threads):
    """`add_rounded` (bf16 perturbations of tensors larger than a block) equals torch.add(...).to(bf16) bit for
    bit: across block boundaries, on a ragged last block, for either thread count."""
    from esft.es.param_writes import ROUNDING_BLOCK, add_rounded

    g = torch.Generator().manual_seed(0)
    n = 3 * ROUNDING_BLOCK + 1237
    master, eps = torch.randn(n, generator=g), torch.randn(n, generator=g)
    out = torch.empty(n, dtype=torch.bfloat16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for step in (0.05, -0.003, 1e-30):
            add_rounded(master, eps, step, out)
            assert torch.equal(out, torch.add(master, eps, alpha=step).to(torch.bfloat16)), step
        small = torch.empty(10, dtype=torch.bfloat16)
        add_rounded(master[:10], eps[:10], 0.5, small)
        assert torch.equal(small, torch.add(master[:10], eps[:10], alpha=0.5).to(torch.bfloat16))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("lanes", [1, 2])
def test_bf16_executor_rolls_out_on_rounded_copies_and_leaves_the_model_at_the_masters(lanes):
    torch.set_num_threads(2)
    model = tiny_llama()
    centre = state(model)
    weights = MasterWeights(model, noise="table", share_storage=True, exclude=["norm"])
    task = ToyTask()
    members = [(11, 1), (12, -1), (13, 1), (14, 1), (15, -1)]
    batch = task.load("train", 8)
    ex = LocalExecutor(model, None, weights, task, 0.05, None, generate_fn=stub_generate, parallel_members=lanes,
                       rollout_dtype=torch.bfloat16)
    result = ex.evaluate_members(members, batch)
    centre_result = ex.evaluate_center(batch)
    ex.close()
    assert bit_equal(state(model), centre)
    # each member equals a stub generation on a bf16 model holding round(master + sign * sigma * eps)
    for row, (seed, sign) in enumerate(members + [(None, 1)]):
        reference = tiny_llama().to(torch.bfloat16)
        with torch.no_grad():
            for name, p in reference.named_parameters():
                if name in weights.master:
                    eps = weights.noise(seed, name) if seed is not None else 0
                    master = weights.master[name]
                    p.copy_(torch.add(master, eps, alpha=sign * 0.05) if seed is not None else master)
        texts = [g.text for g in stub_generate(reference, None, [ex_["ids"] for ex_ in batch], None)]
        got = result.texts[row] if seed is not None else centre_result.texts[0]
        assert got == texts, row


# ---- training: recorded, exact resume, old run directories ----------------------------------------------------

def _cfg(tmp_path, name, **kw) -> ESConfig:
    base = dict(model="tiny", task="toy", population_size=6, sigma=0.05, alpha=0.02, batch_size=8, iterations=4,
                max_new_tokens=2, seed=5, output_dir=str(tmp_path / name), eval_every=2, eval_limit=6,
                checkpoint_every=2, noise="table")
    base.update(kw)
    return ESConfig(**base)


def _run(config):
    from esft.api import train_es

    return train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                    progress=False)


def test_bf16_run_is_recorded_and_resumes_exactly(tmp_path):
    full = _run(_cfg(tmp_path, "full", rollout_dtype="bfloat16"))
    saved, info = read_run_config(full.output_dir)
    assert saved.rollout_dtype == "bfloat16" and info["rollout_dtype"] == "bfloat16"
    assert info["rollout_dtype_reason"] == "requested" and info["master_dtype"] == "float32"
    # checkpoints hold the fp32 masters (the model itself), not bf16 weights
    tensors = es_rundir.read_checkpoint_tensors(full.final_checkpoint)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    half = _run(_cfg(tmp_path, "cut", rollout_dtype="bfloat16", iterations=2))
    assert half.steps == 2
    resumed = _run(resume_config(half.output_dir, {"iterations": 4}))
    assert es_rundir.read_jsonl(resumed.output_dir / "seeds.jsonl") == \
        es_rundir.read_jsonl(full.output_dir / "seeds.jsonl")
    assert bit_equal(es_rundir.read_checkpoint_tensors(resumed.final_checkpoint), tensors)


def test_a_run_directory_from_before_the_option_resumes_in_fp32(tmp_path, monkeypatch):
    # this "machine" would pick bf16 for a new run with the fast options
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["amx_bf16"])
    monkeypatch.setattr(precision, "probe_bf16_speedup", lambda: 3.0)
    reference = _run(_cfg(tmp_path, "full", rollout_dtype="float32", generation_options=FAST))
    old = _run(_cfg(tmp_path, "old", rollout_dtype="float32", generation_options=FAST, iterations=2))
    path = old.output_dir / "config.yaml"
    data = yaml.safe_load(path.read_text())
    del data["rollout_dtype"]
    for key in [k for k in data["_run"] if k.startswith(("rollout_dtype", "cpu_native", "bf16_probe"))]:
        del data["_run"][key]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert read_run_config(old.output_dir)[0].rollout_dtype == "float32"
    # resume_config (the CLI's --resume) and a fresh config with resume=True ("auto") both continue in fp32
    # an explicit --rollout-dtype auto (the default, re-typed with the original command) is not a change
    assert resume_config(old.output_dir, {"iterations": 4, "rollout_dtype": "auto"}).rollout_dtype == "float32"
    with pytest.raises(ValueError, match="cannot change"):
        resume_config(old.output_dir, {"rollout_dtype": "bfloat16"})
    resumed = _run(resume_config(old.output_dir, {"iterations": 4}))
    assert read_run_config(resumed.output_dir)[0].rollout_dtype == "float32"
    assert es_rundir.read_jsonl(resumed.output_dir / "seeds.jsonl") == \
        es_rundir.read_jsonl(reference.output_dir / "seeds.jsonl")
    fresh = _cfg(tmp_path, "old", generation_options=FAST, iterations=5, resume=True)
    assert fresh.rollout_dtype == "auto"
    from esft.es.trainer import ESTrainer

    trainer = ESTrainer(fresh, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                        progress=False)
    assert trainer.precision.dtype == "float32" and trainer.config.rollout_dtype == "float32"
    # while a new run on the same machine picks bf16
    new = ESTrainer(_cfg(tmp_path, "new", generation_options=FAST), model=tiny_llama(), tokenizer=None,
                    task=ToyTask(), generate_fn=stub_generate, progress=False)
    assert new.precision.dtype == "bfloat16" and new.executor.rollout_dtype == torch.bfloat16


# ---- the lean engine's bf16 path ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_lean_bf16_path_follows_the_fp32_path_on_rounded_weights(tokenizer, kind, monkeypatch):
    from esft.generation import GenerationConfig, generate, lean, lean_step
    from test_lean import PROMPTS, _tiny

    if lean.packed_linear_reason(torch.bfloat16) or lean.fused_attention_reason(torch.bfloat16):
        pytest.skip("no oneDNN bf16 packed linear or no compiled kernel here")
    model = _tiny(kind)
    rounded = copy.deepcopy(model)
    low = rollout_replica(model, torch.bfloat16)
    with torch.no_grad():
        for (_, p), (_, r), (_, q) in zip(model.named_parameters(), rounded.named_parameters(),
                                          low.named_parameters()):
            q.copy_(p)
            r.copy_(p.to(torch.bfloat16))
    calls = []
    real = lean_step.packed_linear_bf16
    monkeypatch.setattr(lean_step, "packed_linear_bf16", lambda *a: calls.append(1) or real(*a))
    cfg = dict(max_new_tokens=30, batch_size=5)
    ref = generate(rounded, tokenizer, PROMPTS, GenerationConfig(**cfg))
    ours = generate(low, tokenizer, PROMPTS, GenerationConfig(**FAST, **cfg))
    assert calls  # the bf16 packed matmuls ran
    # activations are rounded to bf16 only at the matmul inputs: greedy completions agree on these prompts
    agree = np.mean([a.completion_ids == b.completion_ids for a, b in zip(ours, ref)])
    assert agree >= 0.8, agree


def test_bf16_lean_model_holds_its_vocabulary_matrix_once():
    """With bf16 weights the greedy screen reads the lean model's own packed bf16 lm_head (no second copy of
    the largest matrix per lane), and greedy picks stay those of the unscreened bf16 head."""
    from esft.generation import lean_step, packed
    from test_lean import _tiny

    if packed.screen_lm_head_reason(_tiny("llama"), True, True) or lean_step.fused_attention_reason(torch.bfloat16):
        pytest.skip("no native bf16 dot product or no compiled kernel here")
    model = _tiny("llama")
    low = rollout_replica(model, torch.bfloat16)  # new, unwritten bf16 parameters: write the model's, rounded
    MasterWeights(model, noise="table", share_storage=True).bind(low, cast=True).restore()
    lm = lean_step.LeanModel(low, packed=True, fused_attention=True, screen_lm_head=True, batch_hint=4)
    assert lm.screen.packed_bf16 is lm.lm_head
    fp32 = lean_step.LeanModel(_tiny("llama"), packed=True, fused_attention=True, screen_lm_head=True, batch_hint=4)
    assert fp32.screen.packed_bf16 is not fp32.lm_head  # fp32 weights: the screen needs its own bf16 copy
    h = torch.randn(4, low.config.hidden_size, generator=torch.Generator().manual_seed(0))
    screened = lm.screen.logits(h, lm.fused, torch.tensor([], dtype=torch.long))
    exact = torch.nn.functional.linear(h, low.lm_head.weight.float())  # fp32 h times the bf16 rows
    assert torch.equal(screened.greedy(), exact.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_screen_row_norms_are_the_fp32_norms_of_the_rows_block_by_block(dtype, monkeypatch):
    """The screen's row norms (its error bound's ||w_v||) equal the fp32 norm of each row, whatever the block size
    and for a row count that is not a multiple of it."""
    from esft.generation import packed
    from esft.generation.vocab import VocabRows

    w = (torch.randn(1003, 40, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    expected = torch.linalg.vector_norm(w.to(torch.float32), dim=1)
    for block in (7, 256, 4096):
        monkeypatch.setattr(packed, "ROW_NORM_BLOCK", block)
        got = packed.row_norms(w)
        assert got.dtype == torch.float32 and got.shape == (1003,)
        assert torch.equal(got, expected), block
    # the screen takes its bound's norms from row_norms (ATen's own bf16 -> fp32 norm is ~9x slower)
    calls = []
    monkeypatch.setattr(packed, "row_norms", lambda weight: calls.append(weight) or expected)
    screen = packed.LMHeadScreen(VocabRows(w), 4, packed_bf16=torch.empty(0))
    assert len(calls) == 1 and torch.equal(calls[0], w) and torch.equal(screen.row_norms, expected)


# ---- the rank correlation the precision study reports --------------------------------------------------------

def test_rank_correlation_is_spearmans_rho_with_average_ranks_for_ties():
    from scipy.stats import spearmanr

    from esft.es.strategy import rank_correlation

    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 5, size=8).astype(float)  # fitness of 8 members on 16 prompts: many ties
        b = a + rng.integers(-1, 2, size=8)
        if len(set(a)) > 1 and len(set(b)) > 1:
            assert rank_correlation(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))


@pytest.mark.parametrize("flags, warned", [(["avx2", "fma"], True), (["avx512f", "avx512_bf16"], False)])
def test_a_bf16_run_on_a_cpu_that_emulates_bf16_is_warned_before_it_rolls_out(tmp_path, monkeypatch, flags, warned):
    import warnings

    from esft.es.trainer import ESTrainer
    from esft.generation import packed

    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    monkeypatch.setattr(packed, "onednn_bf16", lambda: True)  # the flags decide, whatever this CPU's oneDNN has
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = ESTrainer(_cfg(tmp_path, "run", rollout_dtype="bfloat16", generation_options=FAST, device="cpu"),
                            model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                            progress=False)
    assert trainer.precision.dtype == "bfloat16"  # honoured as asked, either way
    said = [str(w.message) for w in caught if "emulates bf16" in str(w.message)]
    assert len(said) == warned and all("--rollout-dtype auto or float32" in m for m in said)
    # and the run's record keeps it, for whoever reads the run directory later
    assert trainer.run_info()["rollout_dtype_warning"] == (said[0] if warned else None)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_lean_bf16_path_samples_and_survives_a_diverged_member(tokenizer, temperature):
    """Two paths of bf16 rollouts used to end the run: sampling (no lm_head screen: the full logits came from fp32
    hidden states against the bf16 lm_head, a pair oneDNN refuses) and a greedy member whose weights went NaN (the
    screen finds no finite candidate and falls back to those same full logits). Both now round the hidden states
    to bf16 for that matmul, as the prompts' logits do."""
    from esft.generation import GenerationConfig, generate, lean
    from test_lean import PROMPTS, _tiny

    if lean.packed_linear_reason(torch.bfloat16) or lean.fused_attention_reason(torch.bfloat16):
        pytest.skip("no oneDNN bf16 packed linear or no compiled kernel here")
    plain = dict(max_new_tokens=6, batch_size=3, temperature=temperature, seed=1)
    cfg = GenerationConfig(**plain, **FAST)
    model = _tiny("llama")
    rounded = copy.deepcopy(model)
    low = rollout_replica(model, torch.bfloat16)
    with torch.no_grad():
        for p, r, q in zip(model.parameters(), rounded.parameters(), low.parameters()):
            q.copy_(p)
            r.copy_(p.to(torch.bfloat16))
    ours = generate(low, tokenizer, PROMPTS[:3], cfg)
    ref = generate(rounded, tokenizer, PROMPTS[:3], GenerationConfig(**plain))
    assert np.mean([a.completion_ids == b.completion_ids for a, b in zip(ours, ref)]) >= 2 / 3
    with torch.no_grad():
        low.model.layers[-1].mlp.down_proj.weight[0, :5] = float("nan")
    diverged = generate(low, tokenizer, PROMPTS[:3], cfg)
    assert [len(g.completion_ids) for g in diverged] == [6, 6, 6]
