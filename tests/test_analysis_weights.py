"""Weight metrics against independent numpy/scipy computations; canonical names; streamed checkpoints.

Run: `pytest -q tests/test_analysis_weights.py` (a few seconds; no model download, no network).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace as _NS

import numpy as np
import pytest
import scipy.linalg
import torch

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model
from esft.analysis import canonical as C
from esft.analysis import weights as W
from esft.analysis import weights_report as WR
from esft.analysis.sources import CheckpointSource, aligned_refs, iter_chunks, read_full

#: the run of a stage that trained the study's 100 ES iterations (what the report reads of it)
RUN100 = _NS(config={"iterations": 100})


def rand(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


def test_sparsity_matches_numpy():
    d = rand(50, 40) * 1e-5
    want = float(np.mean(np.abs(d.numpy()) <= 1e-5))
    assert W.sparsity(d) == pytest.approx(want, abs=0)
    parts = {"a": d, "b": torch.zeros(10)}
    both = np.concatenate([d.numpy().ravel(), np.zeros(10)])
    assert W.sparsity(parts, eps=1e-5) == pytest.approx(float(np.mean(np.abs(both) <= 1e-5)))
    assert W.sparsity(d, eps=0.0) == 0.0
    # |d| <= eps, boundary included: untouched weights count at eps = 0, an entry equal to eps counts
    assert W.sparsity(torch.zeros(4), eps=0.0) == 1.0
    assert W.sparsity(torch.tensor([0.25, -0.25, 0.5, 0.0]), eps=0.25) == 0.75


@pytest.mark.parametrize("shape", [(30, 20), (7, 64), (1, 5)])
def test_stable_rank_matches_scipy(shape):
    m = rand(*shape, seed=1)
    a = m.numpy()
    want = np.linalg.norm(a, "fro") ** 2 / scipy.linalg.svdvals(a)[0] ** 2
    assert W.stable_rank(m) == pytest.approx(want, rel=1e-10)
    # rank one -> exactly 1; orthogonal -> full rank
    u, v = rand(9, 1), rand(1, 6, seed=2)
    assert W.stable_rank(u @ v) == pytest.approx(1.0, rel=1e-10)
    assert W.stable_rank(torch.eye(5, dtype=torch.float64)) == pytest.approx(5.0)
    assert np.isnan(W.stable_rank(torch.zeros(3, 3)))


def test_cosine_matches_numpy_total_and_per_tensor():
    a = {"x": rand(4, 5, seed=3), "y": rand(6, seed=4)}
    b = {"x": rand(4, 5, seed=5), "y": rand(6, seed=6)}
    va = np.concatenate([a["x"].numpy().ravel(), a["y"].numpy()])
    vb = np.concatenate([b["x"].numpy().ravel(), b["y"].numpy()])
    res = W.cosine_similarity(a, b)
    assert res["total"] == pytest.approx(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb), rel=1e-12)
    for k in a:
        x, y = a[k].numpy().ravel(), b[k].numpy().ravel()
        assert res["per_tensor"][k] == pytest.approx(1 - scipy.spatial.distance.cosine(x, y), rel=1e-10)
    assert W.cosine_similarity(a["x"], a["x"]) == pytest.approx(1.0)
    assert W.cosine_similarity(a["x"], -a["x"]) == pytest.approx(-1.0)


def perturbed(model, scale, seed, frac=1.0):
    g = torch.Generator().manual_seed(seed)
    out = make_tiny_model(vocab_size=512, hidden=32)
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in out.parameters():
            d = torch.randn(p.shape, generator=g) * scale
            d[torch.rand(p.shape, generator=g) > frac] = 0
            p.add_(d)
    return out


def test_compare_updates_matches_independent_numpy():
    base = make_tiny_model(vocab_size=512, hidden=32)
    es, grpo = perturbed(base, 1e-3, 1), perturbed(base, 1e-4, 2, frac=0.2)
    rep = W.compare_updates(base, {"es": es, "grpo": grpo})
    pb = dict(base.named_parameters())
    de = {n: (p.detach().double() - pb[n].detach().double()).numpy() for n, p in es.named_parameters()}
    dg = {n: (p.detach().double() - pb[n].detach().double()).numpy() for n, p in grpo.named_parameters()}
    ve = np.concatenate([v.ravel() for v in de.values()])
    vg = np.concatenate([v.ravel() for v in dg.values()])
    t = rep["total"]
    assert t["numel"] == ve.size  # tied lm_head counted once
    assert t["es"]["norm"] == pytest.approx(np.linalg.norm(ve), rel=1e-12)
    assert t["grpo"]["sparsity"] == pytest.approx(np.mean(np.abs(vg) <= 1e-5), abs=1e-12)
    assert t["cos:es|grpo"] == pytest.approx(ve @ vg / np.linalg.norm(ve) / np.linalg.norm(vg), rel=1e-9)
    assert t["norm_ratio:es|grpo"] == pytest.approx(np.linalg.norm(ve) / np.linalg.norm(vg), rel=1e-12)
    ranks = [np.linalg.norm(v) ** 2 / scipy.linalg.svdvals(v)[0] ** 2 for n, v in de.items()
             if v.ndim == 2 and any(k in n for k in ("q_proj", "k_proj", "v_proj", "o_proj", "gate", "up_", "down"))]
    assert len(ranks) == 14
    assert t["es"]["stable_rank_mean"] == pytest.approx(np.mean(ranks), rel=1e-9)
    fam = rep["families"]["q_proj"]
    q = np.concatenate([de[f"model.layers.{i}.self_attn.q_proj.weight"].ravel() for i in range(2)])
    assert fam["es"]["norm"] == pytest.approx(np.linalg.norm(q), rel=1e-12)
    assert set(rep["kinds"]) == {"attention", "mlp", "norm", "embedding"}
    un = W.update_norm(base, es)
    assert un["total"] == pytest.approx(np.linalg.norm(ve), rel=1e-12)
    assert un["per_tensor"]["layers.1.down_proj"] == pytest.approx(
        np.linalg.norm(de["model.layers.1.mlp.down_proj.weight"]), rel=1e-12)


def test_streaming_sharded_checkpoints_equal_in_memory(tmp_path):
    base = make_tiny_model(vocab_size=512, hidden=32)
    es, grpo = perturbed(base, 1e-3, 1), perturbed(base, 1e-4, 2, frac=0.3)
    # shards far smaller than the model (and than its embedding), and a chunk smaller than most tensors
    for name, m in (("base", base), ("es", es), ("grpo", grpo)):
        m.save_pretrained(tmp_path / name, max_shard_size="20KB")
    index = json.loads((tmp_path / "es" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    mem = W.compare_updates(base, {"es": es, "grpo": grpo})
    disk = W.compare_updates(tmp_path / "base", {"es": tmp_path / "es", "grpo": str(tmp_path / "grpo")},
                             chunk_elems=1000)
    assert sorted(r["name"] for r in mem["tensors"]) == sorted(r["name"] for r in disk["tensors"])
    for k in ("es", "grpo"):
        for q in ("norm", "sparsity", "stable_rank_mean", "max_abs"):
            assert disk["total"][k][q] == pytest.approx(mem["total"][k][q], rel=1e-12, abs=0)
    assert disk["total"]["cos:es|grpo"] == pytest.approx(mem["total"]["cos:es|grpo"], rel=1e-9)


def test_masters_file_is_preferred(tmp_path):
    from safetensors.torch import save_file

    base = make_tiny_model(vocab_size=512, hidden=32)
    tuned = perturbed(base, 1e-6, 3)
    tuned.to(torch.bfloat16).save_pretrained(tmp_path / "t")  # rounded: most 1e-6 changes vanish
    save_file({n: p.detach().float().contiguous() for n, p in perturbed(base, 1e-6, 3).named_parameters()},
              str(tmp_path / "t" / "masters.safetensors"))
    src = CheckpointSource(tmp_path / "t")
    assert src.uses_masters
    exact = W.update_norm(base, perturbed(base, 1e-6, 3))["total"]
    assert W.update_norm(base, src)["total"] == pytest.approx(exact, rel=1e-12)
    rounded = W.update_norm(base, CheckpointSource(tmp_path / "t", prefer_masters=False))["total"]
    assert rounded != pytest.approx(exact, rel=1e-2)


def test_canonical_names_of_common_layouts():
    cases = {
        "model.layers.3.self_attn.q_proj.weight": "layers.3.q_proj",
        "model.layers.3.self_attn.q_proj.bias": "layers.3.q_proj.bias",
        "model.layers.0.mlp.down_proj.weight": "layers.0.down_proj",
        "model.layers.0.self_attn.k_norm.weight": "layers.0.k_norm",
        "model.layers.0.post_attention_layernorm.weight": "layers.0.post_attention_layernorm",
        "transformer.h.2.ln_1.weight": "layers.2.input_layernorm",
        "transformer.h.2.mlp.c_fc.weight": "layers.2.up_proj",
        "transformer.h.2.mlp.c_proj.weight": "layers.2.down_proj",
        "transformer.h.2.attn.c_proj.weight": "layers.2.o_proj",
        "gpt_neox.layers.1.attention.dense.weight": "layers.1.o_proj",
        "gpt_neox.layers.1.mlp.dense_h_to_4h.weight": "layers.1.up_proj",
        "model.norm.weight": "norm", "transformer.ln_f.weight": "norm",
        "model.embed_tokens.weight": "embed_tokens", "transformer.wte.weight": "embed_tokens",
        "lm_head.weight": "lm_head", "model.layers.0.weird.thing": "layers.0.weird.thing",
    }
    for stored, canon in cases.items():
        layer, role, leaf = C.parse_name(stored)
        assert C.canonical_name(layer, role, leaf) == canon, stored
    assert C.kind_of("layers.0.q_proj") == "attention" and C.kind_of("layers.0.input_layernorm") == "norm"
    assert C.role_of("layers.11.gate_proj") == "gate_proj" and C.layer_of("layers.11.gate_proj") == 11


def fuse(state: dict, layout: str) -> dict:
    """A Llama state dict rewritten in a fused layout (Phi-3 qkv/gate_up, GPT-2 c_attn, NeoX interleaved)."""
    out = {}
    for k, v in state.items():
        if ".q_proj." in k:
            q, kk, vv = v, state[k.replace("q_proj", "k_proj")], state[k.replace("q_proj", "v_proj")]
            if layout == "phi3":
                out[k.replace("q_proj", "qkv_proj")] = torch.cat([q, kk, vv])
            elif layout == "gpt2":
                out[k.replace("self_attn.q_proj", "attn.c_attn")] = torch.cat([q, kk, vv]).T.contiguous()
            elif layout == "neox":
                hd = 8
                heads = q.shape[0] // hd
                rows = [torch.cat([q[h * hd:(h + 1) * hd], kk[h * hd:(h + 1) * hd], vv[h * hd:(h + 1) * hd]])
                        for h in range(heads)]
                out[k.replace("self_attn.q_proj", "attention.query_key_value")] = torch.cat(rows)
        elif ".k_proj." in k or ".v_proj." in k or ".up_proj." in k:
            continue
        elif ".gate_proj." in k and layout == "phi3":
            out[k.replace("gate_proj", "gate_up_proj")] = torch.cat([v, state[k.replace("gate_proj", "up_proj")]])
        elif ".gate_proj." in k:
            out[k] = v
            out[k.replace("gate_proj", "up_proj")] = state[k.replace("gate_proj", "up_proj")]
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("layout,config", [
    ("phi3", {"num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 32}),
    # the fused state dicts keep the Llama's own (untied) lm_head; GPT-2 ties by default, so the config says not
    ("gpt2", {"n_head": 4, "n_embd": 32, "model_type": "gpt2", "tie_word_embeddings": False}),
    ("neox", {"num_attention_heads": 4, "hidden_size": 32, "model_type": "gpt_neox"}),
])
def test_fused_layouts_split_onto_canonical_tensors(layout, config):
    from esft.analysis.sources import StateDictSource

    def mha():  # k/v as wide as q so every layout applies
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4))

    base = mha()
    tuned = mha()
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(torch.randn_like(p) * 1e-2)
    sb = {k: v.detach().clone() for k, v in base.state_dict().items()}
    st = {k: v.detach().clone() for k, v in tuned.state_dict().items()}
    split = W.compare_updates(sb, {"a": st})
    fused = W.compare_updates(StateDictSource(fuse(sb, layout), config), {"a": StateDictSource(fuse(st, layout), config)},
                              chunk_elems=50)
    per_split = {r["name"]: r for r in split["tensors"]}
    per_fused = {r["name"]: r for r in fused["tensors"]}
    for name in ("layers.0.q_proj", "layers.1.k_proj", "layers.1.v_proj"):
        assert per_fused[name]["a"]["sq"] == pytest.approx(per_split[name]["a"]["sq"], rel=1e-12)
        assert per_fused[name]["a"]["stable_rank"] == pytest.approx(per_split[name]["a"]["stable_rank"], rel=1e-9)
    if layout == "phi3":
        assert per_fused["layers.0.up_proj"]["a"]["sq"] == pytest.approx(per_split["layers.0.up_proj"]["a"]["sq"])
        assert per_fused["layers.0.gate_proj"]["a"]["sq"] == pytest.approx(per_split["layers.0.gate_proj"]["a"]["sq"])
    assert fused["total"]["a"]["norm"] == pytest.approx(split["total"]["a"]["norm"], rel=1e-12)


def test_aligned_reads_report_unmatched_and_chunks_cover_tensor():
    from esft.analysis.sources import StateDictSource

    a = StateDictSource({"model.layers.0.self_attn.q_proj.weight": rand(10, 4), "extra.weight": rand(3)})
    b = StateDictSource({"model.layers.0.self_attn.q_proj.weight": rand(10, 4, seed=1)})
    rows, unmatched = aligned_refs([a, b])
    assert [n for n, _ in rows] == ["layers.0.q_proj"]
    assert unmatched == {"<state dict>": ["extra"]}
    (name, refs), = rows
    chunks = list(iter_chunks([a, b], refs, chunk_elems=12))
    assert len(chunks) == 4  # 3 rows (12 entries) per chunk
    assert torch.equal(torch.cat([c[0] for c in chunks]), read_full(a, refs[0]))


def test_sparsity_compares_low_precision_deltas_at_the_exact_eps():
    # bf16 rounds 1e-5 up to 1.0014e-5: an entry equal to that is above eps and must not count as unchanged
    d = torch.tensor([1.0e-5, 2e-6, 1.01e-5, 0.0], dtype=torch.bfloat16)
    want = float(np.mean(np.abs(d.double().numpy()) <= 1e-5))
    assert want == 0.5
    assert W.sparsity(d) == want
    assert W.sparsity(d.half()) == float(np.mean(np.abs(d.half().double().numpy()) <= 1e-5))


def test_non_finite_updates_are_not_hidden():
    w = rand(4, 3)
    for bad in (float("nan"), float("inf")):
        m = w.clone()
        m[1, 2] = bad
        assert np.isnan(W.stable_rank(m))  # an SVD of it would not converge: undefined, like a zero matrix
    base = {"model.layers.0.self_attn.q_proj.weight": rand(4, 3), "model.norm.weight": rand(3, seed=1)}
    tuned = {k: v + 1e-3 for k, v in base.items()}
    tuned["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    rep = W.compare_updates(base, tuned, chunk_elems=3)
    q = next(r for r in rep["tensors"] if r["name"] == "layers.0.q_proj")
    assert np.isnan(q["tuned"]["max_abs"]) and q["tuned"]["stable_rank"] is None
    assert np.isnan(rep["total"]["tuned"]["max_abs"]) and np.isnan(rep["total"]["tuned"]["norm"])
    assert rep["families"]["norm"]["tuned"]["max_abs"] == pytest.approx(1e-3)


def test_cosine_refuses_tensors_of_different_shapes():
    with pytest.raises(ValueError, match="shapes differ"):
        W.cosine_similarity(rand(2, 3), rand(3, 2))
    with pytest.raises(ValueError, match="tensor x: shapes differ"):
        W.cosine_similarity({"x": rand(6)}, {"x": rand(3)})


def test_a_missing_stable_rank_or_cosine_prints_as_n_a_not_none():
    """`esft analyze weights` printed Python's None for a stable rank not computed and the cosine of a zero update."""
    from esft.analysis.commands import format_weights

    rep = {"labels": ["es", "grpo"], "eps": 1e-6, "pairs": ["es|grpo"], "total": {
        "es": {"norm": 0.0, "sparsity": 1.0, "stable_rank_mean": None},
        "grpo": {"norm": 2.5, "sparsity": 0.25, "stable_rank_mean": 5.876},
        "cos:es|grpo": None, "norm_ratio:es|grpo": 0.0}}
    text = format_weights(rep)
    assert "None" not in text
    assert "stable rank (mean attn+MLP) n/a" in text and "stable rank (mean attn+MLP) 5.88" in text
    assert "es|grpo: cosine n/a, norm ratio ||es|| / ||grpo|| 0" in text
    # the ratio names which norm is over which, and neither number prints 17 digits
    rep["total"]["cos:es|grpo"], rep["total"]["norm_ratio:es|grpo"] = 3.3296510312884975e-05, 3.320958582078558
    assert format_weights(rep).splitlines()[-1] == "es|grpo: cosine 3.33e-05, norm ratio ||es|| / ||grpo|| 3.321"


