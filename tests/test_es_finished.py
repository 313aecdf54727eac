"""Resuming a finished ES run answers from its run folder (esft.es.finished), before any model loads; where the
folder leaves a doubt (a damaged final checkpoint, an evaluation still due, more iterations asked for) the trainer's
own resume decides. Tiny random-init model, stub generation (tests/es_tiny.py)."""

from __future__ import annotations

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, stub_generate, tiny_llama
from esft.api import train_es
from esft.es import es_rundir
from esft.es.es_config import ESConfig, resume_config
from esft.es.finished import finished_checkpoint, intact


def cfg(tmp_path, **kw) -> ESConfig:
    base = dict(model="tiny", task="toy", population_size=4, sigma=0.05, alpha=0.02, batch_size=4, iterations=3,
                max_new_tokens=2, seed=5, output_dir=str(tmp_path / "run"), eval_every=3, eval_limit=4,
                checkpoint_every=1)
    base.update(kw)
    return ESConfig(**base)


def trained(config):
    return train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                    progress=False)


def forbid_loading(monkeypatch):
    """From here on, loading a model (or joining Ray) fails the test: a finished run needs neither."""
    monkeypatch.setattr("esft.models.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr("esft.api.connect", lambda *a, **k: pytest.fail("Ray was joined"))


def test_a_finished_run_resumed_says_so_without_loading_the_model(tmp_path, capsys, monkeypatch):
    config = cfg(tmp_path)
    done = trained(config)
    forbid_loading(monkeypatch)
    files = {p: p.stat().st_mtime_ns for p in done.output_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    res = train_es(resume_config(done.output_dir, {"save_total_limit": 1}))  # as `esft train es --resume RUN`
    assert capsys.readouterr().out == f"{config.output_dir}: already trained for 3 iterations (iterations 3); " \
                                      "nothing to do\n"
    assert (res.steps, res.final_checkpoint) == (3, done.final_checkpoint)
    # the lowered limit is applied; every other file is as it was (curve.png is redrawn, as after a run)
    assert [f.name for _, f in es_rundir.list_checkpoints(done.output_dir)] == ["iter_000002", "final"]
    after = {p: p.stat().st_mtime_ns for p in done.output_dir.rglob("*") if p.is_file()}
    kept = {p: t for p, t in files.items() if "iter_000001" not in p.parts and p.name not in ("curve.png", ".lock")}
    assert {p: after[p] for p in kept} == kept


def test_a_changed_setting_is_refused_as_any_resume_refuses_it(tmp_path, monkeypatch):
    config = cfg(tmp_path)
    run_dir = trained(config).output_dir
    forbid_loading(monkeypatch)
    with pytest.raises(ValueError, match=r"cannot change \['sigma'\]"):
        train_es(resume_config(run_dir).replace(sigma=0.1))


def damage_weights(final):
    model_file = next(f for f in final.glob("*.safetensors") if f.name != es_rundir.MASTERS_FILE)
    model_file.write_bytes(model_file.read_bytes()[:-100])


def damage_optimizer(final):
    path = final / es_rundir.OPTIMIZER_FILE
    path.write_bytes(path.read_bytes()[:-50])


def drop_last_eval(final):
    metrics = final.parents[1] / "metrics.jsonl"
    es_rundir.rewrite_jsonl(metrics, [r for r in es_rundir.read_jsonl(metrics)
                                      if not (r["kind"] == "eval" and r["step"] == 3)])


@pytest.mark.parametrize("spoil", [damage_weights, damage_optimizer, drop_last_eval])
def test_a_doubt_leaves_the_resume_to_the_trainer(tmp_path, spoil):
    config = cfg(tmp_path, optimizer="adam")
    final = trained(config).final_checkpoint
    assert finished_checkpoint(final.parents[1], config) == final
    spoil(final)
    assert finished_checkpoint(final.parents[1], config) is None


def test_more_iterations_or_a_newly_due_evaluation_is_not_finished(tmp_path):
    config = cfg(tmp_path, eval_every=0)
    run_dir = trained(config).output_dir
    assert finished_checkpoint(run_dir, config) is not None
    assert finished_checkpoint(run_dir, config.replace(iterations=4)) is None
    assert finished_checkpoint(run_dir, config.replace(eval_every=3)) is None  # its end was never evaluated


def test_a_damaged_final_checkpoint_is_trained_again_by_the_trainer(tmp_path, capsys):
    """The doubt resolved as before: the trainer skips the damaged final checkpoint, replays the seed log from the
    checkpoint before it, and writes final again."""
    config = cfg(tmp_path)
    final = trained(config).final_checkpoint
    damage_weights(final)
    assert not intact(final, needs_optimizer=False)
    res = trained(config.replace(resume=True))
    assert res.final_checkpoint == final and intact(final, needs_optimizer=False)
    assert "resuming from the checkpoint before it" in capsys.readouterr().err


def test_fewer_iterations_than_logged_are_refused_as_the_trainer_refuses_them(tmp_path, monkeypatch):
    """train_es with a config asking fewer iterations than the seed log holds (resume_config checks only its own
    overrides): refused before the model loads, not answered 'nothing to do'."""
    run_dir = trained(cfg(tmp_path)).output_dir
    forbid_loading(monkeypatch)
    with pytest.raises(ValueError, match="has 3 iterations logged; iterations 2 would end before them"):
        train_es(resume_config(run_dir).replace(iterations=2))


def test_a_final_checkpoint_missing_a_shard_is_left_to_the_trainer(tmp_path):
    """A sharded model (model.safetensors.index.json) whose second shard is absent (a copy cut short): every file
    present is whole, but the trainer finds parameters missing, resumes from the checkpoint before and writes final
    again; the folder alone must not call the run finished."""
    import json

    from safetensors.torch import load_file, save_file

    config = cfg(tmp_path)
    final = trained(config).final_checkpoint
    tensors = load_file(str(final / "model.safetensors"))
    names = sorted(tensors)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({n: tensors[n] for n in names[:1]}, str(final / first), metadata={"format": "pt"})
    (final / "model.safetensors").unlink()
    (final / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: first if i == 0 else second for i, n in enumerate(names)}}))
    assert finished_checkpoint(final.parents[1], config) is None
    res = trained(config.replace(resume=True))  # the trainer's own resume: the checkpoint is damaged to it
    assert res.final_checkpoint == final and (final / "model.safetensors").is_file()


def test_a_numbered_checkpoint_of_the_final_step_does_not_hide_the_final_one(tmp_path, monkeypatch, capsys):
    """A run interrupted right after saving its last step's numbered checkpoint, then resumed with nothing left to
    train, holds `final` and `iter_000003` at one step (list_checkpoints sorts the numbered one last): it is
    finished, and a resume says so without loading the model."""
    import shutil

    done = trained(cfg(tmp_path))
    final = done.final_checkpoint
    shutil.copytree(final, final.with_name("iter_000003"))
    assert [f.name for _, f in es_rundir.list_checkpoints(done.output_dir)][-2:] == ["final", "iter_000003"]
    assert finished_checkpoint(done.output_dir, cfg(tmp_path)) == final
    forbid_loading(monkeypatch)
    capsys.readouterr()
    res = train_es(resume_config(done.output_dir))
    assert "nothing to do" in capsys.readouterr().out and res.final_checkpoint == final
