"""Contracts of esft.grpo.run and esft.grpo.trl_trainer that the end-to-end tests of tests/test_grpo.py leave open:
every esft option reaches TRL's GRPOConfig under its own name with its own value (not only where the paper preset
equals TRL's default), the reward TRL trains on is the task's (score + format_bonus * well_formed), the prompt
order of each epoch depends on (seed, epoch), the KL metric is the k3 estimator of KL(policy || reference) over
the loss mask, and the run options that only a non-default value shows (samples_per_iteration, eval budget, log_kl,
mask_truncated_completions, bf16 autocast of the rollouts, a bf16 model) reach the trainer.

Run: pytest -q tests/test_grpo_run_audit.py   (~25 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
import torch

pytest.importorskip("trl")

from conftest import make_tiny_model  # noqa: E402
from esft.grpo import GRPOConfig  # noqa: E402
from esft.grpo.grpo_config import to_trl_config  # noqa: E402
from esft.grpo.run import build_dataset, list_checkpoints, read_run_config, train_grpo  # noqa: E402
from esft.grpo.trl_trainer import EpochSeededRepeatSampler, masked_k3_kl  # noqa: E402
from esft.rundir import read_jsonl  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402

# every esft option TRL has, each away from both esft's and TRL's default, so a value taken from the wrong field
# (or a default left in place) shows
OPTIONS = dict(seed=7, max_steps=5, prompts_per_step=3, num_generations=4, per_device_train_batch_size=6,
               learning_rate=2e-5, optim="adamw_torch_fused", weight_decay=0.01, max_grad_norm=0.5,
               lr_scheduler_type="cosine", warmup_steps=2, epsilon=0.3, beta=0.04, loss_type="dapo",
               scale_rewards="batch", num_iterations=2, mask_truncated_completions=True, temperature=0.7, top_p=0.9,
               max_completion_length=33, save_steps=2)


def test_every_option_reaches_trl_under_its_own_name(tmp_path):
    config = GRPOConfig(**OPTIONS, device="cpu")
    args = to_trl_config(config, str(tmp_path), "bf16-autocast", progress=False)
    for name, value in OPTIONS.items():
        if name != "prompts_per_step":
            got = getattr(args, name)
            assert getattr(got, "value", got) == value, name  # optim and the schedule are transformers enums
    # one generation round of prompts_per_step * num_generations completions per optimizer step
    assert args.gradient_accumulation_steps == args.steps_per_generation == 3 * 4 // 6
    assert args.generation_batch_size == 12
    assert (args.bf16, args.fp16, args.use_cpu, args.disable_tqdm) == (True, False, True, True)
    assert (args.logging_steps, args.save_strategy, args.disable_dropout, args.remove_unused_columns) == (
        1, "steps", True, False)
    fp32 = to_trl_config(config.replace(save_steps=0), str(tmp_path), "fp32")
    assert (fp32.bf16, fp32.save_steps, fp32.disable_tqdm) == (False, 5, False)  # save_steps 0: the final one only


def test_epoch_order_depends_on_seed_and_epoch_only():
    """A resumed run re-creates the sampler and calls set_epoch(e): it must draw epoch e's order as the
    uninterrupted run did, while different epochs (and seeds) draw different orders."""
    data = list(range(40))

    def order(seed, epoch, warm=False):
        sampler = EpochSeededRepeatSampler(data, mini_repeat_count=2, batch_size=4, repeat_count=1, shuffle=True,
                                           seed=seed)
        if warm:  # an uninterrupted run: the earlier epochs were iterated first
            for e in range(epoch):
                sampler.set_epoch(e)
                list(sampler)
        sampler.set_epoch(epoch)
        return list(sampler)

    first = order(5, 0)
    assert sorted(first) == sorted(data * 2) and first[0] == first[1]  # each prompt twice in a row (its group)
    assert order(5, 1) == order(5, 1, warm=True) and order(5, 2) == order(5, 2, warm=True)
    assert order(5, 1) != first and order(5, 2) != order(5, 1)
    assert order(6, 0) != first
    unshuffled = EpochSeededRepeatSampler(data[:3], mini_repeat_count=2, batch_size=3, shuffle=False, seed=5)
    unshuffled.set_epoch(4)
    assert list(unshuffled) == [0, 0, 1, 1, 2, 2]


def test_the_kl_metric_is_k3_of_policy_to_reference_over_the_mask():
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -9.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    pairs = ((-1.5, -1.0), (-1.0, -2.0), (-0.5, -0.5), (-0.1, -0.3))  # (reference, policy) of the masked tokens
    expected = sum(math.exp(r - p) - (r - p) - 1 for r, p in pairs) / 4
    assert masked_k3_kl(logps, ref, mask) == pytest.approx(expected, rel=1e-6)
    # k3 is not symmetric: the reference and the policy may not trade places
    assert masked_k3_kl(ref, logps, mask) != pytest.approx(expected, rel=1e-3)
    assert masked_k3_kl(logps, ref, torch.zeros_like(mask)) == 0.0


def test_final_sorts_after_a_numbered_checkpoint_of_its_step(tmp_path):
    for name, step in (("final", 4), ("iter_000004", 4), ("iter_000002", 2)):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert [(s, p.name) for s, p in list_checkpoints(tmp_path)] == [
        (2, "iter_000002"), (4, "iter_000004"), (4, "final")]


def test_each_dataset_row_points_at_its_own_example():
    task = ParityTask(n=5)
    examples = task.load("train")
    rows = list(build_dataset(examples, task))
    assert [r["example_index"] for r in rows] == list(range(5))
    assert all(r["prompt"] == task.prompt(examples[r["example_index"]]) for r in rows)


def test_a_stale_trl_folder_is_removed_and_a_config_only_run_dir_is_checked(tmp_path):
    """A `checkpoint-N` folder left by a save killed before its move into checkpoints/ is deleted; a folder holding
    only config.yaml (a run that failed before its first step) resumes only with the same config."""
    from esft.grpo.run import _prepare_dir, _write_config

    out = tmp_path / "run"
    (out / "checkpoint-3").mkdir(parents=True)
    assert _prepare_dir(out, tiny_config(out)) == (None, 0)
    assert not (out / "checkpoint-3").exists() and (out / "samples").is_dir()
    _write_config(tiny_config(out), out / "config.yaml", False, {})
    with pytest.raises(ValueError, match="learning_rate"):
        _prepare_dir(out, tiny_config(out, learning_rate=0.5, resume=True))
    assert _prepare_dir(out, tiny_config(out, resume=True)) == (None, 0)


class AutocastSpy:
    """Wraps `model.generate`: whether each call ran under CPU autocast, and the rows it returned."""

    def __init__(self, model):
        self.original, self.autocast = model.generate, []
        model.generate = self

    def __call__(self, *args, **kwargs):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        return self.original(*args, **kwargs)


@pytest.fixture(scope="module")
def options_run(tmp_path_factory, tokenizer):
    """A 1-step run of a bf16 model under bf16 autocast with non-default options, then extended to 2 steps."""
    out = tmp_path_factory.mktemp("grpo-options") / "run"
    options = dict(max_steps=1, lr_scheduler_type="constant", precision="bf16-autocast", format_bonus=0.5,
                   samples_per_iteration=2, eval_every=1, eval_limit=2, eval_max_new_tokens=2, temperature=1.5,
                   mask_truncated_completions=True, max_completion_length=4, seed=11)
    model = make_tiny_model().to(torch.bfloat16)
    from transformers import TrainerCallback

    class Install(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.spy = AutocastSpy(model)

    install = Install()
    first = train_grpo(tiny_config(out, **options), model=model, tokenizer=tokenizer, task=ParityTask(),
                       callbacks=[install], progress=False)
    config_after_first = read_run_config(out)
    second = train_grpo(tiny_config(out, **{**options, "max_steps": 2, "resume": True}), model=make_tiny_model(),
                        tokenizer=tokenizer, task=ParityTask(), progress=False)
    return {"out": out, "first": first, "second": second, "spy": install.spy, "model": model,
            "config_after_first": config_after_first}


def test_the_reward_is_the_tasks_reward_with_the_format_bonus(options_run):
    out, task = options_run["out"], ParityTask()
    reward = task.reward_function(0.5)
    examples = task.load("train")
    rows = read_jsonl(out / "samples" / "iter_000000.jsonl")
    assert len(rows) == 2  # samples_per_iteration
    for row in rows:
        example = examples[row["index"]]
        assert row["score"] == task.score(row["completion"], example)
        assert row["well_formed"] == task.is_well_formed(row["completion"], example)
        assert row["reward"] == pytest.approx(row["score"] + 0.5 * row["well_formed"])
        assert row["reward"] == pytest.approx(reward([row["completion"]], examples=[example])[0])


def test_run_options_reach_the_trainer(options_run):
    out, first = options_run["out"], options_run["first"]
    trainer, rollout = first.trainer, first.trainer.last_rollout
    assert trainer._get_train_sampler().seed == 11
    train = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    # mask_truncated_completions: only completions that ended with eos are trained on
    assert train[0]["trained_completions"] == train[0]["finished"] < train[0]["completions"]
    assert train[0]["signal_completions"] == int((rollout["advantages"] != 0).sum())
    assert train[0]["forward_tokens"] == rollout["prompt_ids"].numel() + rollout["completion_ids"].numel()
    # step 1 samples from the initial model: the reference scores at the policy's temperature (1.5) too
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-3)
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert all(0 < e["test_tokens_generated"] <= 2 * e["test_n"] for e in evals)  # eval_max_new_tokens
    # fp32 master weights even for a bf16 model; the rollouts sampled under bf16 autocast
    assert all(p.dtype == torch.float32 for p in options_run["model"].parameters())
    config, info = options_run["config_after_first"]
    assert info["param_dtypes"] == {"float32": info["num_tensors"]} and info["kl_reference"] is True
    assert (info["precision"], info["autocast_dtype"]) == ("bf16-autocast", "bfloat16")
    assert (info["train_examples"], info["completions_per_step"]) == (6, 8)
    assert options_run["spy"].autocast and all(options_run["spy"].autocast)


def test_the_kl_reference_exists_only_for_log_kl_at_beta_zero(tmp_path, tokenizer):
    """log_kl=False keeps no frozen copy (and logs no KL); beta > 0 keeps none either, as TRL's loss has its
    own reference and logs the KL itself. The class-balanced option reaches the reward TRL calls."""
    def run(name, **options):
        config = tiny_config(tmp_path / name, max_steps=1, eval_every=0, **options)
        model = make_tiny_model()
        model.save_pretrained(tmp_path / "base")  # TRL loads its own reference (beta > 0) from the model's path
        model.config._name_or_path = str(tmp_path / "base")
        result = train_grpo(config, model=model, tokenizer=tokenizer, task=ParityTask(), progress=False)
        train = [r for r in read_jsonl(config.output_dir + "/metrics.jsonl") if r["kind"] == "train"]
        return result.trainer, read_run_config(config.output_dir)[1], train[0]

    trainer, info, record = run("no-kl", log_kl=False, class_balanced=True, scale_rewards="batch")
    assert trainer.kl_reference is None and info["kl_reference"] is False and record.get("kl") is None
    assert trainer.reward_funcs[0].class_balanced is True
    trainer, info, record = run("beta", beta=0.04)
    assert trainer.kl_reference is None and info["kl_reference"] is False
    assert record["kl"] is not None  # TRL's own measurement
    assert trainer.reward_funcs[0].class_balanced is False


@pytest.mark.parametrize("name", ["use_transformers_continuous_batching", "use_transformers_paged"])
def test_continuous_batching_under_bf16_is_refused_before_it_casts_the_masters(tmp_path, tokenizer, name):
    """TRL's continuous-batching generation casts the training model to bf16 under bf16 (pure-bf16 AdamW, while
    config.yaml says fp32 masters): refused before any step, the model left fp32 and the folder left empty; with
    fp32 precision the option reaches TRL."""
    from esft.config import ConfigError

    model = make_tiny_model()
    config = tiny_config(tmp_path / "run", max_steps=1, eval_every=0, precision="bf16-autocast",
                         trl_args={name: True})
    with pytest.raises(ConfigError, match="continuous batching"):
        train_grpo(config, model=model, tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    assert to_trl_config(config.replace(precision="fp32"), str(tmp_path), "fp32").use_transformers_continuous_batching


def test_a_task_string_is_checked_as_the_command_line_checks_it_before_the_model_loads(tmp_path, monkeypatch):
    """esft.train_grpo(config) from a script: the config's task string gets `check_task_fit` (here: class_balanced
    on an unlabelled task, which would weigh each gold answer as a class) before any model loads."""
    import esft.models
    from esft.api import train_grpo as api_train_grpo
    from esft.config import ConfigError

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the task was checked")

    monkeypatch.setattr(esft.models, "load_model", no_model)
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = GRPOConfig(task=f"{tmp_path / 'sums.jsonl'}:prompt_field=question,reward=math", max_steps=1,
                        prompts_per_step=2, class_balanced=True, scale_rewards="batch", device="cpu",
                        precision="fp32", output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="class_balanced"):
        api_train_grpo(config)


def test_an_extended_run_records_its_new_config_without_the_resume_flag(options_run):
    out = options_run["out"]
    assert options_run["second"].steps == 2
    config, info = read_run_config(out)
    assert config.max_steps == 2 and config.resume is False
    assert [(s, p.name) for s, p in list_checkpoints(out)] == [(1, "iter_000001"), (2, "final")]


def test_a_resume_from_step_0_does_not_evaluate_step_0_again(tmp_path, tokenizer):
    """A crash after step 1 with no checkpoint yet: the resume restarts from step 0, and the step-0 evaluation
    already in metrics.jsonl is not written a second time."""
    from transformers import TrainerCallback

    class CrashAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyError("simulated crash")  # not an interrupt: nothing is saved

    out = tmp_path / "run"
    options = dict(max_steps=2, save_steps=0, eval_every=2, eval_limit=2, max_completion_length=3)
    with pytest.raises(KeyError, match="simulated crash"):
        train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[CrashAfterFirstStep()], progress=False)
    assert list_checkpoints(out) == [] and [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0]
    train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    records = read_jsonl(out / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]


def test_a_failed_run_names_its_newest_checkpoint_to_continue_from(tmp_path, tokenizer):
    """With several checkpoints written, the full-disk and the Ctrl-C messages name the newest one's step (a
    Ctrl-C before the first step ends says that no step had finished)."""
    import errno

    from transformers import TrainerCallback

    from esft.rundir import RunInterrupted

    class FailAtStep(TrainerCallback):
        def __init__(self, error, step):
            self.error, self.step = error, step

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                raise self.error

    def run(name, error, step=2):
        config = tiny_config(tmp_path / name, max_steps=3, save_steps=1, eval_every=0, max_completion_length=3)
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[FailAtStep(error, step)], progress=False)

    with pytest.raises(OSError, match=r"at step 2: free disk space, then continue from step 2 with"):
        run("full", OSError(errno.ENOSPC, "No space left on device"))
    assert [s for s, _ in list_checkpoints(tmp_path / "full")] == [1, 2]
    with pytest.raises(RunInterrupted, match=r"^interrupted with 2 of 3 steps finished: step 2 is saved already; "
                                             r"continue from step 2 with"):
        run("ctrl-c", KeyboardInterrupt())
    with pytest.raises(RunInterrupted, match=r"^interrupted with 0 of 3 steps finished; continue from step 0 "):
        run("ctrl-c-first", KeyboardInterrupt(), step=0)


def test_an_interrupt_inside_a_generation_round_names_the_step_the_resume_takes(tmp_path, tokenizer):
    """num_iterations 2: step 3's checkpoint lies inside the round that began at step 2, whose completions TRL kept
    in memory only; `--resume` goes back to step 2 (resume_checkpoint), and the message names that step."""
    from transformers import TrainerCallback

    from esft.rundir import RunInterrupted

    class StopAtStep(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise KeyboardInterrupt

    config = tiny_config(tmp_path / "run", max_steps=5, save_steps=1, eval_every=0, max_completion_length=3,
                         num_iterations=2)
    with pytest.raises(RunInterrupted, match=r"^interrupted with 3 of 5 steps finished: step 3 is saved already; "
                                             r"continue from step 2 "):
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), callbacks=[StopAtStep()],
                   progress=False)
    assert [s for s, _ in list_checkpoints(tmp_path / "run")][-1] == 3


def test_each_completion_is_scored_against_its_own_example():
    """TRL passes the example_index column of each completion's row; the reward and the logged score and sample
    of each completion are those of that example (BoolQ: the same answer is right for one, wrong for the other)."""
    from esft.grpo.ledger import StepLedger
    from esft.grpo.trl_trainer import TaskReward
    from esft.tasks import get_task

    boolq = get_task("boolq")
    examples = [{"question": "q", "passage": "p", "answer": a} for a in (True, False)]
    ledger = StepLedger()
    reward = TaskReward(boolq, examples, 0.25, lambda: ledger, samples_per_iteration=3)
    completions = [[{"role": "assistant", "content": "\\boxed{yes}"}]] * 3
    assert reward(completions, example_index=[1, 0, 0]) == [0.25, 1.25, 1.25]
    assert ledger.scores == [0.0, 1.0, 1.0] and ledger.well_formed == [True] * 3
    assert [(s["index"], s["reward"], s["score"]) for s in ledger.samples] == [(1, 0.25, 0.0), (0, 1.25, 1.0),
                                                                                (0, 1.25, 1.0)]


def test_beta_above_zero_refuses_an_in_memory_model_before_training(tmp_path, tokenizer):
    """TRL reloads its reference from config._name_or_path when beta > 0: a model built in memory is refused with a
    message naming the fix, before any folder is written; the same model saved and named is accepted."""
    from esft.grpo.run import check_reference_source

    model = make_tiny_model()
    config = tiny_config(tmp_path / "run", max_steps=1, eval_every=0, beta=0.04)
    with pytest.raises(ValueError, match="save_pretrained"):
        train_grpo(config, model=model, tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    for name in ("", "plainword", str(tmp_path / "missing")):
        model.config._name_or_path = name
        with pytest.raises(ValueError, match="KL reference"):
            check_reference_source(model)
    model.save_pretrained(tmp_path / "base")
    for name in (str(tmp_path / "base"), "HuggingFaceTB/SmolLM2-135M-Instruct"):
        model.config._name_or_path = name
        check_reference_source(model)  # a folder or a hub id: TRL can load it


def test_a_resume_says_where_it_continues(tmp_path, tokenizer, capsys):
    """`esft train grpo --resume --output-dir D` started its bar at 2/3 with no word on what it had loaded: the
    first line names the step and the checkpoint (a final one by the name an extension gives it), or that there
    was none yet."""
    from transformers import TrainerCallback

    class CrashAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyError("simulated crash")

    out = tmp_path / "run"
    options = dict(max_steps=2, save_steps=0, eval_every=0, max_completion_length=3, lr_scheduler_type="constant")

    def go(progress=True, callbacks=(), **kw):
        train_grpo(tiny_config(out, **{**options, **kw}), model=make_tiny_model(), tokenizer=tokenizer,
                   task=ParityTask(), callbacks=list(callbacks), progress=progress)

    with pytest.raises(KeyError, match="simulated crash"):
        go(progress=False, callbacks=[CrashAfterFirstStep()])
    capsys.readouterr()
    go(resume=True)
    assert f"esft: resuming {out} at step 0 of 2 (no checkpoint yet: from the start)\n" in capsys.readouterr().err
    go(resume=True, max_steps=3)
    assert f"esft: resuming {out} at step 2 of 3 (checkpoint iter_000002)\n" in capsys.readouterr().err
    go(resume=True, max_steps=4, progress=False)
    assert "resuming" not in capsys.readouterr().err


def test_the_progress_bar_is_closed_before_a_stop_is_reported(tmp_path, tokenizer, monkeypatch):
    """After Ctrl-C the step bar was redrawn under the command line's "interrupted at step ..." line (an open bar
    draws itself again when it is collected): it is closed before the interrupt, or an error, leaves train_grpo."""
    import tqdm.auto
    from transformers import TrainerCallback

    from esft.rundir import RunInterrupted

    bars = []

    class Bar(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            bars.append(self)

        def close(self):
            self.closed = True
            super().close()

    class StopAtStep(TrainerCallback):
        def __init__(self, error):
            self.error = error

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                raise self.error

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    for name, error, expected in (("ctrl-c", KeyboardInterrupt(), RunInterrupted),
                                  ("error", KeyError("a bug"), KeyError)):
        bars.clear()
        with pytest.raises(expected):
            train_grpo(tiny_config(tmp_path / name, max_steps=3, save_steps=0, eval_every=0, max_completion_length=3),
                       model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                       callbacks=[StopAtStep(error)], progress=True)
        assert [(b.desc, b.closed) for b in bars] == [("GRPO", True)], name


def test_the_run_makes_its_device_current_before_trl_sets_up_accelerate(tmp_path, monkeypatch):
    # `--device cuda:1` reaches TRL only through the current CUDA device (accelerate places the model on a bare
    # "cuda"), so it must be made current before TRL's arguments exist
    import contextlib

    from esft import models
    from esft.grpo import run

    order: list[str] = []

    class Stop(Exception):
        pass

    def trl_args(*args, **kwargs):
        order.append("trl")
        raise Stop

    @contextlib.contextmanager
    def current(device):
        order.append(f"current {device}")
        try:
            yield
        finally:
            order.append("previous")

    monkeypatch.setattr(models, "current_device", current)
    monkeypatch.setattr(run, "to_trl_config", trl_args)
    with pytest.raises(Stop):
        train_grpo(tiny_config(tmp_path / "run"), task=ParityTask())
    assert order == ["current cpu", "trl", "previous"]


def test_an_extended_run_prints_no_notice_about_its_save_interval(tmp_path, tokenizer):
    """A run with save_steps 0 saves every max_steps, so extending it (`--resume --max-steps N`, as documented)
    changes the save interval TRL's trainer sees: transformers told the user `save_steps: 2 (from args) != 1 (from
    trainer_state.json)`, a value they never set, for a change esft allows (resumable_changes)."""
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    out = tmp_path / "run"
    options = dict(max_steps=1, save_steps=0, eval_every=0, max_completion_length=3, lr_scheduler_type="constant")
    train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
               progress=False)
    logger = logging.getLogger("transformers.trainer_utils")
    keep = Keep()
    logger.addHandler(keep)
    logger.warning_once.cache_clear()  # transformers prints each such notice once per process
    try:
        result = train_grpo(tiny_config(out, **{**options, "max_steps": 2}, resume=True), model=make_tiny_model(),
                            tokenizer=tokenizer, task=ParityTask(), progress=False)
        # other notices of that logger still reach the user, that one too where it names another mismatch
        logger.warning("a notice of another kind")
        from esft.grpo import run

        with run._without_resume_args_notice():
            logger.warning(run._RESUME_ARGS_NOTICE + ": \n\tsave_steps: 2 (from args) != 1 (from trainer_state.json)"
                           "\n\tper_device_train_batch_size: 4 (from args) != 8 (from trainer_state.json)")
            logger.warning(run._RESUME_ARGS_NOTICE + ": \n\tsave_steps: 2 (from args) != 1 (from trainer_state.json)")
    finally:
        logger.removeHandler(keep)
    assert result.steps == 2
    assert keep.messages[0] == "a notice of another kind"
    assert len(keep.messages) == 2 and keep.messages[1].endswith("per_device_train_batch_size: 4 (from args) != 8 "
                                                                 "(from trainer_state.json)")


def test_an_interrupt_between_an_update_and_its_records_counts_no_finished_step(tmp_path, tokenizer):
    """Ctrl-C after step 1's optimizer update but before its records are written: the trainer counts the step
    already, esft does not (a resume redoes it). The message said `interrupted at step 1: no step had finished`;
    it counts the finished steps, as the resume does."""
    from transformers import TrainerCallback

    from esft.rundir import RunInterrupted

    class StopAfterUpdate(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt

    out = tmp_path / "run"
    config = tiny_config(out, max_steps=3, save_steps=0, eval_every=0, max_completion_length=3)
    with pytest.raises(RunInterrupted, match=r"^interrupted with 0 of 3 steps finished; continue from step 0 with "
                                             r"`esft train grpo --resume --output-dir "):
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[StopAfterUpdate()], progress=False)
    assert list_checkpoints(out) == []