def test_tensors_left_out_of_the_totals_are_said_in_the_output(tmp_path):
    from types import SimpleNamespace

    from safetensors.torch import save_file

    from esft.analysis.commands import format_weights

    base = make_tiny_model(vocab_size=64, hidden=16)
    base.save_pretrained(tmp_path / "base")
    tuned = {n: p.detach() + 1e-3 for n, p in base.named_parameters() if "layers.1.mlp.up_proj" not in n}
    (tmp_path / "t").mkdir()
    save_file({n: t.contiguous() for n, t in tuned.items()}, str(tmp_path / "t" / "model.safetensors"))
    (tmp_path / "t" / "config.json").write_text((tmp_path / "base" / "config.json").read_text())
    rep = W.compare_updates(tmp_path / "base", {"es": tmp_path / "t"}, stable_ranks=False)
    assert rep["unmatched"] == {str(tmp_path / "base"): ["layers.1.up_proj"]}
    assert "not compared (missing from another checkpoint): 1 tensor(s)" in format_weights(rep)
    assert "layers.1.up_proj" in format_weights(rep)
    # the report says it too, beside the tables
    skipped = []
    chain = SimpleNamespace(label="es", base=tmp_path / "base", base_spec="base", algorithm="es", tasks=["countdown"],
                            shown_tasks=["countdown"],
                            stages=[SimpleNamespace(checkpoint=tmp_path / "t", run=RUN100)])
    ctx = SimpleNamespace(pairs=[], chains=[chain], skip=lambda a, why: skipped.append((a, why)), results={},
                          cache=SimpleNamespace(get=lambda name, params, fn, **kw: (fn(), False)), progress=False,
                          config=SimpleNamespace(eps=1e-5), fig=lambda name: tmp_path / f"{name}.png",
                          plot=lambda cached, path, fn: None)
    WR.report_weights(ctx)
    assert any("layers.1.up_proj" in why and "left out of every total" in why for _, why in skipped), skipped


