"""The study's weight-space quantities recomputed independently (plain numpy) on tiny random safetensors
checkpoints written here, against esft.analysis: Table 3 (||dtheta||_2 from the base), Table 4 (sparsity
|d| <= 1e-5 over every entry, stable rank ||dW||_F^2 / ||dW||_2^2 averaged over attention q/k/v/o and MLP
gate/up/down), Table 20 (cosine of the two updates), Figures 6/9-11 (random-walk law, through-origin fit, rho,
centred R^2) and Figures 3-4 (points on the interpolation path and along unit directions).

Run: `pytest -q tests/test_analysis_paper_definitions.py` (a few seconds; no model, no network).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.analysis import drift as D
from esft.analysis import weights as W

H, KV, I, V, LAYERS = 16, 8, 24, 40, 2
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": I,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": LAYERS, "vocab_size": V,
          "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
MATRIX_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shapes() -> dict[str, tuple[int, ...]]:
    out = {"model.embed_tokens.weight": (V, H)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": (H, H), p + "self_attn.k_proj.weight": (KV, H),
                p + "self_attn.v_proj.weight": (KV, H), p + "self_attn.o_proj.weight": (H, H),
                p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,)}
    return out | {"model.norm.weight": (H,)}


def bf16(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def write(folder, tensors: dict[str, np.ndarray], dtype=torch.float32, masters: dict | None = None) -> None:
    """A Hugging Face-style folder; the tied lm_head is stored as well (as some exporters do), so the analysis
    must drop it by the config rather than by its absence."""
    folder.mkdir(parents=True)
    stored = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in tensors.items()}
    stored["lm_head.weight"] = stored["model.embed_tokens.weight"].clone()
    save_file(stored, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    if masters is not None:
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in masters.items()},
                  str(folder / "masters.safetensors"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """bf16 base; ES: dense ~1e-3 update, saved as bf16 weights plus fp32 masters (the exact weights); GRPO: fp32,
    most entries unchanged, a few below and at the threshold's scale."""
    root = tmp_path_factory.mktemp("ckpt")
    rng = np.random.default_rng(7)
    base = {k: bf16(rng.standard_normal(s).astype(np.float32) * (1.0 if len(s) == 1 else 0.05))
            for k, s in shapes().items()}
    es, grpo = {}, {}
    for k, b in base.items():
        d = rng.standard_normal(b.shape) * 1e-3
        d[rng.random(b.shape) < 0.02] = 0.0
        es[k] = (b + d).astype(np.float32)
        g = rng.standard_normal(b.shape) * 1e-4
        g[rng.random(b.shape) < 0.85] = 0.0
        small = rng.random(b.shape) < 0.05
        g[small] = rng.uniform(-2e-5, 2e-5, int(small.sum()))
        grpo[k] = (b + g).astype(np.float32)
    write(root / "base", base, torch.bfloat16)
    write(root / "es", es, torch.bfloat16, masters=es)
    write(root / "grpo", grpo)
    return root, base, es, grpo


def reference(base, tuned, eps=1e-5):
    """Table 3/4 quantities of one update, from the definitions (each tensor once, float64)."""
    deltas = {k: tuned[k].astype(np.float64) - base[k].astype(np.float64) for k in base}
    flat = np.concatenate([d.ravel() for d in deltas.values()])
    ranks = []
    for k, d in deltas.items():
        if d.ndim == 2 and any(f".{r}." in k for r in MATRIX_ROLES):
            s = np.linalg.svd(d, compute_uv=False)
            ranks.append(float((d ** 2).sum() / s[0] ** 2))
    return {"flat": flat, "norm": float(np.sqrt(flat @ flat)), "sparsity": float(np.mean(np.abs(flat) <= eps)),
            "stable_rank_mean": float(np.mean(ranks)), "ranks": len(ranks), "deltas": deltas}


