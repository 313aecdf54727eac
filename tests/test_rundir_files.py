"""The run-directory file helpers on their own (esft.rundir, esft.es.es_rundir, the checkpoint choice of
esft.export): torn and damaged JSONL lines, atomic replacement with fsync, which checkpoints count and which
pruning deletes, the noise-stream and seed-log checks. Pure file operations on tmp_path, no model (~1 s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from esft import rundir
from esft.es import es_rundir
from esft.rundir import (CorruptLogError, RunDirBusy, RunLock, append_jsonl, checkpoint_name, demote_final,
                         filter_jsonl, holds_run, list_checkpoints, lock_held, prune_checkpoints, read_jsonl,
                         replace_dir, rewrite_jsonl, write_text_atomic)


@pytest.fixture()
def fsynced(monkeypatch) -> list[str]:
    """The paths os.fsync is called on (still synced for real)."""
    calls: list[str] = []
    real = os.fsync

    def record(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def make_checkpoint(root: Path, name: str, step: int | str | None, state: str = "es_state.json") -> Path:
    folder = root / "checkpoints" / name
    folder.mkdir(parents=True)
    (folder / "weights").write_text(name)
    if step is not None:
        (folder / state).write_text(json.dumps({"step": step}))
    return folder


# ---- JSONL logs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tail", ['{"a": 3', '{"a": 3}', '{"a": 3, "b\n', '{"a": 3, "b\n\n  \n'])
def test_a_torn_last_line_is_dropped(tmp_path, tail):
    """Unterminated (even if it parses: the write may have stopped before more keys) or unreadable, the last
    record is a crash mid-write; blank lines after it do not turn it into damage."""
    path = write(tmp_path / "log.jsonl", '{"a": 1}\n{"a": 2}\n' + tail)
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_complete_records_are_all_read_and_blank_lines_skipped(tmp_path):
    path = write(tmp_path / "log.jsonl", '{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert read_jsonl(tmp_path / "absent.jsonl") == []


@pytest.mark.parametrize("after", [1, 2])
@pytest.mark.parametrize("bad", ['{"a": 2, "b', "[1, 2]", "3"])
def test_an_unreadable_line_before_the_last_is_damage(tmp_path, bad, after):
    path = write(tmp_path / "log.jsonl", f'{{"a": 1}}\n{bad}\n' + '{"a": 3}\n' * after)
    with pytest.raises(CorruptLogError, match=rf"log.jsonl:2: .*the {after} line\(s\) after it"):
        read_jsonl(path)


def test_append_jsonl_fsyncs_each_line_unless_told_not_to(tmp_path, fsynced):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"a": 1})
    assert fsynced == [str(path)]
    append_jsonl(path, {"a": 2}, sync=False)
    assert fsynced == [str(path)]
    assert path.read_text() == '{"a":1}\n{"a":2}\n'


def test_rewrite_jsonl_replaces_the_file_whole_and_synced(tmp_path, fsynced):
    path = write(tmp_path / "log.jsonl", '{"a": 1}\n{"a": 2}\n{"a": 3')
    rewrite_jsonl(path, [{"a": 1}])
    assert path.read_text() == '{"a":1}\n'
    assert len(fsynced) == 1 and fsynced[0].endswith(".tmp")  # the new file, before it is renamed over
    assert [p.name for p in tmp_path.iterdir()] == ["log.jsonl"]


def test_filter_jsonl_rewrites_an_existing_log_and_creates_none(tmp_path):
    path = write(tmp_path / "metrics.jsonl", '{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert filter_jsonl(path, lambda r: r["step"] <= 2) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert filter_jsonl(tmp_path / "absent.jsonl", lambda r: True) == []
    assert not (tmp_path / "absent.jsonl").exists()


def test_write_text_atomic_syncs_then_renames(tmp_path, fsynced):
    path = write(tmp_path / "config.yaml", "old: 1\n")
    write_text_atomic(path, "new: 2\n")
    assert path.read_text() == "new: 2\n"
    assert len(fsynced) == 1 and fsynced[0].endswith(".config.yaml.tmp")
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


# ---- checkpoint folders ---------------------------------------------------------------------------------------------

def test_replace_dir_replaces_and_leaves_nothing_aside(tmp_path):
    src, dst = tmp_path / ".tmp_final", tmp_path / "final"
    for folder, text in ((src, "new"), (dst, "old"), (tmp_path / ".old_final", "stale")):
        folder.mkdir()
        (folder / "weights").write_text(text)
    replace_dir(src, dst)
    assert (dst / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_replace_dir_keeps_the_old_folder_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    """A failure between the two renames must leave the old checkpoint on disk (aside), never delete it first."""
    src, dst = tmp_path / ".tmp_final", tmp_path / "final"
    for folder, text in ((src, "new"), (dst, "old")):
        folder.mkdir()
        (folder / "weights").write_text(text)
    real = os.replace

    def fail_moving_in(a, b):
        if Path(a) == src:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(rundir.os, "replace", fail_moving_in)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(src, dst)
    kept = [p for p in tmp_path.iterdir() if (p / "weights").exists() and (p / "weights").read_text() == "old"]
    assert kept, sorted(p.name for p in tmp_path.iterdir())


def test_list_checkpoints_counts_complete_visible_folders_by_step_then_name(tmp_path):
    for name, step in (("iter_000002", 2), ("final", 3), ("iter_000003", 3), ("iter_3", 3), ("b_3", 3),
                       ("iter_000001", 1), (".tmp_iter_000004", 4), (".old_iter_000001", 1), ("iter_000005", None)):
        make_checkpoint(tmp_path, name, step)
    bad = {"iter_000006": "{not json", "iter_000007": '{"step": "seven"}', "iter_000008": '{"other": 8}'}
    for name, text in bad.items():
        (make_checkpoint(tmp_path, name, None) / "es_state.json").write_text(text)
    got = [(s, f.name) for s, f in list_checkpoints(tmp_path, "es_state.json")]
    assert got == [(1, "iter_000001"), (2, "iter_000002"), (3, "b_3"), (3, "final"), (3, "iter_000003"),
                   (3, "iter_3")]
    assert list_checkpoints(tmp_path / "nothing", "es_state.json") == []
    (make_checkpoint(tmp_path, "iter_000009", None) / "es_state.json").mkdir()  # there, but it cannot be read
    assert [(s, f.name) for s, f in list_checkpoints(tmp_path, "es_state.json")] == got



def test_list_checkpoints_skips_a_folder_it_may_not_enter(tmp_path, monkeypatch):
    """Python 3.11's Path.exists raises PermissionError inside a folder without the execute bit (root, who runs
    these tests, enters any folder, so the file system's refusal is played by Path itself)."""
    make_checkpoint(tmp_path, "iter_000001", 1)
    shut = make_checkpoint(tmp_path, "iter_000002", 2)

    def refuse(method):
        def call(self, *args, **kwargs):
            if self.parent == shut:
                raise PermissionError(13, "Permission denied", str(self))
            return method(self, *args, **kwargs)
        return call

    for name in ("exists", "is_file", "read_text", "stat"):
        monkeypatch.setattr(Path, name, refuse(getattr(Path, name)))
    assert [(s, f.name) for s, f in list_checkpoints(tmp_path, "es_state.json")] == [(1, "iter_000001")]


