"""`--report-to` (esft.tracking): ES metrics reach TensorBoard event files (read back here), wandb offline, and GRPO
hands the value to TRL."""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny_model
from esft.cli import main
from esft.tracking import WANDB_ID_FILE, flatten, parse_report_to, table_markdown, wandb_run_id


def test_flatten_and_parse():
    rec = {"fitness": {"mean": 0.5, "std": 0.1}, "test_ci95": [0.2, 0.7], "zero_update": False, "kind": "train",
           "update_norm": 3.0, "nan": float("nan"), "answers": {"yes": 3}}
    assert flatten(rec, "train") == {"train/fitness/mean": 0.5, "train/fitness/std": 0.1,
                                     "train/test_ci95/low": 0.2, "train/test_ci95/high": 0.7,
                                     "train/update_norm": 3.0, "train/answers/yes": 3.0}
    assert parse_report_to("none") == [] and parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        parse_report_to("mlflow")
    assert table_markdown([{"a": 1, "b": "x|y"}]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"


def test_es_run_writes_tensorboard_scalars(tmp_path, es_cli):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert es_cli(out, "--report-to", "tensorboard") == 0
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/fitness/mean", "train/fitness/std", "train/update_norm", "train/tokens_generated",
                "train/time/total", "eval/train_reward", "eval/test_accuracy", "eval/test_ci95/low",
                "eval/test_ci95/high"):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("train/fitness/mean")] == [1, 2]
    assert [e.step for e in acc.Scalars("eval/test_accuracy")] == [0, 1, 2]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    norms = [r["update_norm"] for r in metrics if r["kind"] == "train"]
    assert [e.value for e in acc.Scalars("train/update_norm")] == pytest.approx(norms, rel=1e-6)
    # the sample completions of every iteration, as a Markdown table (TensorBoard's text plugin)
    samples = acc.Tensors("samples/text_summary")
    assert [e.step for e in samples] == [1, 2]
    header = b"| iteration | index | score | finished | completion_tokens | completion | member | seed | sign |"
    assert samples[0].tensor_proto.string_val[0].startswith(header)  # esft.sample_rows' fields, as GRPO's


def test_es_run_without_report_to_writes_no_events(tmp_path, es_cli):
    out = tmp_path / "run"
    assert es_cli(out) == 0
    assert not (out / "tensorboard").exists()