def test_the_report_weights_figure_and_family_table_name_the_stage_they_show(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from safetensors.torch import save_file

    from esft.analysis.report_builder import Report

    base = make_tiny_model(vocab_size=64, hidden=16)
    base.save_pretrained(tmp_path / "base")
    for k, name in enumerate(("s1", "s2")):  # two stages; the second has moved further
        tuned = {n: p.detach() + (k + 1) * 1e-3 for n, p in base.named_parameters()}
        base.save_pretrained(tmp_path / name)
        save_file({n: t.contiguous() for n, t in tuned.items()}, str(tmp_path / name / "model.safetensors"))
    chain = SimpleNamespace(label="es", base=tmp_path / "base", base_spec="base", algorithm="es",
                            tasks=["countdown", "boolq"], shown_tasks=["countdown", "boolq"],
                            stages=[SimpleNamespace(checkpoint=tmp_path / s, run=SimpleNamespace(config={"iterations": it}))
                                    for s, it in (("s1", 100), ("s2", 300))])
    titles = []
    monkeypatch.setattr(WR, "plot_weights", lambda rep, path, title=None: titles.append(title) or path)
    ctx = SimpleNamespace(pairs=[], chains=[chain], skip=lambda *a: None, results={},
                          cache=SimpleNamespace(get=lambda name, params, fn, **kw: (fn(), False)), progress=False,
                          config=SimpleNamespace(eps=1e-5), fig=lambda name: tmp_path / f"{name}.png",
                          plot=lambda cached, path, fn: fn())
    (comp,) = WR.report_weights(ctx)
    assert comp.last_stage == "2 (boolq)"
    # beside the study's 100-iteration ES values, a stage of another budget is named
    assert comp.budget == "The study's ES values are of 100 iterations per stage; these ES stages ran 300."
    assert titles == ["es, stage 2 (boolq): update from the base model"]
    lines = "\n".join(Report._weights_tables(SimpleNamespace(rel=str, shown=str), comp))
    assert "Per family, at stage 2 (boolq):" in lines and "stable ranks, stage 2 (boolq)]" in lines


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_config_without_tie_word_embeddings_ties_as_transformers_loads_it(tmp_path, arch):
    """config.json without `tie_word_embeddings`: transformers ties by its config class's default for the
    model_type (GPT-2 True, Llama False); the update's entry count follows it, on a checkpoint that stores
    both lm_head and the embedding (as exporters other than save_pretrained do)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from esft.models import parameter_count, ties_word_embeddings
    from esft.analysis.sources import refs_of

    torch.manual_seed(0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                           bos_token_id=1, eos_token_id=2))
        embed = "transformer.wte.weight"
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, tie_word_embeddings=False))
        embed = "model.embed_tokens.weight"
    folder = tmp_path / arch
    model.save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))

    loaded = AutoModelForCausalLM.from_pretrained(folder)
    tied = loaded.lm_head.weight is loaded.get_input_embeddings().weight
    assert tied == (arch == "gpt2") == ties_word_embeddings(config)
    assert ("lm_head" in refs_of(CheckpointSource(folder))) == (not tied)
    assert embed in tensors
    rep = W.compare_updates(folder, {"tuned": folder}, stable_ranks=False)
    assert rep["total"]["numel"] == parameter_count(loaded)


def test_tie_word_embeddings_follows_the_config_then_its_model_types_default():
    from transformers import GPT2Config, LlamaConfig

    from esft.models import ties_word_embeddings

    assert ties_word_embeddings({"model_type": "gpt2"}) is GPT2Config().tie_word_embeddings is True
    assert ties_word_embeddings({"model_type": "llama"}) is LlamaConfig().tie_word_embeddings is False
    assert ties_word_embeddings({"model_type": "gpt2", "tie_word_embeddings": False}) is False
    assert ties_word_embeddings({"model_type": "x", "text_config": {"model_type": "gpt2"}}) is True
    assert ties_word_embeddings({"model_type": "not-a-model-type"}) is False
    assert ties_word_embeddings(None) is False


def _falcon_attention_inputs(attention, config, fused_row_values):
    """The q, k and v that FalconAttention's forward pass hands to scaled-dot-product attention when its fused
    projection outputs `fused_row_values`: read from the public forward, not a private helper, so the check holds
    across transformers releases (5.25 dropped `_split_heads` and split inline). Rotary is made the identity
    (cos 1, sin 0) so q and k arrive as split."""
    import inspect

    from torch.overrides import TorchFunctionMode

    seen = []

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.scaled_dot_product_attention:
                seen.append(tuple(a.detach().clone() for a in args[:3]))
            return func(*args, **(kwargs or {}))

    rows, hidden = attention.query_key_value.weight.shape
    with torch.no_grad():
        attention.query_key_value.weight.zero_()
        attention.query_key_value.weight[:, 0] = fused_row_values
    x = torch.zeros(1, 1, hidden)
    x[0, 0, 0] = 1.0
    head_dim = config.hidden_size // config.num_attention_heads
    kwargs = {"attention_mask": None, "position_embeddings": (torch.ones(1, 1, head_dim), torch.zeros(1, 1, head_dim))}
    if "alibi" in inspect.signature(attention.forward).parameters:  # transformers <= 5.24 takes it positionally
        kwargs["alibi"] = None
    with Capture(), torch.no_grad():
        attention(x, **kwargs)
    assert len(seen) == 1, "FalconAttention no longer reaches scaled_dot_product_attention once: update this test"
    return seen[0]


@pytest.mark.parametrize("variant", [{"new_decoder_architecture": True, "num_kv_heads": 2},
                                     {"new_decoder_architecture": False, "multi_query": True},
                                     {"new_decoder_architecture": False, "multi_query": False}])
def test_falcon_query_key_value_rows_are_those_its_attention_reads(variant):
    """The rows of each q/k/v view are the rows FalconAttention's forward pass uses as q, k and v, in all three of
    Falcon's layouts (the new decoder architecture was split as contiguous q|k|v blocks, mixing the roles)."""
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconAttention

    from esft.analysis.canonical import split_refs

    config = FalconConfig(vocab_size=64, hidden_size=32, num_attention_heads=4, num_hidden_layers=1, **variant)
    config._attn_implementation = "sdpa"
    attention = FalconAttention(config, layer_idx=0).eval()
    rows = attention.query_key_value.weight.shape[0]
    q, k, v = _falcon_attention_inputs(attention, config, torch.arange(rows, dtype=torch.float32))
    # [batch, heads, seq, head_dim]; k/v may come repeated for every query head of their group: each row once
    expected = [q.flatten().tolist()] + [list(dict.fromkeys(t.flatten().tolist())) for t in (k, v)]
    assert sorted(expected[0] + expected[1] + expected[2]) == [float(r) for r in range(rows)]
    refs = split_refs("transformer.h.0.self_attention.query_key_value.weight", (rows, 32), config.to_dict())
    assert [ref.canonical for ref in refs] == ["layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj"]
    for ref, want in zip(refs, expected):
        got = [float(r) for a, b in ref.segments for r in range(a, b)]
        assert got == want and ref.shape[0] == len(want)


def test_masters_whose_names_match_no_model_weight_are_refused(tmp_path):
    """A model file that stores other names than the module's parameters (masters.safetensors uses the latter)
    would leave those tensors measured from their bf16 copies without a word: refused, naming the tensor."""
    from safetensors.torch import save_file

    base = make_tiny_model(vocab_size=512, hidden=32)
    base.to(torch.bfloat16).save_pretrained(tmp_path / "t")
    masters = {("renamed." + n): p.detach().float().contiguous() for n, p in base.named_parameters()}
    save_file(masters, str(tmp_path / "t" / "masters.safetensors"))
    with pytest.raises(ValueError, match=r"renamed.model.embed_tokens.weight.*a copy of the folder without masters.safetensors"):
        CheckpointSource(tmp_path / "t")
    assert not CheckpointSource(tmp_path / "t", prefer_masters=False).uses_masters


@pytest.mark.parametrize("stored, canon, kind", [
    # OPT: the MLP's matrices sit directly in the layer (no `mlp.` module)
    ("model.decoder.layers.0.fc1.weight", "layers.0.up_proj", "mlp"),
    ("model.decoder.layers.0.fc2.weight", "layers.0.down_proj", "mlp"),
    ("model.decoder.layers.0.fc1.bias", "layers.0.up_proj.bias", "mlp"),
    ("model.decoder.layers.0.self_attn.q_proj.weight", "layers.0.q_proj", "attention"),
    ("model.decoder.layers.0.self_attn.out_proj.weight", "layers.0.o_proj", "attention"),
    ("model.decoder.layers.0.self_attn_layer_norm.weight", "layers.0.input_layernorm", "norm"),
    ("model.decoder.layers.0.final_layer_norm.weight", "layers.0.post_attention_layernorm", "norm"),
    ("model.decoder.final_layer_norm.weight", "norm", "norm"),
    ("model.decoder.embed_positions.weight", "position_embeddings", "embedding"),
    # GPT-2, GPT-NeoX, Llama
    ("transformer.h.1.mlp.c_fc.weight", "layers.1.up_proj", "mlp"),
    ("transformer.h.1.mlp.c_proj.weight", "layers.1.down_proj", "mlp"),
    ("transformer.h.1.attn.c_proj.weight", "layers.1.o_proj", "attention"),
    ("gpt_neox.layers.2.mlp.dense_h_to_4h.weight", "layers.2.up_proj", "mlp"),
    ("gpt_neox.layers.2.mlp.dense_4h_to_h.weight", "layers.2.down_proj", "mlp"),
    ("gpt_neox.layers.2.attention.dense.weight", "layers.2.o_proj", "attention"),
    ("model.layers.3.mlp.gate_proj.weight", "layers.3.gate_proj", "mlp"),
    ("model.layers.3.self_attn.v_proj.weight", "layers.3.v_proj", "attention"),
])
def test_attention_and_mlp_names_of_opt_gpt2_neox_and_llama_land_in_their_groups(stored, canon, kind):
    layer, role, leaf = C.parse_name(stored)
    name = C.canonical_name(layer, role, leaf)
    assert name == canon and C.kind_of(name) == kind
    assert C.is_matrix_family(name, (16, 8)) == (kind in ("attention", "mlp") and leaf == "weight")


@pytest.mark.parametrize("stored", ["transformer.h.0.attn.c_attn.weight",
                                    "gpt_neox.layers.0.attention.query_key_value.weight"])
def test_fused_attention_of_gpt2_and_neox_splits_into_attention_matrices(stored):
    config = {"model_type": "gpt_neox", "num_attention_heads": 2, "hidden_size": 8}
    refs = C.split_refs(stored, (8, 24) if "c_attn" in stored else (24, 8), config)
    assert [r.canonical for r in refs] == ["layers.0.q_proj", "layers.0.k_proj", "layers.0.v_proj"]
    assert all(C.kind_of(r.canonical) == "attention" and C.is_matrix_family(r.canonical, r.shape) for r in refs)


def test_an_opt_update_is_reported_per_mlp_and_attention_family_with_stable_ranks():
    g = torch.Generator().manual_seed(0)
    names = ["model.decoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.0.self_attn.out_proj.weight",
             "model.decoder.layers.0.fc1.weight", "model.decoder.layers.0.fc2.weight"]
    base = {n: torch.randn(6, 4, generator=g) for n in names}
    tuned = {n: t + torch.randn(6, 4, generator=g) * 1e-2 for n, t in base.items()}
    rep = W.compare_updates(base, {"es": tuned})
    assert set(rep["kinds"]) == {"attention", "mlp"}
    assert set(rep["families"]) == {"q_proj", "o_proj", "up_proj", "down_proj"}
    for row in rep["tensors"]:
        assert row["es"]["stable_rank"] is not None and row["es"]["stable_rank"] >= 1.0, row["name"]


def test_a_mixture_of_experts_router_is_not_a_gate_projection():
    """Qwen-MoE / OLMoE / DeepSeek store the router as `mlp.gate` ([experts, hidden]): it must not enter the
    stable-rank average as a gate projection; the dense `gate_proj` / `w1` still do."""
    router = "model.layers.3.mlp.gate.weight"
    layer, role, leaf = C.parse_name(router)
    canon = C.canonical_name(layer, role, leaf)
    assert canon == "layers.3.mlp.gate" and C.kind_of(canon) == "other"
    assert not C.is_matrix_family(canon, (8, 64))
    for dense in ("model.layers.3.mlp.gate_proj.weight", "layers.3.feed_forward.w1.weight"):
        layer, role, leaf = C.parse_name(dense)
        assert C.is_matrix_family(C.canonical_name(layer, role, leaf), (128, 64)), dense


def test_sparsity_of_an_empty_update_is_refused_and_of_one_entry_is_that_entry():
    with pytest.raises(ValueError, match="empty update"):
        W.sparsity(torch.zeros(0))
    with pytest.raises(ValueError, match="empty update"):
        W.sparsity({})
    assert W.sparsity(torch.tensor([0.0])) == 1.0 and W.sparsity(torch.tensor([1.0])) == 0.0


def test_stable_rank_flattens_a_tensor_of_more_than_two_dims_along_its_first():
    t = rand(4, 3, 5, seed=7)
    flat = t.reshape(4, 15).numpy()
    want = np.linalg.norm(flat, "fro") ** 2 / scipy.linalg.svdvals(flat)[0] ** 2
    assert W.stable_rank(t) == pytest.approx(want, rel=1e-10)
    with pytest.raises(ValueError, match="needs a matrix"):
        W.stable_rank(torch.ones(3))


def test_cosine_of_a_zero_update_is_nan_and_mixed_arguments_are_refused():
    x = rand(3, 4, seed=8)
    assert math.isnan(W.cosine_similarity(torch.zeros(3, 4), x))
    res = W.cosine_similarity({"a": torch.zeros(2), "b": x}, {"a": torch.ones(2), "b": x})
    assert math.isnan(res["per_tensor"]["a"]) and res["per_tensor"]["b"] == pytest.approx(1.0)
    for a, b in ((x, {"a": x}), ({"a": x}, x), ([x], [x])):
        with pytest.raises(TypeError, match="two tensors or two mappings"):
            W.cosine_similarity(a, b)


def test_compare_updates_reads_each_source_under_its_own_stored_names(tmp_path):
    """Sources are matched by canonical name: a base stored as `model.layers...` and updates stored as
    `layers...` (or fused) give per-tensor norms, stable ranks and cosines of the right tensors."""
    names = ["layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "norm.weight"]
    shapes = [(6, 5), (5, 7), (5,)]
    base = {"model." + n: rand(*s, seed=i) for i, (n, s) in enumerate(zip(names, shapes))}
    da = {n: rand(*s, seed=10 + i) * 1e-3 for i, (n, s) in enumerate(zip(names, shapes))}
    db = {n: rand(*s, seed=20 + i) * 1e-2 for i, (n, s) in enumerate(zip(names, shapes))}
    es = {n: base["model." + n] + da[n] for n in names}
    grpo = {n: base["model." + n] + db[n] for n in names}
    from safetensors.torch import save_file

    for label, sd in (("base", base), ("es", es), ("grpo", grpo)):
        (tmp_path / label).mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / label / "model.safetensors"))
    rep = W.compare_updates(tmp_path / "base", {"es": tmp_path / "es", "grpo": tmp_path / "grpo"})
    assert rep["unmatched"] == {}
    rows = {r["name"]: r for r in rep["tensors"]}
    for n, canon in zip(names, ["layers.0.q_proj", "layers.0.down_proj", "norm"]):
        a, b = da[n].numpy().ravel(), db[n].numpy().ravel()
        row = rows[canon]
        assert row["es"]["sq"] == pytest.approx(a @ a, rel=1e-9)
        assert row["cos:es|grpo"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-9)
        if da[n].dim() == 2:
            for lab, d in (("es", da[n]), ("grpo", db[n])):
                m = d.numpy()
                want = np.linalg.norm(m) ** 2 / scipy.linalg.svdvals(m)[0] ** 2
                assert row[lab]["stable_rank"] == pytest.approx(want, rel=1e-6)
        else:
            assert row["es"]["stable_rank"] is None
    assert rep["sources"] == {k: str(tmp_path / k) for k in ("base", "es", "grpo")}