class _FullDiskFile:
    """A lock file on a full disk: writing the pid fails at flush, and so does the flush of close()."""

    def __init__(self, real):
        self.real, self.closes = real, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def flush(self):
        import errno

        raise OSError(errno.EFBIG, "File too large")

    def close(self):
        self.closes += 1
        self.real.close()
        self.flush()


def test_a_lock_whose_pid_cannot_be_written_reports_that_and_holds_nothing(tmp_path, monkeypatch):
    """close() flushes the unwritten pid again and fails too: that second error, raised inside the cleanup, hid the
    first behind "I/O operation on closed file" (from the release that followed) and left `fh` set, so
    `locked_run_folder` undid the folder's own config.yaml as if this invocation had written it."""
    from esft.run_undo import locked_run_folder

    opened = []
    monkeypatch.setattr(rundir, "open", lambda *a, **k: opened.append(_FullDiskFile(open(*a, **k))) or opened[-1],
                        raising=False)
    lock = RunLock(tmp_path)
    with pytest.raises(OSError, match="File too large"):
        lock.acquire()
    assert lock.fh is None and opened[0].closes == 1
    lock.release()  # nothing held: nothing to release, no error
    (tmp_path / "config.yaml").write_text("task: countdown\n")  # a run's, from before this invocation
    with pytest.raises(OSError, match="File too large"):
        with locked_run_folder(tmp_path):
            raise AssertionError("the folder was entered without its lock")
    assert (tmp_path / "config.yaml").read_text() == "task: countdown\n"