def test_wandb_offline(tmp_path, es_cli, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert es_cli(out, "--report-to", "wandb") == 0
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def _wandb_offline(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    import wandb

    wandb.teardown()  # wandb keeps the settings of its first run in a process: these tests set their own
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # nothing of the run may land in the working folder
    return cwd


def _offline_ids(run_dir) -> list[str]:
    """The run ids of a folder's offline wandb runs, oldest first, from each run's `run-<id>.wandb` file (a folder
    name may carry a suffix: two runs of one id in the same second)."""
    return [f.name[len("run-"):-len(".wandb")] for p in sorted((run_dir / "wandb").glob("offline-run-*"))
            for f in p.glob("run-*.wandb")]


def test_a_resumed_es_run_logs_on_in_its_wandb_run(tmp_path, es_cli, monkeypatch):
    """A resume opened a second wandb run: the run's curves were split in two. The folder keeps its wandb id, and
    the resume opens the run with it (wandb's resume="allow"); another folder gets another run."""
    cwd = _wandb_offline(monkeypatch, tmp_path)
    out, other = tmp_path / "run", tmp_path / "other"
    assert es_cli(out, "--report-to", "wandb") == 0
    assert main(["train", "es", "--resume", str(out), "--iterations", "3"]) == 0
    assert es_cli(other, "--report-to", "wandb") == 0
    kept = (out / WANDB_ID_FILE).read_text().strip()
    assert _offline_ids(out) == [kept, kept]
    assert _offline_ids(other) == [(other / WANDB_ID_FILE).read_text().strip()] != [kept]
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_wandb_online_without_an_account_fails_before_the_model_loads(tmp_path, monkeypatch, capsys, algorithm,
                                                                      request):
    """`--report-to wandb` with no API key failed at `wandb.init`, after the model had loaded (and, in an
    experiment, after the base model's evaluations)."""
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_ID", "NETRC", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings of this machine's user
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("esft.models.load_model", load_model)
    import wandb

    wandb.teardown()  # the settings an earlier offline run of this process left behind
    request.addfinalizer(wandb.teardown)  # and this one's, for the tests after it
    out = tmp_path / "run"
    assert main(["train", algorithm, "--preset", "cpu", "--report-to", "wandb", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "report_to 'wandb': " in err and "WANDB_MODE=offline" in err, err
    assert not out.exists()


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_trackio_to_a_space_without_a_hugging_face_login_fails_before_the_model_loads(tmp_path, monkeypatch, capsys,
                                                                                     algorithm):
    """`--report-to trackio` with TRACKIO_SPACE_ID and no Hugging Face login failed at `trackio.init`
    (LocalTokenNotFoundError), after the model had loaded; the wandb account is asked for before it, and so is this
    login now. With a token, or without a Space, nothing is asked."""
    pytest.importorskip("trackio")
    import huggingface_hub.constants

    from esft.tracking import check_backends

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/esft-runs")

    def load_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("esft.models.load_model", load_model)
    out = tmp_path / "run"
    assert main(["train", algorithm, "--preset", "cpu", "--report-to", "trackio", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "report_to 'trackio': TRACKIO_SPACE_ID='someone/esft-runs' logs to a Hugging Face Space" in err, err
    assert not out.exists()
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert check_backends("trackio") == ["trackio"]
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("TRACKIO_SPACE_ID")
    assert check_backends("trackio") == ["trackio"]


@pytest.mark.parametrize("crash", [False, True])
def test_an_es_run_that_fails_is_marked_failed_in_wandb(tmp_path, es_cli, monkeypatch, crash):
    """wandb's run was finished as a success whatever ended the training (`finish()` without an exit code)."""
    _wandb_offline(monkeypatch, tmp_path)
    import esft.tracking as tracking
    from esft.es.trainer import ESTrainer

    ends = []
    finish = tracking.finish_wandb
    monkeypatch.setattr(tracking, "finish_wandb", lambda run, failed: (ends.append(failed), finish(run, failed)))
    if crash:
        def iteration(self):
            raise RuntimeError("simulated crash")

        monkeypatch.setattr(ESTrainer, "iteration", iteration)
    assert es_cli(tmp_path / "run", "--report-to", "wandb") == (1 if crash else 0)
    import wandb

    assert ends == [crash] and wandb.run is None


def test_a_sample_table_whose_examples_differ_from_row_to_row_reaches_wandb(tmp_path, monkeypatch):
    """wandb types each table column by its first row, down into nested values: an evaluation's rows whose
    `example` fields differ in presence or type (a data file with an optional field, a number answer beside a text
    one) made `wandb.Table` raise TypeError ("Data row contained incompatible types"), which ended the ES run at its
    evaluation (and a new run's step-0 evaluation removed its folder with it)."""
    _wandb_offline(monkeypatch, tmp_path)
    from esft.sample_rows import sample_row
    from esft.tracking import open_tracker

    rows = [sample_row({"index": 0}, score=0.0, well_formed=False, completion="no idea", details={"extracted": None},
                       example={"prompt": "Say 7.", "answer": 7}),
            sample_row({"index": 1}, score=1.0, well_formed=True, completion="\\boxed{seven}",
                       details={"extracted": "seven"}, example={"prompt": "Say seven.", "answer": "seven",
                                                                "hint": {"unit": None}})]
    tracker = open_tracker("wandb", tmp_path / "run", "run", {})
    try:
        tracker.log_table("eval_samples", rows, step=0)
    finally:
        tracker.close()
    assert _offline_ids(tmp_path / "run")


def test_a_wandb_run_the_caller_opened_is_logged_to_and_left_open(tmp_path, es_cli, monkeypatch):
    """A notebook's own run (its entity, tags, group) was finished by the ES run's `reinit="finish_previous"`, and
    the metrics went to a second run; transformers logs GRPO to an open run. ES now does the same."""
    _wandb_offline(monkeypatch, tmp_path)
    import wandb

    mine = wandb.init(project="mine", dir=str(tmp_path))
    try:
        assert es_cli(tmp_path / "run", "--report-to", "wandb") == 0
        assert wandb.run is mine and not (tmp_path / "run" / WANDB_ID_FILE).exists()
    finally:
        mine.finish()


def test_a_folder_keeps_its_wandb_id_and_wandbs_variable_names_only_a_new_one(tmp_path, monkeypatch):
    """WANDB_RUN_ID names the run of a folder that has none yet, and the folder keeps it: a resume without the
    variable, or with another value left in the shell, logs on in the folder's own run."""
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    first = wandb_run_id(tmp_path / "a")
    assert len(first) == 8 and first.isalnum() and wandb_run_id(tmp_path / "a") == first
    assert wandb_run_id(tmp_path / "b") != first
    monkeypatch.setenv("WANDB_RUN_ID", "mine1234")
    assert wandb_run_id(tmp_path / "a") == first  # kept
    assert wandb_run_id(tmp_path / "c") == "mine1234"
    monkeypatch.delenv("WANDB_RUN_ID")
    assert (tmp_path / "c" / WANDB_ID_FILE).read_text().strip() == wandb_run_id(tmp_path / "c") == "mine1234"


def test_a_grpo_run_opens_its_wandb_run_as_es_does(tmp_path, tokenizer, monkeypatch):
    """GRPO's wandb run was transformers' own: project "huggingface", files in the working folder's `./wandb`, a
    new run on every resume. It is now the run folder's, as an ES run's: `<run>/wandb`, one id across the resume."""
    pytest.importorskip("trl")
    cwd = _wandb_offline(monkeypatch, tmp_path)
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    out = tmp_path / "run"
    for steps, resume in ((2, False), (4, True)):
        train_grpo(tiny_config(out, max_steps=steps, report_to="wandb", eval_every=0, resume=resume,
                               lr_scheduler_type="constant"),
                   model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    kept = (out / WANDB_ID_FILE).read_text().strip()
    assert _offline_ids(out) == [kept, kept]
    import wandb

    assert wandb.run is None  # finished with the training
    assert list(cwd.iterdir()) == []


def test_grpo_passes_report_to_to_trl(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    from esft.grpo.grpo_config import GRPOConfig, to_trl_config

    cfg = GRPOConfig(output_dir=str(tmp_path), report_to="tensorboard", device="cpu")
    assert to_trl_config(cfg, str(tmp_path), "fp32", progress=False).report_to == ["tensorboard"]
    assert to_trl_config(cfg.replace(report_to="none"), str(tmp_path), "fp32", progress=False).report_to in ([], "none")


def test_grpo_run_writes_tensorboard_where_es_does_with_its_evaluations(tmp_path, tokenizer):
    """GRPO's event files go to `<run>/tensorboard` as ES's do (they went to transformers' dated
    `<run>/runs/<time>_<host>`), and its held-out evaluations reach them under ES's names (they reached only
    metrics.jsonl: no held-out accuracy to compare with an ES run in TensorBoard)."""
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=2, report_to="tensorboard", eval_every=1, eval_limit=2),
               model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert not (out / "runs").exists()
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/reward", "train/kl", "train/loss", "train/completions/mean_length", "eval/test_accuracy",
                "eval/test_ci95/low", "eval/test_ci95/high", "eval/test_format_rate"):
        assert tag in tags, tag
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    assert [e.step for e in acc.Scalars("eval/test_accuracy")] == [r["step"] for r in evals] == [0, 1, 2]
    assert [e.value for e in acc.Scalars("eval/test_accuracy")] == pytest.approx([r["test_accuracy"] for r in evals])


def test_missing_backend_fails_before_training(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    assert main(["train", "es", "--report-to", "trackio", "--output-dir", str(tmp_path)]) == 2
    assert "pip install 'esft[trackio]'" in capsys.readouterr().err


def test_an_experiment_with_a_tracker_not_installed_fails_at_its_line(monkeypatch):
    """An experiment whose option block asks for a tracker that is not installed ran its base-model evaluations
    (minutes) before its first training stage failed; the spec check names the line instead."""
    import importlib.util

    from esft.experiments.spec import SpecError, parse_spec
    from esft.experiments.yamlines import load

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    text = ("kind: single-task\ntasks: [countdown]\nalgorithms:\n  es: {preset: cpu, iterations: 2}\n"
            "  grpo: {preset: cpu, max_steps: 2, report_to: 'tensorboard,wandb'}\n")
    with pytest.raises(SpecError, match=r"spec.yaml:5: .*report_to 'wandb' needs the wandb package: pip install "
                                        r"'esft\[wandb\]'"):
        parse_spec(load(text), "spec.yaml")
    parse_spec(load(text.replace(",wandb", "")), "spec.yaml")


def test_trackio_local(tmp_path, es_cli, monkeypatch):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    monkeypatch.setenv("TRACKIO_PROJECT", f"esft-{tmp_path.name}")  # stored in the test session's TRACKIO_DIR
    assert es_cli(tmp_path / "run", "--report-to", "trackio") == 0
    assert trackio.context_vars.current_run.get() is None  # finished with the training
    metrics = SQLiteStorage.get_logs(project=f"esft-{tmp_path.name}", run="run")
    steps = [m["step"] for m in metrics if "train/fitness/mean" in m]
    assert steps == [1, 2]


# ---- audit: the Tracker and each backend with recording stand-ins (no tracker package, no network) -------------

def test_parse_report_to_normalises_and_deduplicates():
    assert parse_report_to(None) == [] and parse_report_to("") == [] and parse_report_to(" none ") == []
    assert parse_report_to("TensorBoard") == ["tensorboard"]
    assert parse_report_to("tensorboard,") == ["tensorboard"]  # a trailing comma names nothing
    assert parse_report_to("wandb,tensorboard,wandb") == ["wandb", "tensorboard"]  # each backend opened once
    assert parse_report_to(["none", "Trackio"]) == ["trackio"]


def test_flatten_without_prefix_and_what_is_not_an_interval():
    assert flatten({"a": 1, 3: 2.0, 2: {"b": 0.5}}) == {"a": 1.0, "3": 2.0, "2/b": 0.5}  # str keys, no leading /
    assert flatten({"three": [0.1, 0.2, 0.3], "flags": [True, False], "text": ["a", "b"], "s": "x"}) == {}
    assert flatten({"ci": (0.25, 0.75)}, "eval") == {"eval/ci/low": 0.25, "eval/ci/high": 0.75}


def test_flatten_keeps_only_finite_interval_ends():
    """Only finite numbers reach a tracker, inside an interval as outside it (a NaN scalar is left out)."""
    nan, inf = float("nan"), float("inf")
    assert flatten({"ci": [nan, 0.5], "x": nan}) == {"ci/high": 0.5}
    assert flatten({"ci": [0.1, inf]}) == {"ci/low": 0.1}


def test_table_markdown_joins_columns_of_all_rows_and_cuts_long_cells():
    assert table_markdown([]) == ""
    text = table_markdown([{"a": "x\ny"}, {"b": "z" * 5}], max_chars=4)
    assert text == "| a | b |\n|---|---|\n| x y |  |\n|  | zzzz... |"
    assert table_markdown([{"a": "abcd"}], max_chars=4) == "| a |\n|---|\n| abcd |"  # at the limit: whole


class RecordingBackend:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def log(self, scalars, step):
        self.calls.append((self.name, "log", dict(scalars), step))

    def log_table(self, name, rows, step):
        rows[0]["mutated"] = True  # a backend may change what it is given
        self.calls.append((self.name, "table", name, [dict(r) for r in rows], step))

    def close(self, failed=False):
        self.calls.append((self.name, "close") + (("failed",) if failed else ()))


def test_tracker_sends_exactly_the_scalars_with_their_step_and_closes_each_backend_once():
    from esft.tracking import Tracker

    calls = []
    tracker = Tracker([RecordingBackend(calls, "a"), RecordingBackend(calls, "b")])
    tracker.log({"fitness": {"mean": 0.5}, "kind": "train", "ok": True}, step=3, prefix="train")
    tracker.log({"kind": "eval", "note": "no numbers"}, step=4)  # nothing to send: no call
    rows = [{"score": 1.0}]
    tracker.log_table("samples", rows, step=5)
    tracker.log_table("samples", [], step=6)  # no rows: no table
    assert rows == [{"score": 1.0}]  # the caller's rows are not the backend's
    tracker.close()
    tracker.close()
    tracker.log({"x": 1.0}, step=7)  # after close: nowhere
    assert calls == [("a", "log", {"train/fitness/mean": 0.5}, 3), ("b", "log", {"train/fitness/mean": 0.5}, 3),
                     ("a", "table", "samples", [{"score": 1.0, "mutated": True}], 5),
                     ("b", "table", "samples", [{"score": 1.0, "mutated": True}], 5),
                     ("a", "close"), ("b", "close")]


class FailingClose(RecordingBackend):
    def close(self, failed=False):
        super().close(failed)
        raise OSError(f"{self.name}: disk full")


def test_tracker_close_closes_every_backend_when_one_fails_and_raises_the_first_failure():
    from esft.tracking import Tracker

    calls = []
    tracker = Tracker([FailingClose(calls, "a"), RecordingBackend(calls, "b"), FailingClose(calls, "c")])
    with pytest.raises(OSError, match="a: disk full"):
        tracker.close()
    assert calls == [("a", "close"), ("b", "close"), ("c", "close")]
    tracker.close()  # already closed: nothing is closed twice
    assert len(calls) == 3


def fake_module(monkeypatch, name, **attrs):
    import importlib.machinery
    import sys
    import types

    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # importlib.util.find_spec reads it
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_tensorboard_backend_writes_scalars_at_their_step_flushes_and_closes(tmp_path, monkeypatch):
    from esft.tracking import open_tracker

    calls = []

    class Writer:
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

        def add_text(self, tag, text, step):
            calls.append(("text", tag, text, step))

        def add_scalar(self, tag, value, step):
            calls.append(("scalar", tag, value, step))

        def flush(self):
            calls.append(("flush",))

        def close(self):
            calls.append(("close",))

    fake_module(monkeypatch, "torch.utils.tensorboard", SummaryWriter=Writer)
    tracker = open_tracker("tensorboard", tmp_path, "run", {"lr": 0.1})
    tracker.log({"a": 1.0, "ci": [0.2, 0.4]}, step=2, prefix="eval")
    tracker.log_table("samples", [{"x": 1}], step=2)
    tracker.close()
    assert calls == [("init", str(tmp_path / "tensorboard")), ("text", "config", "```\nlr: 0.1\n```", 0),
                     ("scalar", "eval/a", 1.0, 2), ("scalar", "eval/ci/low", 0.2, 2),
                     ("scalar", "eval/ci/high", 0.4, 2), ("flush",),
                     ("text", "samples", "| x |\n|---|\n| 1 |", 2), ("flush",), ("close",)]


def test_wandb_and_trackio_backends_log_at_the_step_and_finish(tmp_path, monkeypatch):
    from esft.tracking import open_tracker

    calls = []

    class Table:
        def __init__(self, columns, data, allow_mixed_types=False):  # wandb's takes it; trackio's ignores it
            self.columns, self.data = columns, data

        def __eq__(self, other):
            return (self.columns, self.data) == (other.columns, other.data)

    class Run:
        def define_metric(self, name, step_metric=None, step_sync=None):
            calls.append(("wandb.define_metric", name, step_metric))

        def log(self, data):  # no `step=`: wandb drops a step below its resumed counter
            calls.append(("wandb.log", data))

        def finish(self, exit_code):
            calls.append(("wandb.finish", exit_code))

    def wandb_init(**kw):
        calls.append(("wandb.init", kw["project"], kw["name"], kw["dir"], kw["config"], kw["resume"]))
        return Run()

    fake_module(monkeypatch, "wandb", init=wandb_init, Table=Table, login=lambda verify: False, run=None)
    class TrackioApi:
        def runs(self, project):
            raise ValueError(f"Project '{project}' does not exist")

    fake_module(monkeypatch, "trackio", Table=Table, Api=TrackioApi,
                init=lambda **kw: calls.append(("trackio.init", kw["project"], kw["name"], kw["config"],
                                                kw["resume"])),
                log=lambda data, step: calls.append(("trackio.log", data, step)),
                finish=lambda: calls.append(("trackio.finish",)))
    # the run-name reservation reads trackio.utils: faked too, so that the test passes alone (no earlier test having
    # imported the real one) and writes no reservation into the user's trackio folder
    fake_module(monkeypatch, "trackio.utils", TRACKIO_DIR=str(tmp_path / "trackio"))
    monkeypatch.setenv("WANDB_PROJECT", "wp")
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    tracker = open_tracker("wandb,trackio", tmp_path, "run", {"seed": 1})
    tracker.log({"a": 2}, step=9)
    tracker.log_table("t", [{"x": 1}, {"y": 2}], step=9)
    tracker.close()
    table = Table(["x", "y"], [[1, None], [None, 2]])
    assert calls == [("wandb.init", "wp", "run", str(tmp_path), {"seed": 1}, "allow"),
                     ("wandb.define_metric", "train/global_step", None),
                     ("wandb.define_metric", "*", "train/global_step"),
                     ("trackio.init", "esft", "run", {"seed": 1}, "allow"),
                     ("wandb.log", {"a": 2.0, "train/global_step": 9}),
                     ("trackio.log", {"a": 2.0, "train/global_step": 9}, 9),
                     ("wandb.log", {"t": table, "train/global_step": 9}),
                     ("trackio.log", {"t": table, "train/global_step": 9}, 9),
                     ("wandb.finish", 0), ("trackio.finish",)]


def test_report_to_as_a_list_as_trl_configs_write_it(tmp_path):
    """TRL's configs take `report_to: [tensorboard]`; a YAML config, the Python API and an experiment spec refused
    the list ("expected text"). It is stored as the comma text config.yaml records."""
    pytest.importorskip("tensorboard")
    from esft.config import build_config
    from esft.es import ESConfig
    from esft.experiments.spec import parse_spec
    from esft.experiments.yamlines import load
    from esft.grpo.grpo_config import GRPOConfig

    (tmp_path / "run.yaml").write_text("report_to: [tensorboard]\n")
    for cls in (ESConfig, GRPOConfig):
        assert build_config(cls, config_file=str(tmp_path / "run.yaml")).report_to == "tensorboard"
        assert cls(report_to=["tensorboard", "none"]).report_to == "tensorboard,none"
    spec = parse_spec(load("kind: single-task\ntasks: [countdown]\nalgorithms:\n"
                           "  es: {preset: cpu, iterations: 2, report_to: [tensorboard]}\n"), "spec.yaml")
    assert spec.methods[0].components[0].options["report_to"] == "tensorboard"


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_bare_folder_named_like_the_tracker_is_not_the_tracker(tmp_path, monkeypatch, capsys, algorithm):
    """wandb leaves a `./wandb` folder where it ran; with `python -m esft` (or in a notebook) the working folder is
    on sys.path and that folder imported as an empty namespace package. `--report-to wandb` without wandb installed
    then passed the up-front check, loaded the model and failed with a traceback at `wandb.init`."""
    import importlib.util
    from importlib.machinery import PathFinder

    (tmp_path / "cwd" / "wandb").mkdir(parents=True)
    # what Python finds for `wandb` where the bare folder is all there is (wandb itself may be installed here)
    bare = PathFinder.find_spec("wandb", [str(tmp_path / "cwd")])
    assert bare is not None and bare.origin in (None, "namespace")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: bare if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    assert main(["train", algorithm, "--report-to", "tensorboard,wandb", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "report_to 'wandb' needs the wandb package" in err and "pip install 'esft[wandb]'" in err, err
    assert str(tmp_path / "cwd" / "wandb") in err and not out.exists()


def test_grpo_logs_the_train_values_it_shares_with_es_under_es_names(tmp_path, es_cli, tokenizer):
    """Train accuracy, format rate, tokens, timings and memory are in both algorithms' metrics.jsonl under one name,
    and ES logged them to the trackers (`train/accuracy`, ...) while GRPO logged only TRL's own keys: one
    TensorBoard view could not set a GRPO run's train accuracy beside an ES run's."""
    pytest.importorskip("trl")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from esft.grpo import train_grpo
    from esft.tracking import flatten
    from grpo_tiny import ParityTask, tiny_config

    def tags(out):
        acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
        acc.Reload()
        return acc, set(acc.Tags()["scalars"])

    def train_records(out):
        return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]

    # `boxed` checks an answer format, so the ES run has a format rate to log (`exact` checks none)
    assert es_cli(tmp_path / "es", "--report-to", "tensorboard", "--reward", "boxed") == 0
    grpo = tmp_path / "grpo"
    train_grpo(tiny_config(grpo, max_steps=2, report_to="tensorboard", eval_every=0), model=make_tiny_model(),
               tokenizer=tokenizer, task=ParityTask(), progress=False)
    _, es_tags = tags(tmp_path / "es")
    acc, grpo_tags = tags(grpo)
    records = train_records(grpo)
    shared = set(flatten(train_records(tmp_path / "es")[0], "train")) & set(flatten(records[0], "train"))
    shared -= {"train/step", "train/iteration"}
    assert {"train/accuracy", "train/format_rate", "train/tokens_generated", "train/time/total"} <= shared
    assert shared <= es_tags and shared <= grpo_tags, shared - grpo_tags
    for tag in shared:
        key = tag.split("/")[1:]
        expected = [r[key[0]] if len(key) == 1 else r[key[0]][key[1]] for r in records]
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == [(1, pytest.approx(expected[0])),
                                                                 (2, pytest.approx(expected[1]))], tag
    for tag in ("train/loss", "train/kl", "train/reward"):  # TRL's keys, once per step (not again from the record)
        assert [e.step for e in acc.Scalars(tag)] == [1, 2], tag


def test_a_tracker_that_fails_to_open_closes_those_opened_before_it_and_the_es_executor(tmp_path, es_cli,
                                                                                          monkeypatch):
    """`--report-to tensorboard,wandb` where wandb.init fails (no API key, no network): the TensorBoard writer
    opened before it stayed open, and the ES run, which opened its tracker outside the block that closes the
    executor, left the executor's lanes (or Ray workers) running."""
    from esft.es.executor import LocalExecutor

    calls = []

    class Writer:
        def __init__(self, log_dir):
            calls.append("tensorboard.open")

        def add_text(self, *args):
            pass

        def close(self):
            calls.append("tensorboard.close")

    def wandb_init(**kw):
        raise RuntimeError("wandb: api_key not configured (no-tty)")

    fake_module(monkeypatch, "torch.utils.tensorboard", SummaryWriter=Writer)
    fake_module(monkeypatch, "wandb", init=wandb_init, login=lambda verify: False, run=None)
    close = LocalExecutor.close

    def recording_close(self):
        calls.append("executor.close")
        close(self)

    monkeypatch.setattr(LocalExecutor, "close", recording_close)
    from esft.tracking import open_tracker

    with pytest.raises(RuntimeError, match="api_key not configured"):
        open_tracker("tensorboard,wandb", tmp_path, "run", {})
    assert calls == ["tensorboard.open", "tensorboard.close"]
    calls.clear()
    assert es_cli(tmp_path / "run", "--report-to", "tensorboard,wandb") == 1
    assert calls == ["tensorboard.open", "tensorboard.close", "executor.close"]


def test_an_evaluation_redone_on_resume_logs_its_sample_table_once(tmp_path, es_cli, monkeypatch):
    """ES logged an evaluation's sample table before the evaluation's record reached metrics.jsonl: a run that
    stopped in between redid the evaluation on resume and TensorBoard held the step's table twice."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import esft.es.trainer as trainer
    from esft.es import es_rundir

    append = es_rundir.append_jsonl
    failed = []

    def failing_once(path, record, *args, **kwargs):
        if record.get("kind") == "eval" and record.get("step") == 1 and not failed:
            failed.append(True)
            raise RuntimeError("simulated crash")
        return append(path, record, *args, **kwargs)

    monkeypatch.setattr(trainer.es_rundir, "append_jsonl", failing_once)
    out = tmp_path / "run"
    assert es_cli(out, "--report-to", "tensorboard") == 1 and failed
    assert main(["train", "es", "--resume", str(out)]) == 0
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    # two event files written within one second of one process may be read in either order: steps, not order
    assert sorted(e.step for e in acc.Tensors("eval_samples/text_summary")) == [0, 1, 2]
    assert sorted(e.step for e in acc.Scalars("eval/test_accuracy")) == [0, 1, 2]


def test_the_x_axis_and_a_constant_answer_are_not_logged_as_scalars():
    """Countdown's constant answer (55) showed as a curve `eval/test_constant_answer` beside the accuracies, and
    `train/step` as a line of the step against itself."""
    rec = {"kind": "eval", "step": 3, "iteration": 3, "test_accuracy": 0.5, "test_constant_answer": 55,
           "test_constant_baseline": 0.02}
    assert flatten(rec, "eval") == {"eval/test_accuracy": 0.5, "eval/test_constant_baseline": 0.02}
    # a nested `step` is a measurement (GRPO's peak RSS after the step), not the x axis
    assert flatten({"step": 4, "peak_rss_mb_after": {"setup": 1.0, "step": 3.0}}, "train") == {
        "train/peak_rss_mb_after/setup": 1.0, "train/peak_rss_mb_after/step": 3.0}


def test_table_markdown_cuts_cells_past_300_characters():
    """TensorBoard's text tables keep a cell of up to 300 characters whole and cut a longer one there."""
    kept, long = "a" * 300, "b" * 301
    assert table_markdown([{"x": kept}]).splitlines()[-1] == f"| {kept} |"
    assert table_markdown([{"x": long}]).splitlines()[-1] == f"| {'b' * 300}... |"


def test_a_wandb_finish_error_is_raised_after_a_normal_end_and_only_warned_after_a_failure(capsys):
    """After a failed training the training's error is the one to report: the run's own finish error is a
    warning then; after a normal end it is the error. The exit code marks the run failed or not."""
    from esft.tracking import finish_wandb

    class Run:
        def __init__(self):
            self.exit_codes = []

        def finish(self, exit_code):
            self.exit_codes.append(exit_code)
            raise RuntimeError("upload failed")

    run = Run()
    with pytest.raises(RuntimeError, match="upload failed"):
        finish_wandb(run, failed=False)
    finish_wandb(run, failed=True)
    assert run.exit_codes == [0, 1]
    assert "did not finish cleanly: RuntimeError: upload failed" in capsys.readouterr().err


def test_a_resumed_run_writes_its_tensorboard_config_once(tmp_path):
    """Each resume wrote the config text again at step 0, beside the first run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from esft.tracking import open_tracker

    for lr in (0.1, 0.1):
        tracker = open_tracker("tensorboard", tmp_path, "run", {"lr": lr})
        tracker.log({"a": lr}, step=1)
        tracker.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert len(acc.Tensors("config/text_summary")) == 1