def test_summary_of_no_tensors():
    s = W.summarize([], ["es"], [])
    assert s["numel"] == 0 and s["es"]["norm"] == 0.0 and s["es"]["max_abs"] == 0.0
    assert s["es"]["sparsity"] is None and s["es"]["stable_rank_mean"] is None


def test_fused_biases_and_odd_widths():
    """A fused gate_up bias splits like its weight; a c_attn whose width is no multiple of 3 is not guessed at
    (it stays one fused tensor); a bare `layers.3` name has no layer of its own."""
    gate, up = C.split_refs("model.layers.0.mlp.gate_up_proj.bias", (8,))
    assert (gate.canonical, gate.shape, gate.segments) == ("layers.0.gate_proj.bias", (4,), ((0, 4),))
    assert (up.canonical, up.shape, up.segments) == ("layers.0.up_proj.bias", (4,), ((4, 8),))
    (odd,) = C.split_refs("transformer.h.0.attn.c_attn.weight", (4, 10))
    assert odd.canonical == "layers.0.qkv_proj" and odd.shape == (4, 10) and odd.columns is None
    assert C.layer_of("layers.3") is None and C.role_of("layers.3") == "layers.3"
    # a Falcon query_key_value whose rows fit none of its layouts stays fused
    falcon = {"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 32, "multi_query": False}
    (qkv,) = C.split_refs("transformer.h.0.self_attention.query_key_value.weight", (80, 32), falcon)
    assert qkv.canonical == "layers.0.qkv_proj" and qkv.segments is None


def test_global_names_match_whole_components_and_position_embeddings_are_embeddings():
    """`norm` or `embed_tokens` inside a longer name is not that tensor (BART's layernorm_embedding, Gemma's
    per-layer embeddings); GPT-2's wpe is a position embedding."""
    for stored in ("model.layernorm_embedding.weight", "model.embed_tokens_per_layer.weight"):
        layer, role, leaf = C.parse_name(stored)
        assert (layer, role) == (None, "other:" + stored.removesuffix(".weight")), stored
    layer, role, leaf = C.parse_name("transformer.wpe.weight")
    assert C.canonical_name(layer, role, leaf) == "position_embeddings"
    assert C.kind_of("position_embeddings") == "embedding"


def test_biases_count_with_their_matrix_kind_but_not_as_matrices():
    assert C.kind_of("layers.0.q_proj.bias") == "attention" and C.kind_of("layers.0.down_proj.bias") == "mlp"
    assert not C.is_matrix_family("layers.0.q_proj.bias", (16, 16))
    assert not C.is_matrix_family("layers.0.q_proj", (16,))  # only 2-D weights enter the stable-rank average
    scalar = C.TensorRef("x", "x", ())
    assert scalar.rows == 1 and scalar.numel == 1


def _segments(refs):
    return [(r.canonical, r.shape, r.segments, r.columns) for r in refs]


def test_fused_qkv_with_grouped_kv_heads_explicit_head_dim_and_text_config():
    """q|k|v blocks of q = heads*hd and k = v = kv*hd rows: 4 heads, 2 kv heads, hd 8 (hidden / heads) gives
    32|16|16 rows; an explicit head_dim of 16 gives 64|32|32; a multimodal config holds them in text_config."""
    key = "model.layers.0.self_attn.qkv_proj.weight"
    gqa = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32}
    assert _segments(C.split_refs(key, (64, 32), gqa)) == [
        ("layers.0.q_proj", (32, 32), ((0, 32),), None), ("layers.0.k_proj", (16, 32), ((32, 48),), None),
        ("layers.0.v_proj", (16, 32), ((48, 64),), None)]
    wide = C.split_refs(key, (128, 32), {**gqa, "head_dim": 16})
    assert [r.segments for r in wide] == [((0, 64),), ((64, 96),), ((96, 128),)]
    nested = C.split_refs(key, (64, 32), {"model_type": "some_vlm", "text_config": gqa})
    assert _segments(nested) == _segments(C.split_refs(key, (64, 32), gqa))
    bias = C.split_refs("model.layers.0.self_attn.qkv_proj.bias", (64,), gqa)
    assert _segments(bias) == [("layers.0.q_proj.bias", (32,), ((0, 32),), None),
                               ("layers.0.k_proj.bias", (16,), ((32, 48),), None),
                               ("layers.0.v_proj.bias", (16,), ((48, 64),), None)]