def test_a_folder_whose_contents_cannot_be_listed_is_not_undone(tmp_path, monkeypatch):
    """Until `record` has listed the folder, every file in it would read as this invocation's: none is removed."""
    from esft import run_undo

    (tmp_path / "config.yaml").write_text("task: countdown\n")

    def unreadable(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(run_undo.FolderChanges, "record", unreadable)
    with pytest.raises(PermissionError):
        with run_undo.locked_run_folder(tmp_path):
            raise AssertionError("entered without a record of the folder")
    assert (tmp_path / "config.yaml").read_text() == "task: countdown\n"


@pytest.mark.parametrize("failure", [OSError(37, "No locks available"), KeyboardInterrupt()])
def test_run_lock_that_cannot_be_taken_closes_its_file_and_says_why(tmp_path, monkeypatch, failure):
    """A file system without locks (flock's ENOLCK) or an interrupt is not "busy": its own error comes through,
    and the lock file is closed (the lock is free for the next attempt)."""
    taken = []

    def flock(fh, op):
        taken.append(fh)
        raise failure

    monkeypatch.setattr(rundir.fcntl, "flock", flock)
    lock = RunLock(tmp_path)
    with pytest.raises(type(failure)) as caught:
        lock.acquire()
    assert not isinstance(caught.value, RunDirBusy)
    assert taken and taken[0].closed and lock.fh is None


def test_prune_keeps_the_newest_numbered_checkpoints_and_final(tmp_path):
    for step in (1, 2, 3, 4):
        make_checkpoint(tmp_path, checkpoint_name(step), step)
    make_checkpoint(tmp_path, "final", 5)
    (tmp_path / "checkpoints" / ".old_iter_000009").mkdir()  # left by a process killed mid-delete
    assert prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 0) == []  # 0 keeps all
    assert len(list_checkpoints(tmp_path, "es_state.json")) == 5
    gone = prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 2)
    assert [p.name for p in gone] == ["iter_000001", "iter_000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["final", "iter_000003", "iter_000004"]
    assert prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 1) == [tmp_path / "checkpoints" /
                                                                                "iter_000003"]
    assert prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 5) == []
    assert [f.name for _, f in list_checkpoints(tmp_path, "es_state.json")] == ["iter_000004", "final"]


def test_prune_moves_a_folder_out_of_sight_before_deleting_it(tmp_path, monkeypatch):
    """Interrupted while deleting, pruning must not leave half a checkpoint that a resume would load."""
    for step in (1, 2):
        make_checkpoint(tmp_path, checkpoint_name(step), step)

    def interrupted(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 1)
    assert [f.name for _, f in list_checkpoints(tmp_path, "es_state.json")] == ["iter_000002"]


def test_demote_final_names_the_folder_after_its_step(tmp_path):
    final = make_checkpoint(tmp_path, "final", 12)
    moved = demote_final(final, 12)
    assert moved.name == "iter_000012" == checkpoint_name(12)
    assert (moved / "weights").read_text() == "final" and not final.exists()


@pytest.mark.parametrize("what", ["metrics", "seeds", "checkpoint", "nothing", "hidden-checkpoint"])
def test_holds_run_sees_any_record_or_checkpoint(tmp_path, what):
    if what in ("metrics", "seeds"):
        write(tmp_path / f"{what}.jsonl", '{"step": 1}\n')
    elif what == "checkpoint":
        (tmp_path / "checkpoints" / "final").mkdir(parents=True)
    elif what == "hidden-checkpoint":
        (tmp_path / "checkpoints" / ".tmp_iter_000001").mkdir(parents=True)  # a write that never finished
    assert holds_run(tmp_path) is (what in ("metrics", "seeds", "checkpoint"))


def test_lock_is_exclusive_and_probed_without_taking_it(tmp_path):
    assert not lock_held(tmp_path)
    with RunLock(tmp_path):
        assert lock_held(tmp_path)
        with pytest.raises(RunDirBusy):
            RunLock(tmp_path).acquire()
    assert not lock_held(tmp_path)


# ---- the ES seed log ----------------------------------------------------------------------------------------------

def test_check_noise_stream_refuses_a_log_of_another_stream(tmp_path):
    plain, marked = [{"iteration": 0}, {"iteration": 1}], [{"iteration": 0, "noise_stream": 2}]
    es_rundir.check_noise_stream(plain, 0, tmp_path)  # absent = stream 0
    es_rundir.check_noise_stream(marked, 2, tmp_path)
    es_rundir.check_noise_stream([], 3, tmp_path)
    for records, stream in ((plain, 1), (marked, 0), (marked, 3)):
        with pytest.raises(ValueError, match="noise_stream"):
            es_rundir.check_noise_stream(records, stream, tmp_path)


