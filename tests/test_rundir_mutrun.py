"""esft.rundir's evaluation-record helpers and run-folder probes, pinned where a mutation audit found them
untested: the progress line a trainer prints after each held-out evaluation, the fields of that record, and the
run-folder checks.

Run: pytest -q tests/test_rundir_mutrun.py   (< 2 s; no model)
"""

from __future__ import annotations

from esft.rundir import held_out_fields, held_out_text

BASELINE = {"constant_baseline": 0.75, "constant_baseline_ci95": [0.301, 0.954], "constant_answer": "no"}


def rows(scores, formed=None, extracted=None):
    out = []
    for i, s in enumerate(scores):
        r = {"score": s}
        if formed is not None:
            r["well_formed"] = formed[i]
        if extracted is not None:
            r["extracted"] = extracted[i]
        out.append(r)
    return out


def test_held_out_text_shows_format_rate_and_the_constant_answer_beside_an_accuracy():
    rec = held_out_fields(rows([1, 0, 1, 0], formed=[True, True, False, True]), 40, BASELINE)
    text = held_out_text(rec)
    lo, hi = rec["test_ci95"]
    assert text == (f"held-out accuracy 0.500 [{lo:.3f}, {hi:.3f}] (format 0.75), constant answer 'no' 0.750 "
                    "[0.301, 0.954]")


def test_held_out_text_without_format_check_or_baseline_shows_neither():
    rec = held_out_fields(rows([1, 0]), 8, None)
    assert rec["test_format_rate"] is None
    text = held_out_text(rec)
    assert "format" not in text and "constant" not in text and text.startswith("held-out accuracy 0.500 [")


def test_held_out_text_cuts_a_long_constant_answer_to_16_characters():
    rec = held_out_fields(rows([1, 0]), 8, {**BASELINE, "constant_answer": "abcdefghijklmnopqrstuvwxyz"})
    assert "constant answer 'abcdefghijklmnop' 0.750" in held_out_text(rec)


def test_held_out_text_of_a_baseline_without_interval_shows_the_point_alone():
    """No made-up bounds: [0.5, 0.5] would claim a certainty, [0, 1] an ignorance, that nothing recorded."""
    rec = held_out_fields(rows([1, 0]), 8, {"constant_baseline": 0.5, "constant_answer": "yes"})
    assert held_out_text(rec).endswith(", constant answer 'yes' 0.500")


def test_held_out_text_of_a_mean_reward_shows_no_constant_answer():
    rec = held_out_fields(rows([2.0, 4.0]), 8, BASELINE)
    text = held_out_text(rec)
    assert text.startswith("held-out mean reward 3.000") and "constant" not in text


def test_held_out_fields_of_a_reward_outside_0_1_record_no_constant_baseline():
    """A share of examples is no companion for a mean reward (as `esft eval`'s summary): the record, which the
    curves, tables and trackers read, holds None there, also when only one score leaves [0, 1]."""
    for scores in ([2.0, 4.0], [1.0, -0.5], [0.0, 1.5]):
        rec = held_out_fields(rows(scores), 8, BASELINE)
        assert [rec[f"test_{k}"] for k in BASELINE] == [None, None, None], scores
    rec = held_out_fields(rows([0.0, 0.5, 1.0]), 8, BASELINE)  # partial credit is still an accuracy
    assert [rec[f"test_{k}"] for k in BASELINE] == list(BASELINE.values())


def test_held_out_fields_format_rate_accuracy_among_well_formed_and_answer_counts():
    rec = held_out_fields(rows([1, 0, 1, 0, 1], formed=[True, False, True, True, None],
                               extracted=["yes", "no", "yes", None, "yes"]), 55, BASELINE)
    assert rec["test_n"] == 5 and rec["test_accuracy"] == 0.6 and rec["test_tokens_generated"] == 55
    assert rec["test_format_rate"] == 0.6
    assert rec["test_accuracy_among_well_formed"] == 2 / 3
    assert list(rec["test_answer_counts"].items()) == [("yes", 3), ("no", 1), ("None", 1)]
    assert rec["test_constant_baseline"] == 0.75 and rec["test_constant_answer"] == "no"
    assert rec["test_constant_baseline_ci95"] == [0.301, 0.954]


def test_held_out_fields_keeps_the_ten_most_frequent_answers():
    answers = [str(i) for i in range(12) for _ in range(i + 1)]
    rec = held_out_fields(rows([0] * len(answers), extracted=answers), 0, None)
    assert list(rec["test_answer_counts"]) == [str(i) for i in range(11, 1, -1)]


def test_held_out_fields_no_well_formed_example_has_no_accuracy_among_them():
    rec = held_out_fields(rows([0, 0], formed=[False, False]), 0, None)
    assert rec["test_format_rate"] == 0.0 and rec["test_accuracy_among_well_formed"] is None
    assert rec["test_answer_counts"] is None
    empty = held_out_fields([], 0, None)
    assert empty["test_n"] == 0 and empty["test_accuracy"] == 0.0 and empty["test_format_rate"] is None