def test_tables_3_4_20_from_checkpoints_match_the_definitions(checkpoints):
    root, base, es, grpo = checkpoints
    rep = W.compare_updates(root / "base", {"es": root / "es", "grpo": root / "grpo"}, chunk_elems=100)
    ref_es, ref_grpo = reference(base, es), reference(base, grpo)
    d = sum(int(np.prod(s)) for s in shapes().values())
    tot = rep["total"]
    assert tot["numel"] == d == ref_es["flat"].size  # tied lm_head counted once
    assert "lm_head" not in {r["name"] for r in rep["tensors"]}
    assert rep["unmatched"] == {}
    for lab, ref in (("es", ref_es), ("grpo", ref_grpo)):
        assert tot[lab]["norm"] == pytest.approx(ref["norm"], rel=1e-12)
        assert tot[lab]["sparsity"] == pytest.approx(ref["sparsity"], abs=1e-15)
        assert tot[lab]["stable_rank_n"] == ref["ranks"] == 7 * LAYERS
        assert tot[lab]["stable_rank_mean"] == pytest.approx(ref["stable_rank_mean"], rel=1e-9)
    # the fixture means what it says: ES nearly dense, GRPO mostly unchanged
    assert ref_es["sparsity"] < 0.05 < 0.8 < ref_grpo["sparsity"]
    cos = ref_es["flat"] @ ref_grpo["flat"] / (ref_es["norm"] * ref_grpo["norm"])
    assert tot["cos:es|grpo"] == pytest.approx(cos, rel=1e-9)
    assert tot["norm_ratio:es|grpo"] == pytest.approx(ref_es["norm"] / ref_grpo["norm"], rel=1e-12)
    # per tensor and per family
    q = np.concatenate([ref_es["deltas"][f"model.layers.{i}.self_attn.q_proj.weight"].ravel() for i in range(LAYERS)])
    assert rep["families"]["q_proj"]["es"]["norm"] == pytest.approx(np.linalg.norm(q), rel=1e-12)
    row = next(r for r in rep["tensors"] if r["name"] == "layers.1.down_proj")
    dd = ref_grpo["deltas"]["model.layers.1.mlp.down_proj.weight"]
    assert row["grpo"]["small"] == int((np.abs(dd) <= 1e-5).sum())
    # the pure metrics on in-memory deltas agree with the streamed ones
    td = {k: torch.from_numpy(v) for k, v in ref_es["deltas"].items()}
    assert W.sparsity(td) == pytest.approx(ref_es["sparsity"], abs=1e-15)
    tg = {k: torch.from_numpy(v) for k, v in ref_grpo["deltas"].items()}
    assert W.cosine_similarity(td, tg)["total"] == pytest.approx(cos, rel=1e-9)
    assert W.update_norm(root / "base", root / "es")["total"] == pytest.approx(ref_es["norm"], rel=1e-12)


def test_the_es_update_is_read_from_its_fp32_masters_not_its_bf16_weights(checkpoints):
    root, base, es, _ = checkpoints
    rounded = {k: bf16(v) for k, v in es.items()}
    want = reference(base, es)
    got = W.compare_updates(root / "base", {"es": root / "es"})["total"]["es"]
    assert got["norm"] == pytest.approx(want["norm"], rel=1e-12)
    assert got["sparsity"] == pytest.approx(want["sparsity"], abs=1e-15)
    # the rounded file would have given other numbers (the caveat docs/analysis.md states)
    assert reference(base, rounded)["sparsity"] > want["sparsity"] + 0.05


def es_walk(alpha, population, steps, sizes, seed=0):
    """theta += (alpha / N) sum_n z_n eps_n with z = (f - mean) / (std + 1e-8), population std; and an RMSNorm
    -like gain whose drift saturates. Records as esft.es.replay.drift writes them."""
    rng = np.random.default_rng(seed)
    theta = {k: np.zeros(n) for k, n in sizes.items()}
    out = []
    for t in range(1, steps + 1):
        f = rng.random(population)
        z = (f - f.mean()) / (f.std() + 1e-8)
        for k, n in sizes.items():
            theta[k] += (alpha / population) * (z @ rng.standard_normal((population, n)))
        per = {k: float(v @ v) for k, v in theta.items()}
        per["model.norm.weight"] = 0.02 * (1 - np.exp(-t / 5))
        out.append({"step": t, "total": sum(per.values()), "per_tensor": per,
                    "numel": {**sizes, "model.norm.weight": 64}, "num_params": sum(sizes.values()) + 64})
    return out


def through_origin(x, y):
    k = float(np.linalg.lstsq(x[:, None], y, rcond=None)[0][0])
    res = y - k * x
    return k, 1 - float(res @ res) / float(((y - y.mean()) ** 2).sum())


def test_random_walk_law_fit_rho_and_r2_match_the_definitions():
    alpha, n, steps = 0.005, 12, 60
    sizes = {"model.layers.0.self_attn.q_proj.weight": 3000, "model.layers.0.mlp.up_proj.weight": 5000}
    recs = es_walk(alpha, n, steps, sizes)
    res = D.analyze_series(D.series_from_records(recs), alpha, n)
    x = np.arange(1, steps + 1, dtype=np.float64)
    d = sum(sizes.values()) + 64
    y = np.array([r["total"] for r in recs])
    k, r2 = through_origin(x, y)
    theory = alpha ** 2 * x * d / n
    tot = res["total"]
    assert res["num_params"] == d
    assert tot["d_eff"] == pytest.approx(k * n / alpha ** 2, rel=1e-12)
    assert tot["rho"] == pytest.approx(k * n / alpha ** 2 / d, rel=1e-12)
    assert tot["r2_fit"] == pytest.approx(r2, rel=1e-12)
    assert tot["r2_theory"] == pytest.approx(1 - ((y - theory) ** 2).sum() / ((y - y.mean()) ** 2).sum(), rel=1e-12)
    assert tot["predicted_final_sq"] == pytest.approx(alpha ** 2 * steps * d / n, rel=1e-12)
    # the law itself: sum z^2 = N, so each step adds alpha^2 d / N in expectation (8000 entries: ~2% noise)
    assert tot["final_ratio"] == pytest.approx(1.0, abs=0.06)
    rows = {r["name"]: r for r in res["tensors"]}
    for name, size in sizes.items():
        yt = np.array([r["per_tensor"][name] for r in recs])
        kt, r2t = through_origin(x, yt)
        row = rows[D.canonical_drift_name(name)]
        assert row["rho"] == pytest.approx(kt * n / alpha ** 2 / size, rel=1e-12)
        assert row["r2_fit"] == pytest.approx(r2t, rel=1e-12)
        assert row["rho"] == pytest.approx(1.0, abs=0.08) and row["r2_fit"] > 0.95
    # a saturating gain: the through-origin R^2 is measured about the mean, so it is free to go negative
    yn = np.array([r["per_tensor"]["model.norm.weight"] for r in recs])
    assert rows["norm"]["r2_fit"] == pytest.approx(through_origin(x, yn)[1], rel=1e-12)
    assert rows["norm"]["r2_fit"] < 0
    fam = res["families"]["norm"]
    assert fam["rho"]["median"] == pytest.approx(rows["norm"]["rho"])