def test_fused_tensors_whose_rows_fit_no_layout_stay_fused():
    """Rows that do not match the configured heads are not guessed at (not cut in thirds, not truncated)."""
    mha = {"num_attention_heads": 4, "hidden_size": 32}
    for key, shape, config in [
        ("model.layers.0.self_attn.qkv_proj.weight", (99, 32), mha),
        ("model.layers.0.self_attn.qkv_proj.weight", (90, 32), {"n_head": 4, "n_embd": 32}),
        ("gpt_neox.layers.0.attention.query_key_value.weight", (90, 32), {**mha, "model_type": "gpt_neox"}),
        # Falcon's new architecture needs whole groups: 4 heads cannot share 3 kv heads
        ("transformer.h.0.self_attention.query_key_value.weight", (72, 32),
         {**mha, "model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 3}),
    ]:
        (ref,) = C.split_refs(key, shape, config)
        assert (ref.canonical, ref.shape, ref.segments) == ("layers.0.qkv_proj", shape, None), (key, config)
    (odd,) = C.split_refs("model.layers.0.mlp.gate_up_proj.weight", (7, 4))
    assert (odd.canonical, odd.segments) == ("layers.0.gate_up_proj", None)


def test_gpt2_bias_bloom_rows_and_falcon_multi_query_by_default():
    """GPT-2's c_attn bias is q|k|v thirds; BLOOM interleaves q, k, v per head like NeoX; a Falcon config without
    `multi_query` is multi-query (FalconConfig's default): every query head, then one key and one value."""
    q, k, v = C.split_refs("transformer.h.0.attn.c_attn.bias", (96,))
    assert [r.segments for r in (q, k, v)] == [((0, 32),), ((32, 64),), ((64, 96),)]
    assert [r.canonical for r in (q, k, v)] == ["layers.0.q_proj.bias", "layers.0.k_proj.bias", "layers.0.v_proj.bias"]
    bloom = {"model_type": "bloom", "num_attention_heads": 2, "hidden_size": 16}
    q, k, v = C.split_refs("transformer.h.0.self_attention.query_key_value.weight", (48, 16), bloom)
    assert q.segments == ((0, 8), (24, 32)) and k.segments == ((8, 16), (32, 40)) and v.segments == ((16, 24), (40, 48))
    falcon = {"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 32}
    q, k, v = C.split_refs("transformer.h.0.self_attention.query_key_value.weight", (48, 32), falcon)
    assert _segments([q, k, v]) == [("layers.0.q_proj", (32, 32), ((0, 32),), None),
                                    ("layers.0.k_proj", (8, 32), ((32, 40),), None),
                                    ("layers.0.v_proj", (8, 32), ((40, 48),), None)]


def test_canonical_refs_never_merge_two_tensors_and_drop_a_tied_head_only_beside_its_embedding():
    refs = C.canonical_refs({"model.layers.0.self_attn.q_proj.weight": (4, 4), "layers.0.attn.q_proj.weight": (4, 4)})
    assert {n: r.key for n, r in refs.items()} == {"layers.0.q_proj": "model.layers.0.self_attn.q_proj.weight",
                                                   "layers.0.attn.q_proj.weight": "layers.0.attn.q_proj.weight"}
    tie = {"tie_word_embeddings": True}
    assert C.tied_lm_head({"model.embed_tokens.weight": (8, 4), "lm_head.weight": (8, 4)}, tie) == ["lm_head.weight"]
    assert C.tied_lm_head({"lm_head.weight": (8, 4), "model.norm.weight": (4,)}, tie) == []  # nothing to tie to


def test_compare_updates_counts_an_entry_equal_to_eps_as_sparse():
    """The streamed comparison counts |d| <= eps, boundary included, as `sparsity` does: of the update
    [0.25, -0.25, 0.5, 0] at eps = 0.25, three entries (0.25, -0.25 and 0) are sparse."""
    base = {"a.weight": torch.zeros(4, dtype=torch.float64)}
    tuned = {"a.weight": torch.tensor([0.25, -0.25, 0.5, 0.0], dtype=torch.float64)}
    rep = W.compare_updates(base, tuned, eps=0.25, stable_ranks=False)
    assert rep["tensors"][0]["tuned"]["small"] == 3
    assert rep["total"]["tuned"]["sparsity"] == 0.75


def test_summarize_averages_stable_ranks_of_attention_and_mlp_matrices_only():
    """Table 4's stable rank is the mean over q/k/v/o and gate/up/down matrices: a rank on another family (here
    lm_head, 11) stays out. Ranks 1 and 3 -> mean 2, median 2, n 2 (not (1 + 3 + 11) / 3 = 5)."""
    def row(name, role, rank, shape):
        return {"name": name, "role": role, "numel": 4, "shape": shape,
                "tuned": {"sq": 1.0, "small": 0, "small_bf16": 1, "max_abs": 1.0, "stable_rank": rank}}

    rows = [row("layers.0.q_proj", "q_proj", 1.0, [2, 2]), row("layers.0.down_proj", "down_proj", 3.0, [4, 1]),
            row("lm_head", "lm_head", 11.0, [1, 4])]
    out = W.summarize(rows, ["tuned"], [])["tuned"]
    assert (out["stable_rank_mean"], out["stable_rank_median"], out["stable_rank_n"]) == (2.0, 2.0, 2)
    # the Gaussian reference over the same two matrices: 4 / (2 sqrt 2)^2 = 0.5 and 4 / 3^2
    assert out["stable_rank_gaussian"] == pytest.approx((0.5 + 4 / 9) / 2)
    assert out["sparsity"] == 0 and out["sparsity_bf16"] == pytest.approx(3 / 12)


def test_the_gaussian_stable_rank_is_that_of_drawn_gaussian_matrices():
    torch.manual_seed(0)
    for shape in [(192, 576), (576, 1536), (1536, 576)]:
        drawn = W.stable_rank(torch.randn(*shape, dtype=torch.float64))
        assert W.gaussian_stable_rank(shape) == pytest.approx(drawn, rel=0.03)


def test_bf16_sparsity_counts_the_changes_that_rounding_to_bf16_hides():
    """A 1e-4 change of a weight near 0.5 is below half a bf16 step there (2^-9 = 0.00195): exact sparsity 0, bf16
    sparsity 1; a change of 0.01 survives the rounding."""
    base = {"w": torch.full((4, 4), 0.5)}
    small = {"w": base["w"] + 1e-4}
    big = {"w": base["w"] + torch.tensor([1e-2] * 4 + [1e-4] * 12).reshape(4, 4)}
    tot = W.compare_updates(base, {"small": small, "big": big}, stable_ranks=False)["total"]
    assert tot["small"]["sparsity"] == 0 and tot["small"]["sparsity_bf16"] == 1
    assert tot["big"]["sparsity"] == 0 and tot["big"]["sparsity_bf16"] == 0.75


def test_only_two_dimensional_tensors_of_the_matrix_families_are_matrices():
    """The paper's "large weight matrices" are 2-D: a 3-D tensor under a q_proj name is not averaged as one."""
    assert C.is_matrix_family("layers.0.q_proj", (4, 3))
    assert not C.is_matrix_family("layers.0.q_proj", (2, 4, 3))
    assert not C.is_matrix_family("layers.0.q_proj.bias", (4,))
    assert not C.is_matrix_family("lm_head", (4, 3))


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_cosine_of_mappings_skips_every_name_missing_from_the_other_side():
    """Only names in both mappings count, wherever the others sit: a = {x: [1, 0], only_a: [5], y: [0, 1]},
    b = {x: [1, 0], y: [0, 2]}: per tensor cos(x) = 1, cos(y) = 1; total = 3 / (sqrt 2 sqrt 5) = 0.9487."""
    a = {"x": f64(1.0, 0.0), "only_a": f64(5.0), "y": f64(0.0, 1.0)}
    b = {"x": f64(1.0, 0.0), "y": f64(0.0, 2.0)}
    out = W.cosine_similarity(a, b)
    assert out["per_tensor"] == pytest.approx({"x": 1.0, "y": 1.0})
    assert out["total"] == pytest.approx(3 / math.sqrt(10))


def test_compare_updates_pairs_each_two_updates_once_and_never_one_with_itself():
    """Three updates -> the three pairs a|b, a|c, b|c (n (n - 1) / 2), with a cosine key each and no a|a."""
    base = {"w.weight": torch.zeros(2, dtype=torch.float64)}
    ups = {k: {"w.weight": torch.tensor(v, dtype=torch.float64)}
           for k, v in (("a", [1.0, 0.0]), ("b", [1.0, 1.0]), ("c", [0.0, 3.0]))}
    rep = W.compare_updates(base, ups, stable_ranks=False)
    assert rep["pairs"] == ["a|b", "a|c", "b|c"]
    assert sorted(k for k in rep["total"] if k.startswith("cos:")) == ["cos:a|b", "cos:a|c", "cos:b|c"]
    assert rep["total"]["cos:a|b"] == pytest.approx(1 / math.sqrt(2)) and rep["total"]["cos:a|c"] == 0.0


def test_table3_shows_a_zero_es_update_as_a_ratio_of_zero(tmp_path):
    """An ES stage whose every iteration had zero fitness spread leaves the base weights: its norm is 0 and the
    ES/GRPO ratio 0x (as the JSON's norm_ratio), not n/a, which Table 3 keeps for a GRPO update of norm 0."""
    from types import SimpleNamespace

    from safetensors.torch import save_file

    base = make_tiny_model(vocab_size=64, hidden=16)
    for name in ("base", "es", "grpo"):
        base.save_pretrained(tmp_path / name)
    moved = {n: p.detach() + 1e-3 for n, p in base.named_parameters()}
    save_file({n: t.contiguous() for n, t in moved.items()}, str(tmp_path / "grpo" / "model.safetensors"))

    def chain(algorithm):
        return SimpleNamespace(label=algorithm, base=tmp_path / "base", base_spec="base", algorithm=algorithm,
                               tasks=["boolq"], shown_tasks=["boolq"],
                               stages=[SimpleNamespace(checkpoint=tmp_path / algorithm, run=RUN100)])

    pair = SimpleNamespace(label="es vs grpo", es=chain("es"), grpo=chain("grpo"))
    ctx = SimpleNamespace(pairs=[pair], chains=[pair.es, pair.grpo], skip=lambda *a: None, results={},
                          cache=SimpleNamespace(get=lambda name, params, fn, **kw: (fn(), False)), progress=False,
                          config=SimpleNamespace(eps=1e-5), fig=lambda name: tmp_path / f"{name}.png",
                          plot=lambda cached, path, fn: None)
    (comp,) = WR.report_weights(ctx)
    (row,) = comp.norms
    assert row[1] == 0.0 and row[2] > 0 and row[3] == "0x"
    assert comp.budget == ""  # the study's 100 iterations


def test_family_table_lists_each_update_and_each_pair_from_independent_sums():
    """`family_rows` (the report's per-family table): one column triple per update, one cosine per pair, each
    row's values those of its family, computed here with numpy from the two layers' q_proj deltas."""
    from esft.tables import pct

    names = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)]
    base = {n: torch.zeros(3, 4, dtype=torch.float64) for n in names}
    es = {n: rand(3, 4, seed=10 + i) for i, n in enumerate(names)}
    grpo = {n: rand(3, 4, seed=20 + i) * (torch.arange(12).reshape(3, 4) % 3 == 0) for i, n in enumerate(names)}
    head, rows = WR.family_rows(W.compare_updates(base, {"es": es, "grpo": grpo}))
    assert head == ["family", "tensors", "entries", "es norm", "es sparsity", "es stable rank",
                    "grpo norm", "grpo sparsity", "grpo stable rank", "cos es|grpo"]
    (row,) = rows
    ve = np.concatenate([es[n].numpy().ravel() for n in names])
    vg = np.concatenate([grpo[n].numpy().ravel() for n in names])
    srank = [np.mean([np.linalg.norm(d[n].numpy()) ** 2 / scipy.linalg.svdvals(d[n].numpy())[0] ** 2
                      for n in names]) for d in (es, grpo)]
    assert row[:3] == ["q_proj", 2, 24]
    assert row[3] == pytest.approx(np.linalg.norm(ve), rel=1e-12) and row[4] == pct(0.0)
    assert row[5] == pytest.approx(srank[0], rel=1e-9)
    assert row[6] == pytest.approx(np.linalg.norm(vg), rel=1e-12) and row[7] == pct(np.mean(vg == 0))
    assert row[8] == pytest.approx(srank[1], rel=1e-9)
    assert row[9] == pytest.approx(ve @ vg / np.linalg.norm(ve) / np.linalg.norm(vg), rel=1e-9)


def test_the_cosine_of_an_update_that_moved_nothing_is_recorded_as_none():
    """A zero update has no direction: its cosine is None in the JSON-serialisable report (NaN is no JSON),
    per tensor and in the total, where the other pair's cosine is still a number."""
    base = {"w.weight": torch.zeros(2, dtype=torch.float64)}
    ups = {"a": {"w.weight": torch.tensor([1.0, 0.0], dtype=torch.float64)},
           "b": {"w.weight": torch.zeros(2, dtype=torch.float64)},
           "c": {"w.weight": torch.tensor([1.0, 1.0], dtype=torch.float64)}}
    rep = W.compare_updates(base, ups, stable_ranks=False)
    (row,) = rep["tensors"]
    assert row["cos:a|b"] is None and rep["total"]["cos:a|b"] is None and rep["total"]["cos:b|c"] is None
    assert rep["total"]["cos:a|c"] == pytest.approx(1 / math.sqrt(2))
    json.dumps(rep, allow_nan=False)


def test_an_undefined_drift_fit_prints_as_n_a_not_none():
    """`esft analyze drift` printed `R^2 median None` (an R^2 of a flat series is undefined), as `weights` once
    printed None for a missing stable rank."""
    from esft.analysis.command_text import format_drift

    res = {"steps": 2, "num_params": 10, "alpha": 0.5, "population": 4,
           "total": {"r2_theory": None, "rho": 0.6, "r2_fit": None, "final_ratio": 0.5},
           "families": {"q_proj": {"n": 3, "rho": {"median": 0.59981}, "r2_fit": {"median": None}}}}
    text = format_drift(res)
    assert "None" not in text
    assert "R^2(theory)=n/a, fit rho=0.6, fit R^2=n/a, measured/predicted=0.5" in text
    assert "rho median 0.5998  R^2 median n/a" in text


def test_the_drift_summary_prints_the_displacement_ratio_with_a_grpo_run():
    """`esft analyze drift --run ES --grpo-run GRPO` computed ||dtheta_ES|| / ||dtheta_GRPO|| at a matched step
    (drift.json) but printed nothing of it."""
    from esft.analysis.command_text import format_drift

    res = {"steps": 4, "num_params": 10, "alpha": 0.5, "population": 4,
           "total": {"r2_theory": 0.9, "rho": 0.6, "r2_fit": 0.8, "final_ratio": 0.5}, "families": {}}
    assert "GRPO" not in format_drift(res)
    res["grpo_ratio_at_matched_step"] = {"step": 3, "es_sq": 4.0, "grpo_sq": 1.0, "ratio": 2.0}
    assert format_drift(res).endswith("\n||dtheta_ES|| / ||dtheta_GRPO|| at step 3: 2")
    res["grpo_ratio_at_matched_step"] = None
    assert format_drift(res).endswith("\n||dtheta_ES|| / ||dtheta_GRPO||: n/a (the two runs share no logged step)")


def test_the_budget_note_of_a_budget_snapshot_names_its_own_iterations(tmp_path):
    """An experiment's `iterations: [100, 300]` trains one run to 300 and takes its es@100 stage from the snapshot
    iter_000100: that stage ran 100 iterations, the study's budget, whatever the run's config.yaml says (300)."""
    from safetensors.torch import save_file

    base = make_tiny_model(vocab_size=64, hidden=16)
    base.save_pretrained(tmp_path / "base")
    ckpts = tmp_path / "run" / "checkpoints"
    for k, (name, step) in enumerate((("iter_000100", 100), ("final", 300))):
        base.save_pretrained(ckpts / name)
        save_file({n: p.detach() + (k + 1) * 1e-3 for n, p in base.named_parameters()},
                  str(ckpts / name / "model.safetensors"))
        (ckpts / name / "es_state.json").write_text(json.dumps({"step": step}))
    run300 = _NS(config={"iterations": 300})

    def budget(checkpoint: str) -> str:
        chain = _NS(label="es@100", base=tmp_path / "base", base_spec="base", algorithm="es", tasks=["countdown"],
                    shown_tasks=["countdown"], stages=[_NS(checkpoint=ckpts / checkpoint, run=run300)])
        ctx = _NS(pairs=[], chains=[chain], skip=lambda *a: None, results={},
                  cache=_NS(get=lambda name, params, fn, **kw: (fn(), False)), progress=False,
                  config=_NS(eps=1e-5), fig=lambda name: tmp_path / f"{name}.png", plot=lambda cached, path, fn: None)
        (comp,) = WR.report_weights(ctx)
        return comp.budget

    assert budget("iter_000100") == ""  # the study's 100: no note (it read "these ES stages ran 300")
    assert budget("final") == "The study's ES values are of 100 iterations per stage; these ES stages ran 300."
    assert WR.stage_iterations(_NS(checkpoint=None, run=run300)) == 300  # no checkpoint: the run's budget


def test_bf16_sparsity_rounds_the_base_too_so_an_unchanged_weight_off_the_bf16_grid_is_sparse():
    """Both weights as a bf16 checkpoint would hold them: an fp32 base of 0.3 (between the bf16 values 0.29883 and
    0.30078) left unchanged, or moved by 1e-4 (still rounding to 0.30078), is no change in bf16; comparing the rounded
    tuned weight with the unrounded base would read the ~8e-4 rounding error as an update."""
    base = {"w": torch.full((2, 3), 0.3)}
    tuned = {"w": base["w"] + torch.tensor([[0.0] * 3, [1e-4] * 3])}
    tot = W.compare_updates(base, {"t": tuned}, stable_ranks=False)["total"]["t"]
    assert tot["sparsity"] == 0.5  # the exact update: three zeros, three changes of 1e-4 > eps
    assert tot["sparsity_bf16"] == 1.0