def test_peak_rss_mb_reads_kib_on_linux_and_bytes_on_macos(monkeypatch):
    import resource
    import sys
    from types import SimpleNamespace

    from esft import rundir

    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=3 * 1024 * 1024))
    monkeypatch.setattr(sys, "platform", "linux")
    assert rundir.peak_rss_mb() == 3 * 1024.0
    monkeypatch.setattr(sys, "platform", "darwin")
    assert rundir.peak_rss_mb() == 3.0


def test_run_lock_released_on_exit_lets_the_next_writer_in(tmp_path):
    from esft.rundir import RunDirBusy, RunLock, lock_held

    import pytest

    with RunLock(tmp_path) as lock:
        assert lock_held(tmp_path)
        with pytest.raises(RunDirBusy):
            RunLock(tmp_path).acquire()
    assert lock.fh is None and not lock_held(tmp_path)
    RunLock(tmp_path).acquire().release()  # a second writer, after the first left
    assert not lock_held(tmp_path)
    lock.release()  # twice: nothing to release


def test_is_run_dir_needs_config_yaml_and_a_log_or_checkpoints(tmp_path):
    from esft.rundir import is_run_dir

    (tmp_path / "config.yaml").write_text("model: x\n")
    assert not is_run_dir(tmp_path)  # a config alone: a run refused before it wrote anything
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text("{}\n")
    assert not is_run_dir(other)  # a log without its config: nothing says what ran
    (tmp_path / "drift.jsonl").write_text("{}\n")
    assert is_run_dir(tmp_path)


def test_run_lock_file_names_the_holder_pid_alone(tmp_path):
    import os

    from esft.rundir import RunLock

    (tmp_path / ".lock").write_text("9999999")  # a holder's pid from before
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text() == str(os.getpid())


def test_an_es_checkpoint_of_a_tokenizer_that_cannot_save_holds_the_model_alone(tmp_path):
    from es_tiny import tiny_llama
    from esft.es import es_rundir
    from esft.es.noise import MasterWeights

    model = tiny_llama(hidden=16, layers=1)
    folder = es_rundir.save_checkpoint(tmp_path, "final", 2, model, object(), MasterWeights(model))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "es_state.json", "generation_config.json",
                                                        "model.safetensors"]


def test_a_bf16_es_checkpoint_keeps_its_fp32_masters_exactly(tmp_path):
    import torch

    from es_tiny import tiny_llama
    from esft.es import es_rundir
    from esft.es.noise import MasterWeights

    model = tiny_llama(hidden=16, layers=1).to(torch.bfloat16)
    weights = MasterWeights(model)
    name = next(iter(weights.master))
    with torch.no_grad():
        weights.master[name].add_(1e-5)  # below bf16's resolution near 1: only the fp32 master holds it
    kept = {n: t.clone() for n, t in weights.master.items()}
    folder = es_rundir.save_checkpoint(tmp_path, "final", 4, model, None, weights)
    assert (folder / es_rundir.MASTERS_FILE).is_file()
    fresh = tiny_llama(hidden=16, layers=1).to(torch.bfloat16)
    again = MasterWeights(fresh)
    assert es_rundir.load_checkpoint(folder, fresh, again) == 4
    assert all(torch.equal(again.master[n], kept[n]) for n in kept)


def test_a_masters_file_lacking_a_tensor_is_damage_found_before_the_model_is_touched(tmp_path):
    """load_checkpoint copied the model's weights first and only then found a master missing: a KeyError (not
    CheckpointDamaged) out of a model already half overwritten, against its promise."""
    import pytest
    import torch
    from safetensors.torch import load_file, save_file

    from es_tiny import tiny_llama
    from esft.es import es_rundir
    from esft.es.noise import MasterWeights

    model = tiny_llama(hidden=16, layers=1).to(torch.bfloat16)
    weights = MasterWeights(model)
    folder = es_rundir.save_checkpoint(tmp_path, "final", 2, model, None, weights)
    masters = load_file(str(folder / es_rundir.MASTERS_FILE))
    dropped = sorted(masters)[-1]
    save_file({n: t for n, t in masters.items() if n != dropped}, str(folder / es_rundir.MASTERS_FILE))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    with pytest.raises(es_rundir.CheckpointDamaged, match=f"lacks the fp32 master of {dropped}"):
        es_rundir.load_checkpoint(folder, model, weights)
    assert all(bool((p == 0.5).all()) for p in model.parameters())


def test_a_failed_atomic_write_leaves_the_old_file_and_no_cut_copy_beside_it(tmp_path, monkeypatch):
    """A full disk while config.yaml, summary.json or a rewritten log was written left its cut `.tmp` copy in the
    folder (a checkpoint's failed write removes its own)."""
    import errno
    import os

    import pytest

    from esft.rundir import rewrite_jsonl, write_text_atomic

    (tmp_path / "summary.json").write_text("old")
    (tmp_path / "metrics.jsonl").write_text('{"a":1}\n')

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(tmp_path / "summary.json", "new" * 1000)
    with pytest.raises(OSError, match="No space left"):
        rewrite_jsonl(tmp_path / "metrics.jsonl", [{"a": 2}] * 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]
    assert (tmp_path / "summary.json").read_text() == "old"
    assert (tmp_path / "metrics.jsonl").read_text() == '{"a":1}\n'