def test_seed_record_writes_the_stream_only_when_not_zero():
    from esft.es.noise import Update

    update = Update(seeds=(3, 4), coefficients=(0.5, -0.25), scale=0.1, kind="sgd")
    plain = es_rundir.seed_record(0, [1], [(3, 1), (4, -1)], [1.0, 0.0], [0.5, -0.5], update, 0.2)
    assert "noise_stream" not in plain
    assert es_rundir.seed_record(0, [1], [], [], [], update, 0.2, noise_stream=2)["noise_stream"] == 2
    assert es_rundir.update_from_record(plain) == update


@pytest.mark.parametrize("iterations", [[0, 2], [0, 0], [1]])
def test_a_seed_log_out_of_order_is_damage(tmp_path, iterations):
    write(tmp_path / "seeds.jsonl", "".join(json.dumps({"iteration": i}) + "\n" for i in iterations))
    with pytest.raises(CorruptLogError, match="out of order"):
        es_rundir.read_seed_log(tmp_path)


# ---- the checkpoint esft export picks -------------------------------------------------------------------------------

def model_folder(folder: Path, step_file: tuple[str, dict] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if step_file:
        (folder / step_file[0]).write_text(json.dumps(step_file[1]))
    return folder


def weights_file(path: Path) -> bytes:
    """A one-tensor safetensors file (export checks that the weights it copies open); returns its bytes."""
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(1)}, str(path))
    return path.read_bytes()


def test_export_prefers_final_then_the_highest_numbered_checkpoint(tmp_path):
    from esft.export import find_checkpoint

    root = tmp_path / "run" / "checkpoints"
    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-2"):
        model_folder(root / name)
    (root / "checkpoint-11").mkdir()  # no model in it (a TRL save that never finished)
    model_folder(root / ".old_checkpoint-12")
    assert find_checkpoint(tmp_path / "run") == root / "checkpoint-10"
    model_folder(root / "final")
    assert find_checkpoint(tmp_path / "run") == root / "final"
    assert find_checkpoint(root / "checkpoint-2") == root / "checkpoint-2"  # a model folder is its own checkpoint
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_checkpoint(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        find_checkpoint(tmp_path / "missing")


def test_checkpoint_step_and_run_dir_of_a_checkpoint(tmp_path):
    from esft.export import checkpoint_step, run_dir_of

    root = tmp_path / "run" / "checkpoints"
    es = model_folder(root / "final", ("es_state.json", {"step": 7}))
    grpo = model_folder(root / "checkpoint-3", ("trainer_state.json", {"global_step": 4}))
    named = model_folder(root / "iter_000005")
    assert [checkpoint_step(p) for p in (es, grpo, named, tmp_path)] == [7, 4, 5, None]
    assert run_dir_of(es) == tmp_path / "run" and run_dir_of(tmp_path / "model") == tmp_path / "model"


def test_export_copies_model_files_only(tmp_path):
    from esft.export import model_files

    folder = tmp_path / "final"
    folder.mkdir()
    names = ["config.json", "model.safetensors", "model-00001-of-00002.safetensors", "tokenizer_config.json",
             es_rundir.MASTERS_FILE, es_rundir.OPTIMIZER_FILE, es_rundir.STATE_FILE, "trainer_state.json",
             "rng_state.pth"]
    for name in names:
        (folder / name).write_text("x")
    assert [p.name for p in model_files(folder)] == ["config.json", "model-00001-of-00002.safetensors",
                                                     "model.safetensors", "tokenizer_config.json"]


# ---- ES checkpoint folders ------------------------------------------------------------------------------------------

@pytest.fixture()
def tiny():
    from es_tiny import tiny_llama
    from esft.es.noise import MasterWeights

    model = tiny_llama(hidden=16, layers=1)
    return model, MasterWeights(model)


def test_a_checkpoint_is_written_into_a_fresh_folder(tmp_path, tiny):
    """A `.tmp_*` folder left by a killed process is emptied first: none of its files reach the checkpoint."""
    model, weights = tiny
    stale = tmp_path / "checkpoints" / ".tmp_final"
    stale.mkdir(parents=True)
    (stale / "tokenizer_config.json").write_text("{}")  # another model's tokenizer (this one has none)
    folder = es_rundir.save_checkpoint(tmp_path, "final", 3, model, None, weights, extra={"seed_log_lines": 3})
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "es_state.json", "generation_config.json",
                                                        "model.safetensors"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["final"]
    assert json.loads((folder / es_rundir.STATE_FILE).read_text())["seed_log_lines"] == 3


def test_a_failed_checkpoint_write_leaves_no_folder(tmp_path, tiny, monkeypatch):
    model, weights = tiny

    def disk_full(folder, **kwargs):
        (Path(folder) / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 64)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model, "save_pretrained", disk_full)
    with pytest.raises(OSError):
        es_rundir.save_checkpoint(tmp_path, "iter_000001", 1, model, None, weights)
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.parametrize("damage", ["no-model", "truncated-model", "bad-state", "no-optimizer"])
def test_a_damaged_checkpoint_is_refused_before_the_model_is_touched(tmp_path, tiny, damage):
    import torch

    model, weights = tiny
    optimizer = torch.optim.Adam(list(weights.master.values()))
    folder = es_rundir.save_checkpoint(tmp_path, "final", 1, model, None, weights, optimizer)
    assert es_rundir.load_checkpoint(folder, model, weights, optimizer) == 1
    if damage == "no-optimizer":
        (folder / es_rundir.OPTIMIZER_FILE).unlink()
    elif damage == "no-model":
        (folder / "model.safetensors").unlink()
    elif damage == "truncated-model":
        (folder / "model.safetensors").write_bytes(b"truncated")
    else:
        (folder / es_rundir.STATE_FILE).write_text('{"step": ')
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    with pytest.raises(es_rundir.CheckpointDamaged, match="final"):
        es_rundir.load_checkpoint(folder, model, weights, optimizer)
    assert all(bool((p == 0.5).all()) for p in model.parameters())


