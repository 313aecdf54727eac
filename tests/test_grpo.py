"""GRPO on TRL end to end on a tiny random Llama (real SmolLM2 tokenizer: pad == eos) with a toy task: training
changes the weights, drift.jsonl matches the saved checkpoints, accounting matches what `generate` produced, eos
tokens stay in the masks, KL is tracked at beta = 0, resume continues the step count and LR schedule (and, across
an epoch boundary, ends bit-identical to the uninterrupted run); plus the presets, the TRL mapping and the CLI.

Run: . .venv/bin/activate && pytest -q tests/test_grpo.py   (~30 s on 2 CPU cores; needs `pip install -e .[test]`)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from conftest import make_tiny_model  # noqa: E402
from esft.grpo import PRESETS, GRPOConfig, preset  # noqa: E402
from esft.grpo.drift_log import snapshot, squared_drift  # noqa: E402
from esft.grpo.grpo_config import to_trl_config  # noqa: E402
from esft.grpo.run import list_checkpoints, read_run_config, train_grpo  # noqa: E402
from esft.rundir import read_jsonl  # noqa: E402
from grpo_tiny import EOS, GenerateSpy, ParityTask, tiny_config  # noqa: E402


class SpyInstaller(TrainerCallback):
    """Installs a GenerateSpy on the policy once training starts (after the trainer copied its KL reference)."""

    def __init__(self):
        self.spy: GenerateSpy | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.spy = GenerateSpy(model, {EOS})


class Crash(Exception):
    pass


class CrashAt(TrainerCallback):
    """Simulates a crash after optimizer step `step` (its drift line is written, its metrics line is not)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Crash(f"simulated crash at step {self.step}")


def _load_safetensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    """One 4-step run shared by the tests below (checkpoints at steps 2 and 4 = final)."""
    out = tmp_path_factory.mktemp("grpo") / "run"
    model = make_tiny_model()
    theta0 = snapshot(model)
    spy = SpyInstaller()
    result = train_grpo(tiny_config(out), model=model, tokenizer=tokenizer, task=ParityTask(),
                        callbacks=[spy], progress=False)
    return {"out": out, "model": model, "theta0": theta0, "result": result, "spy": spy.spy,
            "metrics": [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"],
            "drift": read_jsonl(out / "drift.jsonl")}


def test_run_directory_and_parameters_change(run):
    out, result = run["out"], run["result"]
    assert result.steps == 4 and result.final_checkpoint == out / "checkpoints" / "final"
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    assert (out / "checkpoints" / "iter_000002").is_dir()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "scheduler.pt"):
        assert (out / "checkpoints" / "final" / name).exists(), name
    assert not list(out.glob("checkpoint-*"))  # TRL's folders were moved into checkpoints/
    changed = [n for n, p in run["model"].named_parameters() if not torch.equal(p.detach(), run["theta0"][n])]
    assert len(changed) == len(run["theta0"])  # AdamW moves every tensor that gets a gradient
    saved = _load_safetensors(out / "checkpoints" / "final")
    assert not torch.equal(saved["model.embed_tokens.weight"], run["theta0"]["model.embed_tokens.weight"])
    config, info = read_run_config(out)
    assert config.max_steps == 4 and info["precision"] == "fp32" and info["master_dtype"] == "float32"
    assert info["param_dtypes"] == {"float32": len(run["theta0"])} and info["kl_reference"] is True
    assert (out / "samples" / "iter_000000.jsonl").exists() and (out / "samples" / "iter_000003.jsonl").exists()
    sample = read_jsonl(out / "samples" / "iter_000003.jsonl")[0]
    assert sample["iteration"] == 3 and {"index", "reward", "score", "well_formed", "completion"} <= set(sample)


def test_held_out_evaluation_records(run):
    """Greedy evaluation with esft's own scorer at step 0, every eval_every steps and at the end (ES keys)."""
    evals = [r for r in read_jsonl(run["out"] / "metrics.jsonl") if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2, 4]
    for e in evals:
        assert e["test_n"] == 3 and 0 <= e["test_accuracy"] <= 1 and len(e["test_ci95"]) == 2
        assert e["test_tokens_generated"] > 0 and e["peak_rss_mb"] > 0
        assert len(read_jsonl(run["out"] / "samples" / f"eval_{e['step']:06d}.jsonl")) == 3
        # the first 3 held-out examples are labelled even, odd, even: the constant answer "even" scores 2/3
        assert e["test_constant_baseline"] == 2 / 3 and e["test_constant_answer"] == "even"
    assert run["result"].last_eval["step"] == 4


