"""trackio (`--report-to trackio`, local storage in TRACKIO_DIR): a run folder keeps the name of its trackio run,
so that a resume logs on in it, for ES and GRPO alike, in the project ES and GRPO share; and the run's name
(`run_name`) in trackio and wandb."""

from __future__ import annotations

import pytest

from conftest import make_tiny_model
from esft.cli import main
from esft.tracking import TRACKIO_NAME_FILE, trackio_run_name


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A trackio project of this test's own (TRACKIO_DIR is the test session's: tests/conftest.py)."""
    name = f"esft-{tmp_path.name}"
    monkeypatch.setenv("TRACKIO_PROJECT", name)
    yield name
    import trackio

    if trackio.context_vars.current_run.get() is not None:  # nothing open for the next test
        trackio.finish()


def _runs(project: str) -> dict[str, list[int]]:
    """Each trackio run of `project` (by id) -> its name and the steps of its logged train/fitness/mean (ES) or
    train/reward (GRPO: transformers logs the step as `train/global_step`, trackio's own step counts the logs)."""
    from trackio.sqlite_storage import SQLiteStorage

    out = {}
    for record in SQLiteStorage.get_run_records(project):
        logs = SQLiteStorage.get_logs(project=project, run=record["name"], run_id=record["id"])
        out[record["id"]] = (record["name"], [m.get("train/global_step", m["step"]) for m in logs
                                              if "train/fitness/mean" in m or "train/reward" in m])
    return out


@pytest.fixture()
def trackio_cli(es_cli):
    return lambda out, *extra: es_cli(out, "--report-to", "trackio", *extra)


def test_a_resumed_es_run_logs_on_in_its_trackio_run(tmp_path, project, trackio_cli):
    """A resume opened a second trackio run (same name, new id): the run's curves were split in two. Another
    folder of the same name gets a run of its own instead of resuming this one."""
    out, namesake = tmp_path / "run", tmp_path / "elsewhere" / "run"
    assert trackio_cli(out) == 0
    assert main(["train", "es", "--resume", str(out), "--iterations", "3"]) == 0
    assert trackio_cli(namesake) == 0
    runs = _runs(project)
    assert (out / TRACKIO_NAME_FILE).read_text().strip() == "run"
    other = (namesake / TRACKIO_NAME_FILE).read_text().strip()
    assert other.startswith("run-") and len(other) == len("run-") + 6
    assert sorted(runs.values()) == [("run", [1, 2, 3]), (other, [1, 2])]


def test_the_kept_trackio_name_wins(tmp_path, project):
    (tmp_path / TRACKIO_NAME_FILE).write_text("chosen\n")
    assert trackio_run_name(tmp_path, "other", "esft") == "chosen"
    fresh = tmp_path / "fresh"
    assert trackio_run_name(fresh, "fresh", project + "-none") == "fresh"  # a project trackio has not made yet
    assert (fresh / TRACKIO_NAME_FILE).read_text() == "fresh\n"


def test_a_resumed_grpo_run_logs_on_in_its_trackio_run_in_es_project(tmp_path, project, tokenizer):
    """GRPO's trackio run was transformers' own: project "huggingface", a random name, a new run on every resume.
    It is now named as an ES run's, in ES's project (TRACKIO_PROJECT), one run across the resume."""
    pytest.importorskip("trl")
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    out = tmp_path / "run"
    for steps, resume in ((2, False), (3, True)):
        train_grpo(tiny_config(out, max_steps=steps, report_to="trackio", eval_every=0, resume=resume,
                               lr_scheduler_type="constant"),
                   model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert list(_runs(project).values()) == [("run", [1, 2, 3])]
    assert (out / TRACKIO_NAME_FILE).read_text().strip() == "run"


def test_grpo_run_name_and_trl_args_project_name_the_trackio_run(tmp_path, project, tokenizer):
    pytest.importorskip("trl")
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=1, report_to="trackio", eval_every=0, run_name="named",
                           trl_args={"project": project + "-mine"}),
               model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert list(_runs(project + "-mine").values()) == [("named", [1])]
    assert (out / TRACKIO_NAME_FILE).read_text() == "named\n"


def test_es_run_name_names_the_trackio_run(tmp_path, project, trackio_cli):
    assert trackio_cli(tmp_path / "run", "--run-name", "exp/stage-1") == 0
    assert list(_runs(project).values()) == [("exp/stage-1", [1, 2])]


def test_esft_runs_default_to_the_esft_trackio_project(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from esft.grpo.callbacks import point_trackio
    from esft.tracking import trackio_project

    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    assert trackio_project() == "esft"
    args = SimpleNamespace(report_to=["tensorboard"], project="huggingface", run_name=None, trackio_space_id=None)
    point_trackio(args, tmp_path, {})
    assert (args.project, args.run_name) == ("huggingface", None)  # trackio not asked for: TRL's own values
    args.report_to = ["trackio"]
    point_trackio(args, tmp_path / "a-run", {})
    assert (args.project, args.run_name) == ("esft", "a-run")


def test_a_trackio_name_is_reserved_before_the_run_logs(tmp_path, project, monkeypatch):
    """trackio lists a run only once it has logged: a folder stopped before its first log, or two folders starting
    at once, left the name free for a namesake, whose resume would then log on in the other's run."""
    first = trackio_run_name(tmp_path / "a" / "run", "run", project)
    second = trackio_run_name(tmp_path / "b" / "run", "run", project)
    assert first == "run" and second.startswith("run-") and len(second) == len("run-") + 6
    (tmp_path / "a" / "run" / TRACKIO_NAME_FILE).unlink()  # a failed first attempt's is undone: the same name again
    assert trackio_run_name(tmp_path / "a" / "run", "run", project) == "run"
    assert trackio_run_name(tmp_path / "c", "c", project, remote=True).startswith("c-")  # remote runs: not listed
    from esft.tracking import trackio_remote

    monkeypatch.delenv("TRACKIO_SERVER_URL", raising=False)
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    assert not trackio_remote()
    monkeypatch.setenv("TRACKIO_SPACE_ID", "me/space")
    assert trackio_remote()


@pytest.fixture()
def wandb_names(tmp_path, monkeypatch):
    """The names esft opens wandb runs with (offline; the real open_wandb, spied on)."""
    pytest.importorskip("wandb")
    import wandb

    import esft.tracking as tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    wandb.teardown()
    names, real = [], tracking.open_wandb

    def spy(run_dir, run_name, config=None):
        run = real(run_dir, run_name, config)
        names.append(run.name)
        return run

    monkeypatch.setattr(tracking, "open_wandb", spy)
    return names


def test_es_run_name_names_the_wandb_run(tmp_path, project, es_cli, wandb_names):
    assert es_cli(tmp_path / "run", "--report-to", "wandb", "--run-name", "exp/stage-1") == 0
    assert es_cli(tmp_path / "plain", "--report-to", "wandb") == 0
    assert wandb_names == ["exp/stage-1", "plain"]


def test_grpo_wandb_run_keeps_its_name_beside_a_suffixed_trackio_run(tmp_path, project, tokenizer, wandb_names):
    pytest.importorskip("trl")
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    trackio_run_name(tmp_path / "elsewhere" / "run", "run", project)  # another folder holds the name "run"
    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=1, report_to="wandb,trackio", eval_every=0),
               model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    kept = (out / TRACKIO_NAME_FILE).read_text().strip()
    assert kept.startswith("run-") and [name for name, _ in _runs(project).values()] == [kept]
    assert wandb_names == ["run"]


def test_trl_args_run_name_becomes_the_run_name():
    """TRL's own option named the run before esft had one: a config.yaml (or spec) giving it there still loads."""
    from esft.grpo.grpo_config import GRPOConfig

    config = GRPOConfig(trl_args={"run_name": "old", "top_k": 5})
    assert (config.run_name, config.trl_args) == ("old", {"top_k": 5})
    assert GRPOConfig(run_name="new", trl_args={"run_name": "old"}).run_name == "new"


def test_es_records_carry_grpos_trackio_axis(tmp_path, project, trackio_cli):
    """In trackio a GRPO record's x-axis is `train/global_step` (trackio's own step counts transformers' log calls);
    ES's records had no such key, so no one plot could set an ES run's curves beside a GRPO run's. Each ES record,
    train, evaluation or table, carries it, equal to its step."""
    from trackio.sqlite_storage import SQLiteStorage

    assert trackio_cli(tmp_path / "run") == 0
    (record,) = SQLiteStorage.get_run_records(project)
    logs = SQLiteStorage.get_logs(project=project, run=record["name"], run_id=record["id"])
    axis = [(m.get("train/global_step"), m["step"]) for m in logs]
    assert len(axis) == 10 and all(gs == step for gs, step in axis)  # 3 evaluations, 2 iterations, with tables
    assert [m["train/global_step"] for m in logs if "eval/test_accuracy" in m] == [0, 1, 2]


def test_a_grpo_trackio_run_holds_esfts_config_as_an_es_run_does(tmp_path, project, tokenizer):
    """GRPO's trackio config held only TRL's arguments and the model's config: not the task, precision or eval
    settings an ES run's holds; TRL's value stays where both name a key."""
    pytest.importorskip("trl")
    from trackio.sqlite_storage import SQLiteStorage

    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=1, report_to="trackio", eval_every=0, eval_limit=3),
               model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    (record,) = SQLiteStorage.get_run_records(project)
    config = SQLiteStorage.get_run_config(project, record["name"])
    assert config["eval_limit"] == 3 and "precision" in config and "format_bonus" in config
    assert config["report_to"] == ["trackio"] and config["max_steps"] == 1