def test_the_card_lists_only_evaluations_with_a_held_out_accuracy(tmp_path):
    """An ES run with eval_limit 0 logs evaluations of the train batch only: no held-out row to list."""
    from esft.export import held_out_results, model_card

    write(tmp_path / "metrics.jsonl", '{"kind": "eval", "step": 0, "train_reward": 0.5}\n'
                                      '{"kind": "train", "step": 1, "accuracy": 0.25}\n'
                                      '{"kind": "eval", "step": 1, "test_n": 4, "test_accuracy": 0.75, '
                                      '"test_ci95": [0.3, 0.95]}\n')
    results = held_out_results(tmp_path)
    assert results == [{"step": 1, "n": 4, "accuracy": 0.75, "ci95": [0.3, 0.95], "baseline": None,
                        "baseline_ci95": None, "answer": None}]
    assert "| 1 | 4 | 0.750 | [0.300, 0.950] |" in model_card(tmp_path, {"task": "t"}, results)


def test_a_failed_export_leaves_the_target_and_no_staging_folder(tmp_path, monkeypatch):
    import esft.export
    from esft.export import export_run

    checkpoint = model_folder(tmp_path / "run" / "checkpoints" / "final")
    weights_file(checkpoint / "model.safetensors")
    for name in ("tokenizer_config.json", "generation_config.json"):
        (checkpoint / name).write_text("{}")
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.safetensors").write_text("an earlier export")
    real = esft.export.shutil.copyfile

    def disk_full(src, dst):
        if Path(src).name == "model.safetensors":
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(esft.export.shutil, "copyfile", disk_full)
    with pytest.raises(OSError):
        export_run(tmp_path / "run", target, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]
    assert (target / "model.safetensors").read_text() == "an earlier export"


def test_the_card_names_an_earlier_checkpoint_only_inside_a_run(tmp_path):
    from esft.export import model_card

    inside = model_folder(tmp_path / "run" / "checkpoints" / "iter_000001")
    alone = model_folder(tmp_path / "my-model")
    assert "checkpoint `iter_000001`, step 1, not the run's final" in model_card(tmp_path / "run", {}, [], inside)
    assert "not the run's final" not in model_card(alone, {}, [], alone)