def test_es_and_grpo_eval_records_have_the_same_keys(run, tmp_path):
    """One schema for both trainers' evaluation records (esft.rundir.EVAL_KEYS): GRPO's had a `test_summary` and
    no `train_*` keys, ES's no `test_summary`, and GRPO's accuracy among well-formed answers was None for every
    task but BoolQ. Checked against the eval samples both wrote."""
    from es_tiny import ToyTask, stub_generate, tiny_llama
    from esft.api import train_es
    from esft.es.es_config import ESConfig
    from esft.rundir import EVAL_KEYS, HELD_OUT_KEYS

    es = ESConfig(model="tiny", task="toy", population_size=2, sigma=0.05, alpha=0.02, batch_size=2, iterations=1,
                  max_new_tokens=2, seed=5, output_dir=str(tmp_path / "es"), eval_every=1, eval_limit=4)
    train_es(es, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate, progress=False)
    for out in (tmp_path / "es", run["out"]):
        for rec in (r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"):
            assert list(rec) == [*EVAL_KEYS[:5], *HELD_OUT_KEYS, *EVAL_KEYS[5:]]
            rows = read_jsonl(out / "samples" / f"eval_{rec['step']:06d}.jsonl")
            formed = [r["score"] for r in rows if r["well_formed"]]
            assert rec["test_format_rate"] == len(formed) / len(rows)
            assert rec["test_accuracy_among_well_formed"] == (sum(formed) / len(formed) if formed else None)
    grpo_eval = next(r for r in read_jsonl(run["out"] / "metrics.jsonl") if r["kind"] == "eval")
    assert grpo_eval["train_reward"] is None  # GRPO does not re-score a train batch when it evaluates


def test_drift_matches_saved_checkpoints(run):
    out, theta0 = run["out"], run["theta0"]
    assert [r["step"] for r in run["drift"]] == [1, 2, 3, 4]
    assert run["drift"][0]["num_params"] == sum(t.numel() for t in theta0.values())
    for step, folder in list_checkpoints(out):
        saved = _load_safetensors(folder)
        rec = run["drift"][step - 1]
        direct = {n: float(((saved[n].double() - theta0[n].double()) ** 2).sum()) for n in theta0}
        assert rec["total"] == pytest.approx(sum(direct.values()), rel=1e-12)
        for n, v in direct.items():
            assert rec["per_tensor"][n] == pytest.approx(v, rel=1e-12, abs=1e-30)
    # the same function on the live final weights gives the last record exactly
    total, _ = squared_drift(run["model"].named_parameters(), theta0)
    assert total == run["drift"][-1]["total"]
    assert [m["drift_total"] for m in run["metrics"]] == [r["total"] for r in run["drift"]]


def test_accounting_equals_what_was_generated(run):
    calls, metrics = run["spy"].calls, run["metrics"]
    assert len(calls) == 4 == len(metrics)  # one generation round per optimizer step
    for call, m in zip(calls, metrics):
        assert m["completions"] == call["rows"] == 8 and m["prompts"] == 2
        assert m["prompt_tokens"] == call["prompt_tokens"]
        assert m["tokens_generated"] == call["generated"]
        assert m["finished"] == call["finished"] and m["finished_rate"] == call["finished"] / 8
        # single update per batch, nothing masked: every generated token is trained on once
        assert m["trained_tokens"] == m["tokens_generated"] and m["trained_completions"] == 8
        assert m["reward"]["mean"] == pytest.approx(m["trl"]["reward"])
        assert set(m["time"]) >= {"generate", "score", "ref_logps", "drift", "train", "total"}
        assert m["peak_rss_mb"] > 0
    totals = metrics[-1]["totals"]
    assert totals["tokens_generated"] == sum(c["generated"] for c in calls)
    assert totals["prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
    assert totals["completions"] == 32 and totals["prompts"] == 8


def test_eos_tokens_are_not_masked(run, tokenizer):
    """pad == eos: prompts contain eos (<|im_end|> closes each chat turn) and finished completions end with it;
    both must stay attended / in the loss mask."""
    from esft.generation import encode_prompts

    assert tokenizer.pad_token_id == tokenizer.eos_token_id == EOS
    task = ParityTask()
    encoded = {tuple(ids) for ids in encode_prompts(tokenizer, [task.prompt(ex) for ex in task.load("train")])}
    rollout = run["result"].trainer.last_rollout
    prompt_ids, prompt_mask = rollout["prompt_ids"], rollout["prompt_mask"]
    for ids, mask in zip(prompt_ids, prompt_mask):
        real = ids[mask.bool()]
        # exactly esft's own prompt tokens (same chat template, no double BOS), eos tokens of each turn included
        assert tuple(real.tolist()) in encoded
        assert (real == EOS).sum() >= 2  # system and user turns each end with eos ...
    # ... and left padding (also id 2) is the only masked part: the mask is a suffix of ones
    assert all(torch.equal(m, torch.sort(m)[0]) for m in prompt_mask)
    comp_ids, comp_mask = rollout["completion_ids"], rollout["completion_mask"]
    finished = 0
    for ids, mask in zip(comp_ids, comp_mask):
        n = int(mask.sum())
        if EOS in ids[:n].tolist():
            finished += 1
            assert ids[n - 1] == EOS  # the completion's eos is the last token in the loss mask
    assert finished > 0


def test_kl_tracked_at_beta_zero(run):
    kls = [m["kl"] for m in run["metrics"]]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # step 1 samples from the initial model itself
    assert all(k is not None and k > 0 for k in kls[1:])
    assert all(m["learning_rate"] is not None for m in run["metrics"])


def test_resume_continues_step_count_and_schedule(run, tmp_path, tokenizer):
    out = tmp_path / "interrupted"
    with pytest.raises(Crash):
        train_grpo(tiny_config(out), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[CrashAt(3)], progress=False)
    assert [r["step"] for r in read_jsonl(out / "drift.jsonl")] == [1, 2, 3]
    assert [s for s, _ in list_checkpoints(out)] == [2]
    with pytest.raises(FileExistsError):  # never silently overwrite a run
        train_grpo(tiny_config(out), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   progress=False)
    with pytest.raises(ValueError, match="max_steps"):  # the LR schedule depends on it
        train_grpo(tiny_config(out, max_steps=6, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                   task=ParityTask(), progress=False)
    result = train_grpo(tiny_config(out, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                        task=ParityTask(), progress=False)
    assert result.steps == 4
    metrics = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [r["step"] for r in read_jsonl(out / "drift.jsonl")] == [1, 2, 3, 4]
    lr = [m["learning_rate"] for m in metrics]
    assert lr == pytest.approx([m["learning_rate"] for m in run["metrics"]])  # linear decay continues
    assert lr == pytest.approx([1e-3 * (1 - t / 4) for t in range(4)])
    assert metrics[-1]["totals"]["completions"] == 32  # totals carried across the restart
    state = json.loads((out / "checkpoints" / "final" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # theta_0 after resume is still the base model: drift at step 4 matches the final checkpoint
    saved = _load_safetensors(out / "checkpoints" / "final")
    base = snapshot(make_tiny_model())
    direct = sum(float(((saved[n].double() - base[n].double()) ** 2).sum()) for n in base)
    assert read_jsonl(out / "drift.jsonl")[-1]["total"] == pytest.approx(direct, rel=1e-12)
    # same prompts, samples and updates as the uninterrupted run, across the epoch boundary at step 3
    assert [m["reward"] for m in metrics] == [m["reward"] for m in run["metrics"]]
    reference = _load_safetensors(run["out"] / "checkpoints" / "final")
    assert all(torch.equal(saved[k], reference[k]) for k in reference)
    # a finished run resumes to a no-op
    again = train_grpo(tiny_config(out, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                       task=ParityTask(), progress=False)
    assert again.steps == 4 and len(read_jsonl(out / "metrics.jsonl")) == 4 + 3  # 4 train + 3 eval records
    evals = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals == [0, 2, 4]  # step 0 and 2 evaluated before the crash are not repeated


class _LogRecords(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_folder_holding_an_es_run_names_the_es_resume(tmp_path, tokenizer):
    """A new GRPO run in an ES run's folder is refused with ES's resume command: `--resume` of GRPO, which the
    message used to suggest, refuses an ES run in turn."""
    out = tmp_path / "es-run"
    out.mkdir()
    (out / "config.yaml").write_text("task: parity\npopulation_size: 4\niterations: 2\n")
    (out / "metrics.jsonl").write_text('{"kind":"train","step":1}\n')
    with pytest.raises(FileExistsError, match=re.escape(
            f"{out} already holds an ES run (continue it with `esft train es --resume {out}`): choose a new "
            "output_dir for this GRPO run")):
        train_grpo(tiny_config(out), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)


class InterruptAt(TrainerCallback):
    """Ctrl-C in step `step`, after its generation round and loss: just before its optimizer update, or (`updated`)
    just after it, while the step count still names the step before."""

    def __init__(self, step: int, updated: bool = False):
        self.step, self.updated = step, updated

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1 and not self.updated:
            raise KeyboardInterrupt

    def on_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1 and self.updated:
            raise KeyboardInterrupt


def test_an_interrupt_saves_the_last_finished_step(run, tmp_path, tokenizer, capfd):
    """Ctrl-C / SIGTERM between scheduled checkpoints (here only the final one is scheduled) writes the checkpoint
    of the last finished step; the resumed run then ends equal to the uninterrupted one (the same samples: the
    RNG states are those of the step's end, not of the interrupted generation round). Before, nothing was saved
    and a resume restarted from step 0, dropping the logged steps. The interrupt prints no transformers "Writing
    model shards" bar, and the resume no "missing keys" warning for the tied lm_head (the tiny model ties it)."""
    from esft.rundir import RunInterrupted

    out = tmp_path / "ctrl-c"
    # the one line `esft train grpo` prints: what was saved and how to continue
    with pytest.raises(RunInterrupted, match=r"^interrupted with 2 of 4 steps finished: saved .*iter_000002; "
                       r"continue from step 2 "
                       + re.escape(f"with `esft train grpo --resume --output-dir {out}`") + "$"):
        train_grpo(tiny_config(out, save_steps=0), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[InterruptAt(3)], progress=False)
    assert [(s, p.name) for s, p in list_checkpoints(out)] == [(2, "iter_000002")]
    assert "Writing model shards" not in capfd.readouterr().err
    warned = _LogRecords()
    logging.getLogger("transformers").addHandler(warned)  # transformers' loggers do not propagate to the root
    try:
        result = train_grpo(tiny_config(out, save_steps=0, resume=True), model=make_tiny_model(),
                            tokenizer=tokenizer, task=ParityTask(), progress=False)
    finally:
        logging.getLogger("transformers").removeHandler(warned)
    assert result.steps == 4
    assert not [m for m in warned.messages if "missing keys" in m]
    records = read_jsonl(out / "metrics.jsonl")
    metrics = [r for r in records if r["kind"] == "train"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 2, 4]
    assert [m["reward"] for m in metrics] == [m["reward"] for m in run["metrics"]]
    saved, reference = (_load_safetensors(d / "checkpoints" / "final") for d in (out, run["out"]))
    assert all(torch.equal(saved[k], reference[k]) for k in reference)
    # the interrupt's checkpoint has served its resume: the run ends with the checkpoints save_steps 0 asks for,
    # the final one only (it stayed, 1.5x the model's size in AdamW state included)
    assert [p.name for _, p in list_checkpoints(out)] == ["final"]
    # stopped inside an update, the weights are no step's: nothing is saved under step 2's name
    mid = tmp_path / "mid-update"
    with pytest.raises(KeyboardInterrupt):
        train_grpo(tiny_config(mid, save_steps=0, eval_every=0), model=make_tiny_model(), tokenizer=tokenizer,
                   task=ParityTask(), callbacks=[InterruptAt(3, updated=True)], progress=False)
    assert list_checkpoints(mid) == []


def test_a_nan_loss_stops_the_run_and_is_named(tmp_path, tokenizer, monkeypatch):
    """transformers replaces a NaN or infinite step loss by the mean of the logged ones unless
    `logging_nan_inf_filter` is off (its default is on): the log said 0.0 and only the gradient norm gave the
    step away. esft turns the filter off, so the refusal names the loss itself."""
    from esft.grpo.trl_trainer import EsftGRPOTrainer
    from esft.rundir import NonFiniteError

    real = EsftGRPOTrainer.compute_loss

    def nan_at_step_2(self, *args, **kwargs):
        loss = real(self, *args, **kwargs)
        return loss * float("nan") if self.state.global_step == 1 else loss

    monkeypatch.setattr(EsftGRPOTrainer, "compute_loss", nan_at_step_2)
    with pytest.raises(NonFiniteError, match=r"^step 2: non-finite \{'loss': nan"):
        train_grpo(tiny_config(tmp_path / "nan", eval_every=0), model=make_tiny_model(), tokenizer=tokenizer,
                   task=ParityTask(), progress=False)


def test_a_second_interrupt_while_the_step_is_saved_leaves_no_half_checkpoint(tmp_path, tokenizer, monkeypatch):
    """A second Ctrl-C while the first one's checkpoint was written left TRL's half-written `checkpoint-N` in the
    run folder and ended with a bare KeyboardInterrupt ("interrupted"), not the line that says how to go on."""
    from trl import GRPOTrainer

    from esft.rundir import RunInterrupted

    def cut_save(self, model, trial):
        half = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        half.mkdir(parents=True)
        (half / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(GRPOTrainer, "_save_checkpoint", cut_save)
    out = tmp_path / "twice"
    with pytest.raises(RunInterrupted, match=r"^interrupted with 2 of 4 steps finished: interrupted again while step 2 "
                       r"was saved, so it is not saved; continue from step 0 with"):
        train_grpo(tiny_config(out, save_steps=0, eval_every=0), model=make_tiny_model(), tokenizer=tokenizer,
                   task=ParityTask(), callbacks=[InterruptAt(3)], progress=False)
    assert list_checkpoints(out) == [] and not list(out.glob("checkpoint-*"))


def evaluation_cut_at(step: int, monkeypatch) -> list:
    """Ctrl-C once, while step `step`'s held-out evaluation generates; the list gets its output path when it came."""
    import esft.evaluation as E

    evaluate, cut = E.evaluate_task, []

    def interrupted(*args, output_path=None, **kwargs):
        if str(output_path).endswith(f"eval_{step:06d}.jsonl") and not cut:
            cut.append(output_path)
            raise KeyboardInterrupt
        return evaluate(*args, output_path=output_path, **kwargs)

    monkeypatch.setattr(E, "evaluate_task", interrupted)
    return cut


def test_an_interrupt_during_the_last_steps_evaluation_saves_final_and_the_resume_evaluates_it(
        run, tmp_path, tokenizer, monkeypatch):
    """Ctrl-C while the last step's held-out evaluation runs: `final` is saved, and the resume, with no step left to
    train, evaluates it (before, the run's last held-out result was lost for good)."""
    from esft.rundir import RunInterrupted

    cut = evaluation_cut_at(4, monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match=r"^interrupted with 4 of 4 steps finished: saved .*final; "):
        train_grpo(tiny_config(out, save_steps=0), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   progress=False)
    assert cut and [r["step"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"] == [0, 2]
    result = train_grpo(tiny_config(out, save_steps=0, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                        task=ParityTask(), progress=False)
    assert result.steps == 4
    evals = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"}
    reference = {r["step"]: r for r in read_jsonl(run["out"] / "metrics.jsonl") if r["kind"] == "eval"}
    assert sorted(evals) == [0, 2, 4] and evals[4]["test_accuracy"] == reference[4]["test_accuracy"]
    assert (out / "samples" / "eval_000004.jsonl").exists()


def test_an_interrupt_during_a_steps_evaluation_keeps_the_step_and_the_resume_evaluates_it(run, tmp_path, tokenizer,
                                                                                           monkeypatch):
    """Ctrl-C while step 2's held-out evaluation runs: step 2 is finished (its train record is written, the weights
    are its), so its checkpoint is saved; the resume evaluates step 2 first and ends equal to the uninterrupted run.
    Before, the interrupt saved nothing and the resume restarted from step 0."""
    from esft.rundir import RunInterrupted

    cut = evaluation_cut_at(2, monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match=r"^interrupted with 2 of 4 steps finished: saved .*iter_000002; "
                                             r"continue from step 2 "):
        train_grpo(tiny_config(out, save_steps=0), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   progress=False)
    assert cut and [(s, p.name) for s, p in list_checkpoints(out)] == [(2, "iter_000002")]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"] == [0]
    first = yaml.safe_load((out / "config.yaml").read_text())["_run"]
    train_grpo(tiny_config(out, save_steps=0, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    records = read_jsonl(out / "metrics.jsonl")
    evals = {r["step"]: r for r in records if r["kind"] == "eval"}
    reference = {r["step"]: r for r in read_jsonl(run["out"] / "metrics.jsonl") if r["kind"] == "eval"}
    assert sorted(evals) == [0, 2, 4] and all(evals[k]["test_accuracy"] == reference[k]["test_accuracy"] for k in evals)
    assert [r["reward"] for r in records if r["kind"] == "train"] == [m["reward"] for m in run["metrics"]]
    saved, final = (_load_safetensors(d / "checkpoints" / "final") for d in (out, run["out"]))
    assert all(torch.equal(saved[k], final[k]) for k in final)
    # config.yaml's `_run` is the resumed segment's; the first segment's is kept under `earlier`
    assert yaml.safe_load((out / "config.yaml").read_text())["_run"]["earlier"] == [first]


class DiskFullAt(TrainerCallback):
    """A full disk while step `step`'s checkpoint is saved (transformers' own save, after the step's update)."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            import errno

            raise OSError(errno.ENOSPC, "No space left on device", f"checkpoint-{self.step}/model.safetensors")


def test_a_full_disk_names_the_file_and_the_resume_command(tmp_path, tokenizer):
    """ENOSPC during a GRPO run: one line with the file, the step and how to continue (it had no resume hint)."""
    out = tmp_path / "full"
    with pytest.raises(OSError) as failed:
        train_grpo(tiny_config(out, eval_every=0), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[DiskFullAt(2)], progress=False)
    last = list_checkpoints(out)[-1][0] if list_checkpoints(out) else 0
    assert str(failed.value) == ("[Errno 28] No space left on device (checkpoint-2/model.safetensors) at step 2: "
                                 f"free disk space, then continue from step {last} with "
                                 f"`esft train grpo --resume --output-dir {out}`")


def test_presets_and_trl_mapping(tmp_path):
    paper = preset("paper", output_dir=str(tmp_path / "p"))
    assert (paper.num_generations, paper.prompts_per_step, paper.max_steps) == (8, 63, 80)
    assert (paper.learning_rate, paper.beta, paper.epsilon, paper.log_kl) == (3e-6, 0.0, 0.2, True)
    args = to_trl_config(paper, str(tmp_path / "p"), "fp32", progress=False)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 63 * 8
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one generation round per update
    assert args.generation_batch_size == 504 and args.num_generations == 8 and args.num_iterations == 1
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.warmup_steps) == (3e-6, 0.0, 1.0, 0)
    assert args.lr_scheduler_type == "linear" and args.optim == "adamw_torch"
    assert (args.temperature, args.top_p, args.max_completion_length) == (1.0, 0.95, 1024)
    assert (args.beta, args.epsilon, args.loss_type, args.scale_rewards) == (0.0, 0.2, "grpo", "group")
    assert args.bf16 is False and args.fp16 is False  # TRL would default bf16=True
    assert args.save_steps == 80 and args.logging_steps == 1
    cpu = preset("cpu")
    assert (cpu.task, cpu.max_passage_chars, cpu.format_bonus, cpu.max_completion_length) == ("boolq", 400, 0.1, 24)
    assert cpu.completions_per_step == 32 and set(PRESETS) == {"paper", "cpu", "cpu-countdown"}
    with pytest.raises(ValueError, match="multiple"):
        GRPOConfig(prompts_per_step=3, num_generations=2, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="may not"):
        to_trl_config(GRPOConfig(trl_args={"max_steps": 3}), str(tmp_path), "fp32")


def test_trl_args_are_checked_before_the_model_loads(tmp_path, monkeypatch):
    """trl_args may not override an option esft sets (config.yaml would record a seed or learning rate the run did
    not use), and a key TRL does not know, or use_vllm without vLLM, is one ConfigError before any model loads
    (TRL raised a TypeError / ImportError traceback after the model had loaded)."""
    import esft.models
    from esft.config import ConfigError
    from esft.grpo.grpo_config import ESFT_TRL_ARGS, trl_arguments

    # both names of the checkpointing switch are esft's (transformers 5.x renamed it); the run passes one
    assert set(trl_arguments(GRPOConfig(), str(tmp_path), "fp32")) | {"gradient_checkpointing",
                                                                        "activation_checkpointing"} == set(ESFT_TRL_ARGS)
    # no GPU here: pinned memory would serve nothing, and torch warns about it on every dataloader
    assert trl_arguments(GRPOConfig(), str(tmp_path), "fp32")["dataloader_pin_memory"] is False
    assert trl_arguments(GRPOConfig(device="cpu"), str(tmp_path), "fp32")["dataloader_pin_memory"] is False
    for managed in ({"seed": 7}, {"learning_rate": 1e-4}, {"logging_steps": 5}, {"bf16": True}):
        with pytest.raises(ConfigError, match="may not be overridden"):
            GRPOConfig(trl_args=managed)

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before trl_args were checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    with pytest.raises(ConfigError, match=r"\['bogus'\] are not"):
        train_grpo(tiny_config(tmp_path / "bogus", trl_args={"bogus": 1}), task=ParityTask(), progress=False)
    import importlib

    # as on a machine without vLLM (trl's lazy package does not expose the submodule as an attribute)
    monkeypatch.setattr(importlib.import_module("trl.import_utils"), "is_vllm_available", lambda: False)
    with pytest.raises(ConfigError, match="vLLM is installed"):
        train_grpo(tiny_config(tmp_path / "vllm", trl_args={"use_vllm": True}), task=ParityTask(), progress=False)


def test_cli_builds_grpo_config(tmp_path):
    from esft.cli import _explicit, build_parser
    from esft.config import build_config

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump({"preset": "cpu", "max_steps": 3, "trl_args": {"top_k": 5}}))
    args = build_parser().parse_args(["train", "grpo", "--config", str(run_yaml), "--learning-rate", "1e-5",
                                      "--output-dir", str(tmp_path / "o"), "--no-log-kl"])
    config = build_config(GRPOConfig, PRESETS, args.preset, args.config, _explicit(args, GRPOConfig))
    assert (config.max_steps, config.learning_rate, config.log_kl, config.task) == (3, 1e-5, False, "boolq")
    assert config.trl_args == {"top_k": 5} and config.output_dir == str(tmp_path / "o")
    with pytest.raises(SystemExit) as exit_info:  # every field's help text renders (argparse %-formats it)
        build_parser().parse_args(["train", "grpo", "--help"])
    assert exit_info.value.code == 0


def test_the_learning_curve_reads_a_grpo_run(run, monkeypatch):
    """esft.es.curve.plot_run (what esft.api writes at the end of every run) draws a GRPO run's reward per step,
    without pyplot (a notebook's backend and figures stay as they are)."""
    import sys

    from matplotlib.figure import Figure

    from esft.es.curve import plot_run

    drawn = []
    real = Figure.subplots

    def spy(self, *args, **kwargs):
        axes = real(self, *args, **kwargs)
        drawn.append(axes)
        return axes

    monkeypatch.setattr(Figure, "subplots", spy)
    had_pyplot = "matplotlib.pyplot" in sys.modules
    path = plot_run(run["out"], run["out"] / "grpo-curve.png")
    assert path.stat().st_size > 1000
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot
    train_axis = drawn[0][0]
    assert train_axis.get_xlabel() == "step (updates applied)"
    assert [line.get_label() for line in train_axis.get_lines()][0] == "reward mean"
    assert list(train_axis.get_lines()[0].get_ydata()) == [m["reward"]["mean"] for m in run["metrics"]]


def test_the_cli_draws_the_learning_curve(run, tmp_path, monkeypatch):
    """`esft train grpo` ends with the run's curve.png, as `esft train es` does and the README says of every run
    (the CLI called esft.grpo.train_grpo, which draws none)."""
    import shutil

    import esft.grpo.run
    from esft.cli import main
    from esft.grpo.run import GRPOTrainResult

    def trained(config, **kwargs):  # the run's files, without the minutes of training
        out = Path(config.output_dir)
        out.mkdir(parents=True, exist_ok=True)  # as train_grpo makes it (the CLI's checks create nothing)
        shutil.copy(run["out"] / "metrics.jsonl", out / "metrics.jsonl")
        return GRPOTrainResult(out, 4, None, None)

    monkeypatch.setattr(esft.grpo.run, "train_grpo", trained)
    out = tmp_path / "cli-run"
    assert main(["train", "grpo", "--output-dir", str(out), "--max-steps", "4"]) == 0
    assert (out / "curve.png").stat().st_size > 1000


def test_resume_reads_the_runs_own_config(run, monkeypatch, capsys):
    """`esft train grpo --resume --output-dir RUN` continues from the run's config.yaml without its flags again;
    a flag that changes the training (not a resumable one) is refused before any model loads."""
    import esft.models
    from esft.cli import main
    from esft.grpo.grpo_config import resume_config

    out = run["out"]
    saved, _ = read_run_config(out)
    config = resume_config(str(out), {"eval_every": 3, "resume": True, "output_dir": str(out)})
    assert config == dataclasses.replace(saved, eval_every=3, resume=True, output_dir=str(out))
    assert resume_config(str(out), {"learning_rate": saved.learning_rate}) == dataclasses.replace(
        saved, resume=True, output_dir=str(out))  # the original flags repeated unchanged are accepted

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    assert main(["train", "grpo", "--resume", "--output-dir", str(out), "--learning-rate", "0.5"]) == 2
    assert "cannot change ['learning_rate']" in capsys.readouterr().err


def _fail(*args, **kwargs):
    raise RuntimeError("a failure before training (model load, memory, Ctrl-C)")


def test_a_run_on_a_constant_schedule_is_extended(tmp_path, tokenizer, capsys):
    """Where the LR schedule does not depend on max_steps, `--resume` with a larger max_steps continues a
    finished run, and the result equals a run started with that max_steps (the same prompts, samples and
    updates; the same checkpoint folders). A linear schedule, or fewer steps than done, is refused."""
    from esft.cli import main
    from esft.grpo.grpo_config import resume_config

    def go(out, **kw):
        return train_grpo(tiny_config(out, lr_scheduler_type="constant", eval_every=0, **kw),
                          model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)

    whole, short = tmp_path / "whole", tmp_path / "short"
    go(whole, max_steps=4)
    go(short, max_steps=2)
    assert [s.name for _, s in list_checkpoints(short)] == ["final"]
    with pytest.raises(ValueError, match="trained for 2 steps already"):
        go(short, max_steps=1, resume=True)
    assert resume_config(str(short), {"max_steps": 4}).max_steps == 4  # the CLI's resume accepts it
    # an extension that fails before training leaves the finished run as it was (its final checkpoint, its config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("esft.grpo.run.format_bonus_warning", _fail)
        with pytest.raises(RuntimeError, match="before training"):
            go(short, max_steps=4, resume=True)
    assert [s.name for _, s in list_checkpoints(short)] == ["final"] and read_run_config(short)[0].max_steps == 2
    result = go(short, max_steps=4, resume=True)
    assert result.steps == 4
    assert [p.name for _, p in list_checkpoints(short)] == [p.name for _, p in list_checkpoints(whole)] \
        == ["iter_000002", "final"]
    train = {d: [r for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "train"] for d in (whole, short)}
    assert [m["step"] for m in train[short]] == [1, 2, 3, 4]
    assert [m["reward"] for m in train[short]] == [m["reward"] for m in train[whole]]
    assert [m["learning_rate"] for m in train[short]] == [1e-3] * 4
    assert read_run_config(short)[0].max_steps == 4
    saved, reference = (_load_safetensors(d / "checkpoints" / "final") for d in (short, whole))
    assert all(torch.equal(saved[k], reference[k]) for k in reference)

    linear = tmp_path / "linear"
    train_grpo(tiny_config(linear, max_steps=1, eval_every=0), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    with pytest.raises(ValueError, match="'linear' LR schedule"):
        resume_config(str(linear), {"max_steps": 2})
    assert main(["train", "grpo", "--resume", "--output-dir", str(linear), "--max-steps", "2"]) == 2
    assert "can be extended" in capsys.readouterr().err
    # its warmup is warmup_steps, a count of steps (transformers 5 has no warmup_ratio: check_trl_arg_names)
    from esft.grpo.grpo_config import resumable_changes

    assert "max_steps" in resumable_changes(GRPOConfig(lr_scheduler_type="constant_with_warmup"))


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path, tokenizer):
    out = tmp_path / "limited"
    train_grpo(tiny_config(out, save_steps=1, save_total_limit=1, eval_every=0), model=make_tiny_model(),
               tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert [(s, p.name) for s, p in list_checkpoints(out)] == [(3, "iter_000003"), (4, "final")]


def test_loss_types_are_the_installed_trls():
    """loss_type is checked against the installed TRL's own list (its help text), so a newer TRL's loss type is
    accepted; the list read from TRL 1.16 is the one esft falls back to."""
    import trl

    from esft.config import ConfigError
    from esft.grpo.grpo_config import TRL_LOSS_TYPES, loss_types_in, trl_loss_types

    if trl.__version__ == "1.16.0":
        assert sorted(trl_loss_types()) == sorted(TRL_LOSS_TYPES)
    else:
        assert "grpo" in trl_loss_types()
    newer = "Specifies the loss. Supported values are 'grpo', 'dapo', and 'new_loss2'. 'grpo': token means..."
    assert loss_types_in(newer) == ("grpo", "dapo", "new_loss2")
    assert loss_types_in("no such sentence here") == ()
    for name in trl_loss_types():
        assert GRPOConfig(loss_type=name).loss_type == name
    with pytest.raises(ConfigError, match="a loss type of the installed TRL"):
        GRPOConfig(loss_type="grpoo")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_run_shows_no_deprecation_warning_of_the_checkpointing_switch(tmp_path, tokenizer, checkpointing):
    """Every `esft train grpo` printed two FutureWarnings from transformers 5.x (`gradient_checkpointing` is
    deprecated ..., `is_gradient_checkpointing` is deprecated ...) that a user can do nothing about; the switch
    still reaches TRL under its current name."""
    import warnings

    args = to_trl_config(GRPOConfig(gradient_checkpointing=checkpointing), str(tmp_path / "trl"), "fp32")
    assert args.gradient_checkpointing is checkpointing
    config = tiny_config(tmp_path / "run", max_steps=1, eval_every=0, gradient_checkpointing=checkpointing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        to_trl_config(config, str(tmp_path / "trl"), "fp32")
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    deprecated = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecated == []


# the mapping-valued option below is the user's own; transformers warns that its name is deprecated
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_kwargs` is deprecated:FutureWarning")
def test_trl_args_given_as_text_reach_trl_as_numbers(tmp_path, monkeypatch):
    """`--trl-args '{adam_epsilon: 1e-8}'` (YAML 1.1 reads 1e-8 as text): TRL kept the text and torch's AdamW
    refused it ("'<=' not supported between 'float' and 'str'") once the model had loaded."""
    import esft.models
    from esft.config import ConfigError

    config = GRPOConfig(trl_args="{adam_epsilon: 1e-8, adam_beta2: '0.99', top_k: '5', "
                                 "gradient_checkpointing_kwargs: {use_reentrant: false}}")
    assert config.trl_args["adam_epsilon"] == "1e-8"  # as YAML read it
    trl = to_trl_config(config, str(tmp_path), "fp32")
    assert (trl.adam_epsilon, trl.adam_beta2, trl.top_k) == (1e-8, 0.99, 5)
    assert type(trl.adam_epsilon) is float and type(trl.top_k) is int
    assert trl.gradient_checkpointing_kwargs == {"use_reentrant": False}

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before trl_args were checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    with pytest.raises(ConfigError, match=r"top_k: an integer \(TRL's GRPOConfig\), not '1.5'"):
        train_grpo(tiny_config(tmp_path / "frac", trl_args={"top_k": "1.5"}), task=ParityTask(), progress=False)


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(run, tmp_path, tokenizer):
    """A truncated model.safetensors in `final` (or a torch file that is no whole archive) is skipped with a
    warning: the resume takes the step-2 checkpoint and trains steps 3-4 again, to the same weights. Before, the
    newest checkpoint was taken whatever its state: here the run counted as finished, its final unloadable."""
    import shutil

    from esft.grpo.checkpoints import checkpoint_damage, resume_checkpoint

    out = tmp_path / "run"
    shutil.copytree(run["out"], out)
    final = out / "checkpoints" / "final"
    assert checkpoint_damage(final) is None and resume_checkpoint(out)[0] == 4
    weights = final / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    assert "model.safetensors" in checkpoint_damage(final)
    with pytest.warns(UserWarning, match="final is damaged"):
        result = train_grpo(tiny_config(out, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                            task=ParityTask(), progress=False)
    assert result.steps == 4
    assert [r["step"] for r in read_jsonl(out / "drift.jsonl")] == [1, 2, 3, 4]
    saved = _load_safetensors(final)
    reference = _load_safetensors(run["out"] / "checkpoints" / "final")
    assert all(torch.equal(saved[k], reference[k]) for k in reference)

    (out / "checkpoints" / "final" / "optimizer.pt").write_bytes(b"PK\x03\x04 torn")
    earlier = [folder for step, folder in list_checkpoints(out) if folder.name != "final"]
    for folder in earlier:
        (folder / "optimizer.pt").write_bytes(b"")
    assert "optimizer.pt" in checkpoint_damage(final)
    with pytest.warns(UserWarning, match="damaged") as caught:
        assert resume_checkpoint(out) == (0, None)
    said = [str(w.message) for w in caught]
    assert said[-1].endswith("no checkpoint before it: training again from step 0"), said[-1]
    assert all(m.endswith("resuming from the one before it") for m in said[:-1]) and len(said) > 1


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_checkpoint_missing_its_resume_state_is_skipped(run, tmp_path, name):
    """transformers resumes from a checkpoint without optimizer.pt, scheduler.pt or rng_state.pth without a word:
    a fresh AdamW, the LR schedule from its start, other samples (a SmolLM2 run resumed so ended on other weights
    and another learning rate). Such a checkpoint is damaged: the resume takes the one before it."""
    import shutil

    from esft.grpo.checkpoints import checkpoint_damage, resume_checkpoint

    out = tmp_path / "run"
    shutil.copytree(run["out"], out)
    final = out / "checkpoints" / "final"
    (final / name).unlink()
    assert checkpoint_damage(final) == f"no {name.replace('.pth', '*.pth')}"
    with pytest.warns(UserWarning, match=f"final is damaged \\(no {name.split('.')[0]}"):
        step, folder = resume_checkpoint(out)
    assert (step, folder.name) == (2, "iter_000002")


def test_unknown_trl_args_are_refused_before_the_run_folder_is_made(tmp_path):
    """`esft train grpo --trl-args '{bogus: 1}'` was refused only after the run folder, its lock and samples/ were
    made: a typo left an empty run folder behind."""
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=r"\['bogus'\] are not"):
        train_grpo(tiny_config(tmp_path / "bogus", trl_args={"bogus": 1}), task=ParityTask(), progress=False)
    assert not (tmp_path / "bogus").exists()


def test_a_run_that_saves_only_the_model_counts_its_checkpoints_as_whole(tmp_path, tokenizer):
    """trl_args save_only_model never writes optimizer.pt, scheduler.pt or rng_state.pth: its checkpoints are not
    damaged, so resuming the finished run has nothing to do (it was trained again from step 0, its metrics cut)."""
    import warnings

    out = tmp_path / "run"
    trl_args = {"generation_kwargs": {"sequence_bias": [[[EOS], 9.0]]}, "save_only_model": True}
    config = tiny_config(out, max_steps=2, save_steps=1, eval_every=0, trl_args=trl_args)
    train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert not (out / "checkpoints" / "final" / "optimizer.pt").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = train_grpo(dataclasses.replace(config, resume=True), model=make_tiny_model(), tokenizer=tokenizer,
                           task=ParityTask(), progress=False)
    assert not [w for w in caught if "damaged" in str(w.message)]
    assert again.trainer is None and again.steps == 2
    assert [r["step"] for r in read_jsonl(out / "drift.jsonl")] == [1, 2]


def test_an_interrupts_checkpoint_never_pushes_out_a_scheduled_one(tmp_path, tokenizer, capfd):
    """save_total_limit counted the interrupt's checkpoint: with save_steps 2 and a limit of 1, an interrupt after
    step 3 deleted the scheduled iter_000002 for it; with a limit of 2 a resumed run ended without iter_000002, which
    the uninterrupted run keeps. It is never counted, and it is deleted, with a line saying so, once the run has a
    newer checkpoint (step 4 here)."""
    from esft.rundir import RunInterrupted

    options = dict(max_steps=5, save_steps=2, save_total_limit=1, eval_every=0)
    out = tmp_path / "limited"
    with pytest.raises(RunInterrupted, match=r"^interrupted with 3 of 5 steps finished: saved .*iter_000003; "):
        train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[InterruptAt(4)], progress=False)
    assert [p.name for _, p in list_checkpoints(out)] == ["iter_000002", "iter_000003"]
    capfd.readouterr()
    train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    assert f"esft: deleted {out / 'checkpoints' / 'iter_000003'}: written when the run was interrupted" in \
        capfd.readouterr().err
    assert [p.name for _, p in list_checkpoints(out)] == ["iter_000004", "final"]


def test_only_an_interrupts_checkpoints_that_save_steps_did_not_ask_for_are_dropped(tmp_path):
    from esft.grpo.interrupt import drop_interrupt_saves, mark_interrupt_save

    folders = {}
    for step, name in ((2, "iter_000002"), (3, "iter_000003"), (4, "iter_000004"), (6, "final")):
        folders[step] = tmp_path / name
        folders[step].mkdir()
    for step in (3, 4):
        mark_interrupt_save(folders[step], step)
    # save_steps 2: step 4 is one it asks for (kept, marked or not); step 3 only the interrupt wrote
    assert drop_interrupt_saves(sorted(folders.items()), 2) == [folders[3]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "iter_000002", "iter_000004"]
    assert drop_interrupt_saves([(4, folders[4]), (6, folders[6])], 0) == [folders[4]]  # save_steps 0: final only