def test_interpolation_and_unit_direction_points_are_the_definitions(checkpoints, tmp_path):
    """Figure 3's (1 - t) theta_ES + t theta_GRPO and Figure 4's theta_0 + m u, u = delta / ||delta||, on a
    module whose lm_head is tied (so it is moved once, with the embedding)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from esft.analysis import landscape as L

    root, base, es, grpo = checkpoints
    cfg = {k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")}
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    d = L.DeltaDirection(root / "es", root / "grpo", "es->grpo").bind(model)
    L.set_weights(model, root / "es", [(0.3, d)])
    for name, p in model.named_parameters():
        want = 0.7 * es[name].astype(np.float64) + 0.3 * grpo[name].astype(np.float64)
        assert np.allclose(p.detach().double().numpy(), want, rtol=0, atol=1e-6), name
    ref_es = reference(base, es)
    u = L.DeltaDirection(root / "base", root / "es", "es").bind(model)
    assert u.norm == pytest.approx(ref_es["norm"], rel=1e-12)
    m = 0.5 * ref_es["norm"]
    L.set_weights(model, root / "base", [(m / u.norm, u)])
    moved = np.concatenate([p.detach().double().numpy().ravel() for _, p in model.named_parameters()])
    start = np.concatenate([base[n].astype(np.float64).ravel() for n, _ in model.named_parameters()])
    assert np.linalg.norm(moved - start) == pytest.approx(m, rel=1e-5)
    r = L.RandomDirection(u, seed=1).bind(model)
    assert r.norm == pytest.approx(ref_es["norm"], rel=1e-12)


def test_incremental_and_cumulative_kl_are_kl_of_the_stage_from_its_predecessor_and_from_the_base(tokenizer):
    """Tables 11-16: incremental = KL(pi_t || pi_{t-1}), cumulative = KL(pi_t || pi_0), on completions pi_t
    generated; recomputed here with unpadded full forward passes and the per-token definitions."""
    from conftest import make_tiny_model
    from esft.analysis import kl as K
    from esft.generation import GenerationConfig
    from esft.tasks import get_task

    models = {name: make_tiny_model(seed=s, hidden=32) for s, name in enumerate(("base", "s1", "s2"))}
    cfg = GenerationConfig(max_new_tokens=4, batch_size=2)
    opts = {"boolq": {"max_passage_chars": 80}}
    res = K.kl_stages("base", [("1:boolq", "s1"), ("2:boolq", "s2")], ["boolq"], limit=2, gen_config=cfg,
                      loader=lambda spec: (models[spec], tokenizer), task_options=opts)
    task = get_task("boolq", **opts["boolq"])
    prompts, comps = K.generate_completions(models["s2"], tokenizer, task.load("test", 2), task, cfg)

    def per_token(after, before):
        k3 = exact = 0.0
        for p, c in zip(prompts, comps):
            ids = torch.tensor([list(p) + list(c)])
            with torch.no_grad():
                la = torch.log_softmax(after(ids).logits[0].double(), -1).numpy()
                lb = torch.log_softmax(before(ids).logits[0].double(), -1).numpy()
            for j, tok in enumerate(c):
                pos = len(p) - 1 + j  # the logits that predict completion token j
                r = lb[pos, tok] - la[pos, tok]
                k3 += np.expm1(r) - r
                exact += float((np.exp(la[pos]) * (la[pos] - lb[pos])).sum())
        n = sum(len(c) for c in comps)
        return k3 / n, exact / n

    for kind, before in (("incremental", "s1"), ("cumulative", "base")):
        k3, exact = per_token(models["s2"], models[before])
        cell = res[kind]["boolq"]["2:boolq"]
        assert cell["k3_token_mean"] == pytest.approx(k3, rel=1e-4), kind
        assert cell["exact_token_mean"] == pytest.approx(exact, rel=1e-4), kind