def test_an_interrupt_of_a_one_step_run_says_step(tmp_path, tokenizer):
    """The interrupt's count agrees in number: "0 of 1 step finished", not "0 of 1 steps"."""
    from transformers import TrainerCallback

    from esft.rundir import RunInterrupted

    class StopAfterUpdate(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt

    config = tiny_config(tmp_path / "run", max_steps=1, save_steps=0, eval_every=0, max_completion_length=3)
    with pytest.raises(RunInterrupted, match=r"^interrupted with 0 of 1 step finished; continue from step 0 "):
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[StopAfterUpdate()], progress=False)


def test_an_interrupt_while_a_resume_loads_its_checkpoint_counts_the_checkpoint_s_steps(tmp_path, tokenizer,
                                                                                     monkeypatch):
    """Ctrl-C before the first step began (transformers still loading the checkpoint, its step count not yet
    read) said "interrupted with 0 of 4 steps finished: step 2 is saved already; continue from step 2": the
    finished steps are those the resume continues from."""
    from transformers import Trainer

    from esft.rundir import RunInterrupted

    out = tmp_path / "run"
    options = dict(max_steps=2, save_steps=1, eval_every=0, max_completion_length=3, lr_scheduler_type="constant")
    train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
               progress=False)

    def interrupt(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_load_from_checkpoint", interrupt)
    with pytest.raises(RunInterrupted, match=r"^interrupted with 2 of 4 steps finished: step 2 is saved already; "
                                             r"continue from step 2 with "):
        train_grpo(tiny_config(out, resume=True, **{**options, "max_steps": 4}), model=make_tiny_model(),
                   tokenizer=tokenizer, task=ParityTask(), progress=False)


def test_resuming_a_finished_run_says_there_is_nothing_to_do(tmp_path, tokenizer, capsys):
    """`esft train grpo --resume` on a finished one-step run printed "already trained for 1 steps"."""
    out = tmp_path / "run"
    options = dict(max_steps=1, save_steps=0, eval_every=0, max_completion_length=3)
    train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
               progress=False)
    capsys.readouterr()
    result = train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
                        task=ParityTask())
    assert result.steps == 1
    assert capsys.readouterr().out == f"{out}: already trained for 1 step (max_steps 1); nothing to do\n"