def test_an_export_interrupted_while_replacing_the_target_leaves_a_whole_one(tmp_path, monkeypatch):
    """--overwrite: the target is never half deleted. Interrupted while the earlier export is being deleted, the
    target folder holds one whole export (here the new one; the earlier one is put aside first)."""
    import shutil as shutil_module

    from esft.export import export_run

    checkpoint = model_folder(tmp_path / "run" / "checkpoints" / "final")
    new = weights_file(checkpoint / "model.safetensors")
    for name in ("tokenizer_config.json", "generation_config.json"):
        (checkpoint / name).write_text(json.dumps({"new": True}))
    target = tmp_path / "out"
    target.mkdir()
    for name in ("model.safetensors", "tokenizer_config.json", "generation_config.json"):
        (target / name).write_text("earlier")
    real = shutil_module.rmtree

    def interrupted(path, *args, **kwargs):
        if any(Path(path).glob("*.safetensors")):  # a deletion of a whole export: one file goes, then Ctrl-C
            next(Path(path).glob("*.safetensors")).unlink()
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shutil_module, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_run(tmp_path / "run", target, overwrite=True)
    assert (target / "model.safetensors").read_bytes() == new
    assert {p.name for p in target.iterdir()} >= {"model.safetensors", "tokenizer_config.json", "README.md"}
    monkeypatch.setattr(shutil_module, "rmtree", real)
    export_run(tmp_path / "run", target, overwrite=True)  # a later export clears what the interruption left aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


def test_prune_orders_checkpoints_by_step_number_not_name(tmp_path):
    """Step 10 is newer than step 9 whatever the names sort as ("iter_10" < "iter_9"; past six digits
    "iter_1000000" < "iter_999999")."""
    for name, step in (("iter_9", 9), ("iter_10", 10)):
        make_checkpoint(tmp_path, name, step)
    assert [p.name for p in prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 1)] == ["iter_9"]
    for step in (999_999, 1_000_000):
        make_checkpoint(tmp_path, checkpoint_name(step), step)
    gone = prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 1)
    assert [p.name for p in gone] == ["iter_10", "iter_999999"]
    assert [f.name for _, f in list_checkpoints(tmp_path, "es_state.json")] == ["iter_1000000"]


def test_prune_deletes_only_numbered_checkpoints_and_nothing_at_limit_zero(tmp_path):
    """A folder not named iter_* (final, a copy kept by hand) is never counted or deleted; limit 0 deletes
    nothing at all, not even a leftover of a killed delete."""
    for name, step in (("best", 1), ("iter_000002", 2), ("iter_000003", 3), ("final", 4)):
        make_checkpoint(tmp_path, name, step)
    (tmp_path / "checkpoints" / ".old_iter_000001").mkdir()
    assert prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 0) == []
    assert (tmp_path / "checkpoints" / ".old_iter_000001").exists()
    gone = prune_checkpoints(list_checkpoints(tmp_path, "es_state.json"), 1)
    assert [p.name for p in gone] == ["iter_000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "final", "iter_000003"]


def test_a_checkpoint_folder_moved_into_place_takes_the_umasks_modes(tmp_path):
    """safetensors writes the weights 0600: in a run folder shared with a group they were the one file that its
    other readers could not read, and an export gave them 0644."""
    src, dst = tmp_path / "tmp", tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "sub/x.json"):
        (src / name).write_text("w")
        os.chmod(src / name, 0o600)
    old = os.umask(0o027)
    try:
        replace_dir(src, dst)
    finally:
        os.umask(old)
    assert {p.name: p.stat().st_mode & 0o777 for p in dst.rglob("*") if p.is_file()} == {
        "model.safetensors": 0o640, "x.json": 0o640}


def test_a_checkpoint_with_fp32_masters_indexes_its_model_file_alone(tmp_path):
    """Loaders that take every `*.safetensors` of a folder unless an index names the files (vLLM's) must not read
    the fp32 masters as model weights: the index names model.safetensors alone, every tensor of it, and
    transformers still loads the folder to the same weights. An fp32 checkpoint has no masters and no index."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    from es_tiny import tiny_llama
    from esft.es.noise import MasterWeights

    model = tiny_llama(hidden=16, layers=1).to(torch.bfloat16)
    folder = es_rundir.save_checkpoint(tmp_path, "final", 1, model, None, MasterWeights(model))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        stored = set(fh.keys())
    assert set(index["weight_map"]) == stored and set(index["weight_map"].values()) == {"model.safetensors"}
    assert (folder / es_rundir.MASTERS_FILE).is_file()
    loaded = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16)
    assert all(torch.equal(p, loaded.state_dict()[n]) for n, p in model.state_dict().items())

    fp32 = tiny_llama(hidden=16, layers=1)
    plain = es_rundir.save_checkpoint(tmp_path / "fp32", "final", 1, fp32, None, MasterWeights(fp32))
    assert not (plain / "model.safetensors.index.json").exists()
