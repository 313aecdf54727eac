"""Gaps found by a mutation audit of esft.es.replay and esft.es.lanes: replay's step range and step 0, a device
of another type, `base_placement` with "auto" or several recorded dtypes, a damaged (unreadable) checkpoint, a step
without a checkpoint, the command line, drift's float64 sums and expectation, a one-ulp or missing-tensor
checkpoint; a lane copy in another dtype and `lanes_that_fit` / cgroup edge cases.

Run: pytest -q tests/test_replay_lanes_audit.py   (one tiny ES run, CPU, no download)
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, state, stub_generate, tiny_llama
from esft.api import train_es
from esft.es import replay
from esft.es.es_config import ESConfig, save_yaml
from esft.es.lanes import available_memory, lanes_that_fit, rollout_replica

GiB = 2**30


@pytest.fixture(scope="module")
def es_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay_audit") / "run"
    config = ESConfig(model="tiny", task="toy", population_size=4, sigma=0.05, alpha=0.02, batch_size=4,
                      iterations=3, max_new_tokens=2, seed=5, output_dir=str(out), eval_every=0,
                      checkpoint_every=0, format_bonus=0.1)
    train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate, progress=False)
    return out


def test_replay_yields_every_step_from_the_base_and_refuses_steps_outside_the_log(es_run):
    base = state(tiny_llama())
    model = tiny_llama()
    assert replay.rebuild(model, es_run, step=0) is not None
    assert all(torch.equal(t, base[n]) for n, t in state(model).items())  # step 0: the base itself
    assert all(not p.requires_grad for p in model.parameters())
    states = [(s.step, s.record and s.record["iteration"]) for s in replay.replay(tiny_llama(), es_run, upto=2)]
    assert states == [(0, None), (1, 0), (2, 1)]
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=f"step {bad} not in the seed log"):
            replay.rebuild(tiny_llama(), es_run, step=bad)


def test_drift_without_per_tensor_and_verify_without_a_checkpoint_of_the_step(es_run, tmp_path):
    full = list(replay.drift(tiny_llama(), es_run, upto=2))
    short = list(replay.drift(tiny_llama(), es_run, upto=2, per_tensor=False))
    assert [r["step"] for r in short] == [1, 2] and all("per_tensor" not in r and "numel" not in r for r in short)
    assert [r["total"] for r in short] == [r["total"] for r in full]
    assert full[-1]["total"] == sum(full[-1]["per_tensor"].values()) > 0
    run = tmp_path / "run"
    shutil.copytree(es_run, run)
    shutil.rmtree(run / "checkpoints")
    assert replay.verify(run, model=tiny_llama()) == {"step": 3, "checkpoint": None, "bit_identical": None,
                                                      "noise_stream": 0}


def test_verify_without_a_checkpoint_of_the_step_exits_apart_from_a_mismatch(es_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(es_run, run)
    monkeypatch.setattr(replay, "load_base", lambda run_dir: (tiny_llama(), None))
    assert replay.main(["verify", str(run)]) == 0
    shutil.rmtree(run / "checkpoints")
    capsys.readouterr()
    assert replay.main(["verify", str(run)]) == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["checkpoint"] is None and "no checkpoint of its last step (3)" in err


def test_an_unreadable_checkpoint_is_damage_not_a_mismatch(es_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(es_run, run)
    weights = next(p for p in (run / "checkpoints" / "final").iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: safetensors cannot parse its header
    result = replay.verify(run, model=tiny_llama())
    assert result["bit_identical"] is None and "damaged" in result["damaged"]
    assert result["checkpoint"] == str(run / "checkpoints" / "final")
    # a numbered copy of the step beside it, whichever of the two is damaged: the result names that one
    shutil.copytree(es_run / "checkpoints" / "final", run / "checkpoints" / "iter_000003")
    assert replay.verify(run, model=tiny_llama())["checkpoint"] == str(run / "checkpoints" / "final")
    shutil.rmtree(run / "checkpoints" / "final")
    shutil.copytree(es_run / "checkpoints" / "final", run / "checkpoints" / "final")
    numbered = next(p for p in (run / "checkpoints" / "iter_000003").iterdir() if p.suffix == ".safetensors")
    numbered.write_bytes(numbered.read_bytes()[:100])
    result = replay.verify(run, model=tiny_llama())
    assert result["bit_identical"] is None and result["checkpoint"] == str(run / "checkpoints" / "iter_000003")
    monkeypatch.setattr(replay, "load_base", lambda run_dir: (tiny_llama(), None))
    assert replay.main(["verify", str(run)]) == 1
    assert json.loads(capsys.readouterr().out)["bit_identical"] is None


def test_main_usage_and_rebuild_of_a_given_step(es_run, tmp_path, monkeypatch, capsys):
    assert replay.main(["verify"]) == 2 and replay.main(["nothing", str(es_run)]) == 2
    saved = {}
    model = tiny_llama()
    monkeypatch.setattr(model, "save_pretrained", lambda folder: saved.update(folder=folder, state=state(model)))
    monkeypatch.setattr(replay, "load_base", lambda run_dir: (model, None))
    assert replay.main(["rebuild", str(es_run), "1", str(tmp_path / "out")]) == 0
    expected = tiny_llama()
    replay.rebuild(expected, es_run, step=1)
    assert saved["folder"] == str(tmp_path / "out")
    assert all(torch.equal(t, state(expected)[n]) for n, t in saved["state"].items())
    out = tmp_path / "drift.jsonl"
    model2 = tiny_llama()
    monkeypatch.setattr(replay, "load_base", lambda run_dir: (model2, None))
    assert replay.main(["drift", str(es_run), str(out)]) == 0
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [1, 2, 3]


def test_main_refuses_bad_arguments_in_one_line_before_the_model_loads(es_run, tmp_path, monkeypatch, capsys):
    """A folder that is no ES run ended in a traceback saying "cannot resume ... without --resume"; a STEP that is
    not a number or past the seed log, and a missing OUT or DIR, ended in tracebacks after the model loaded."""
    def loaded(run_dir):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(replay, "load_base", loaded)
    (tmp_path / "empty").mkdir()
    for argv, message in ((["verify", str(tmp_path / "empty")], "is not an ES run directory (it lacks seeds.jsonl"),
                          (["drift", str(tmp_path / "missing"), "o.jsonl"], "is not an ES run directory"),
                          (["rebuild", str(es_run), "abc", str(tmp_path / "o")], "STEP 'abc' is not a step of"),
                          (["rebuild", str(es_run), "9", str(tmp_path / "o")], "STEP '9' is not a step of"),
                          (["rebuild", str(es_run), "1"], "usage"), (["drift", str(es_run)], "usage")):
        assert replay.main(argv) == 2
        captured = capsys.readouterr()
        usage = "python -m esft.es.replay rebuild RUN_DIR STEP DIR"
        assert (message in captured.err) if message != "usage" else (usage in captured.out), (argv, captured)
        assert "Traceback" not in captured.err


def _placement(tmp_path, info, **fields):
    save_yaml(ESConfig(model="tiny", **fields), tmp_path / "config.yaml", extra=info)
    return replay.base_placement(*replay.read_run_config(tmp_path))


def test_base_placement_resolves_auto_only_from_one_recorded_dtype(tmp_path):
    assert _placement(tmp_path, {"device": "cuda:0", "param_dtypes": {"bfloat16": 3}}, dtype="auto") == \
        ("bfloat16", "cuda")
    assert _placement(tmp_path, {"param_dtypes": {"bfloat16": 3, "float32": 2}}) == (None, None)
    assert _placement(tmp_path, {"device": "cuda:0", "param_dtypes": {"float32": 1}}, device="cpu",
                      dtype="bfloat16") == ("bfloat16", "cpu")


def test_load_base_on_another_device_type_is_refused_or_left_on_the_recorded_one(tmp_path, monkeypatch):
    import esft.models

    save_yaml(ESConfig(model="tiny"), tmp_path / "config.yaml", extra={"device": "cuda:0",
                                                                       "param_dtypes": {"float32": 3}})
    calls = []
    monkeypatch.setattr(esft.models, "load_model", lambda name, dtype=None, device=None: calls.append(
        (name, dtype, device)) or ("model", "tok"))
    with pytest.raises(ValueError, match="drew its noise on cuda"):
        replay.load_base(tmp_path, device="cpu")
    replay.load_base(tmp_path, device="cpu", other_type="recorded")
    replay.load_base(tmp_path, device="cuda:1")  # another device of the same type is the caller's choice
    assert calls == [("tiny", "float32", "cuda"), ("tiny", "float32", "cuda:1")]


def test_a_bf16_lane_copy_has_its_own_frozen_tensors_and_keeps_ties_and_buffers():
    model = tiny_llama()  # tied embedding and lm_head
    copy = rollout_replica(model, torch.bfloat16)
    params = dict(copy.named_parameters())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in params.values())
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(copy.parameters(), model.parameters()))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model is left as it is
    assert model.config.tie_word_embeddings and copy.lm_head.weight is copy.model.embed_tokens.weight
    for (n, b), (_, c) in zip(model.named_buffers(), copy.named_buffers()):
        assert torch.equal(b, c), n


def test_lanes_that_fit_with_an_empty_model_and_cgroup_usage_below_its_cache(tmp_path):
    assert lanes_that_fit(3, 1, 0, GiB) == 3  # nothing to copy: no division by zero
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {8 * 2**20} kB\n")
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "memory.max").write_text(f"{4 * GiB}\n")
    (tmp_path / "cg" / "memory.current").write_text(f"{GiB}\n")
    (tmp_path / "cg" / "memory.stat").write_text(f"total_inactive_file 1\ninactive_file {2 * GiB}\n")
    assert available_memory(str(meminfo), str(tmp_path / "cg")) == 4 * GiB  # never more than the limit


def test_drift_sums_in_float64_and_expects_the_logged_random_walk(es_run):
    from esft.es import es_rundir

    records = es_rundir.read_seed_log(es_run)
    steps = list(replay.drift(tiny_llama(), es_run))
    base = {n: m.clone() for n, m in replay.rebuild(tiny_llama(), es_run, step=0).iter_masters()}
    masters = dict(replay.rebuild(tiny_llama(), es_run).iter_masters())
    last = steps[-1]
    assert last["num_params"] == sum(m.numel() for m in base.values()) == sum(last["numel"].values())
    assert last["per_tensor"] == {n: float((m.double() - base[n].double()).pow(2).sum()) for n, m in masters.items()}
    unit = sum(r["scale"] ** 2 * sum(c * c for c in r["coefficients"]) for r in records)
    assert last["expected"] == pytest.approx(unit * last["num_params"], rel=1e-12) and unit > 0


def test_matches_checkpoint_tells_one_ulp_and_a_missing_tensor_apart(es_run, tmp_path):
    from safetensors.torch import load_file, save_file

    from esft.es import es_rundir

    model = tiny_llama()
    weights = replay.rebuild(model, es_run)
    folder = tmp_path / "final"
    shutil.copytree(es_run / "checkpoints" / "final", folder)
    assert replay.matches_checkpoint(model, weights, folder)
    path = next(p for p in folder.glob("*.safetensors"))
    saved = load_file(str(path))
    name = next(n for n in saved if "q_proj" in n)
    nudged = dict(saved)
    nudged[name] = saved[name].clone()
    nudged[name].view(-1)[0] = torch.nextafter(nudged[name].view(-1)[0], torch.tensor(1e9))  # one ulp
    save_file(nudged, str(path), metadata={"format": "pt"})
    assert replay.matches_checkpoint(model, weights, folder) is False
    save_file({n: t for n, t in saved.items() if n != name}, str(path), metadata={"format": "pt"})
    with pytest.raises(es_rundir.CheckpointDamaged, match="lacks"):
        replay.matches_checkpoint(model, weights, folder)