def _interrupt_and_resume(out, tokenizer, options, stop):
    """A run stopped by `stop` (a callback raising KeyboardInterrupt), then resumed to its end."""
    from esft.rundir import RunInterrupted

    with pytest.raises(RunInterrupted) as raised:
        train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[stop], progress=False)
    train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    return str(raised.value)


def test_an_interrupt_after_the_next_round_was_generated_saves_the_finished_steps_token_count(tmp_path, tokenizer):
    """TRL adds a generation round's tokens to state.num_input_tokens_seen when it generates them: Ctrl-C during
    step 2's update saved step 1's checkpoint with step 2's tokens counted, and the resumed run logged num_tokens
    [270, 862, 1160] where the uninterrupted one logs [270, 566, 864]."""
    from transformers import TrainerCallback

    class StopInStep2(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 1:  # step 2's round is generated, its update not yet applied
                raise KeyboardInterrupt

    options = dict(max_steps=3, save_steps=0, eval_every=0, max_completion_length=3, lr_scheduler_type="constant")
    train_grpo(tiny_config(tmp_path / "whole", **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    message = _interrupt_and_resume(tmp_path / "stopped", tokenizer, options, StopInStep2())
    assert "saved " in message and "iter_000001" in message, message

    def tokens(run):
        return [r["trl"]["num_tokens"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]

    assert len(tokens(tmp_path / "whole")) == 3 and tokens(tmp_path / "whole")[0] > 0
    assert tokens(tmp_path / "stopped") == tokens(tmp_path / "whole")


def test_an_interrupt_inside_a_generation_round_saves_no_checkpoint_the_resume_would_refuse(tmp_path, tokenizer):
    """num_iterations 2: Ctrl-C after step 3 (inside the round generated at step 2) wrote iter_000003, which the
    resume then passed over ("training again from step 0") although the message said "saved ...", and the unusable
    checkpoint stayed beside the final one with save_steps 0. It is not written now, and the message says so; at a
    round's end (step 2) the interrupt checkpoint is written and the resume continues from it."""
    from transformers import TrainerCallback

    class StopInUpdate(TrainerCallback):
        def __init__(self, after):
            self.after = after

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == self.after:
                raise KeyboardInterrupt

    options = dict(max_steps=5, save_steps=0, eval_every=0, max_completion_length=3, num_iterations=2)
    inside = tmp_path / "inside"
    message = _interrupt_and_resume(inside, tokenizer, options, StopInUpdate(3))
    assert message.startswith("interrupted with 3 of 5 steps finished: step 3 lies inside a generation round of "
                              "num_iterations = 2 updates, not saved; continue from step 0 with "), message
    assert [folder.name for _, folder in list_checkpoints(inside)] == ["final"]
    at_end = tmp_path / "at_end"
    message = _interrupt_and_resume(at_end, tokenizer, options, StopInUpdate(2))
    assert message.startswith(f"interrupted with 2 of 5 steps finished: saved {at_end / 'checkpoints' / 'iter_000002'}"
                              "; continue from step 2 with "), message
    # the resume continued from it, and once the run had its final checkpoint it was deleted: save_steps 0 asks
    # for the final one only
    assert [folder.name for _, folder in list_checkpoints(at_end)] == ["final"]
    assert [r["step"] for r in read_jsonl(at_end / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("recorded, now, warns", [("bf16-autocast", "fp32", True), ("fp32", "bf16-autocast", True),
                                                  ("fp32", "fp32", False), (None, "fp32", False)])
def test_a_resume_in_another_precision_than_the_runs_warns(tmp_path, recorded, now, warns):
    """`precision: auto` is not a locked value's change: a GPU run (bf16 autocast) resumed on the CPU resolves to
    fp32 and its steps mix the two; the resume says so. The same precision, or a run without the record, is quiet."""
    import warnings

    from esft.grpo.run import warn_if_precision_changed

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"max_steps": 2, "_run": {"precision": recorded}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_precision_changed(tmp_path, now)
    said = [str(w.message) for w in caught]
    assert len(said) == int(warns)
    if warns:
        assert f"in {now} where its steps so far ran in {recorded}" in said[0]


def test_a_resume_says_when_it_computes_in_another_precision(tmp_path, tokenizer):
    """The resume of a run whose record says bf16 autocast (a GPU run) on a machine where it resolves to fp32
    warns, naming both; the steps it trains are counted on as usual."""
    out = tmp_path / "run"
    config = tiny_config(out, max_steps=1, lr_scheduler_type="constant", eval_every=0, save_steps=1)
    train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["_run"]["precision"] == "fp32"
    saved["_run"]["precision"] = "bf16-autocast"
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.warns(UserWarning, match="in fp32 where its steps so far ran in bf16-autocast"):
        result = train_grpo(config.replace(max_steps=2, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                            task=ParityTask(), progress=False)
    assert result.steps == 2


def test_the_beta_reference_of_a_bf16_es_checkpoint_is_its_fp32_masters(tmp_path, tokenizer):
    """beta > 0 after an ES stage of a bf16 model: TRL reloads the reference from the checkpoint's rounded model
    file, while the policy starts from the fp32 masters beside it; the reference must start there too, or the KL
    penalty would pull the policy towards the rounding from step 0."""
    from conftest import bf16_es_checkpoint

    folder = tmp_path / "es-checkpoint"
    exact = bf16_es_checkpoint(folder, tokenizer, make_tiny_model())  # masters below bf16's spacing
    config = tiny_config(tmp_path / "run", model=str(folder), max_steps=1, eval_every=0, beta=0.04)
    trainer = train_grpo(config, task=ParityTask(), progress=False).trainer
    reference = dict(trainer.ref_model.named_parameters())
    assert all(torch.equal(reference[n].detach().cpu(), exact[n]) for n in exact)
