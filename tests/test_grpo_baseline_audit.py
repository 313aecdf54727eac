"""Contracts of the GRPO baseline that a comparison with ES relies on: the KL to the initial model that esft measures
at beta = 0 is that of the policy's own numerics (0 before the first update, whatever TRL option shapes the policy's
LM head), and a run whose train split cannot fill one step is refused instead of ending at step 0.

Run: pytest -q tests/test_grpo_baseline_audit.py   (~15 s on 2 CPU cores; tiny random-init models, no download)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from conftest import make_tiny_model  # noqa: E402
from esft.config import ConfigError  # noqa: E402
from esft.grpo.run import train_grpo  # noqa: E402
from esft.rundir import read_jsonl  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402


def untied_model():
    """A tiny Llama whose lm_head is its own tensor: TRL casts such a head to fp32 only (cast_lm_head_to_fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return LlamaForCausalLM(config)


def test_the_first_steps_kl_is_zero_with_the_lm_head_in_fp32(tmp_path, tokenizer):
    """Step 1 samples from the initial model, so KL(policy || reference) is 0 when the frozen reference computes
    its log-probs as the policy does. With cast_lm_head_to_fp32 under bf16 autocast TRL runs the policy's head in
    fp32; a reference head left under autocast reads a KL of bf16 rounding before any update."""
    base = tiny_config(tmp_path)
    config = tiny_config(tmp_path / "run", max_steps=1, eval_every=0, precision="bf16-autocast",
                         trl_args={**base.trl_args, "cast_lm_head_to_fp32": True})
    result = train_grpo(config, model=untied_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert result.trainer.kl_reference is not None and result.trainer.args.cast_lm_head_to_fp32
    kls = [r["kl"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(kls) == 1 and kls[0] == pytest.approx(0.0, abs=1e-12)


def test_a_train_split_smaller_than_one_step_is_refused(tmp_path, tokenizer):
    """TRL's sampler draws whole batches of prompts_per_step distinct prompts and drops an incomplete one: 8 prompts
    per step from 6 examples would give no batch, and transformers would end the run at step 0 with a log line."""
    task = ParityTask(n=6)
    config = tiny_config(tmp_path / "run", prompts_per_step=8, per_device_train_batch_size=8, eval_every=0)
    with pytest.raises(ConfigError, match="prompts_per_step = 8 .* 6 train examples"):
        config.check_task_fit(task)  # the CLI's and the experiment specs' check, before any model loads
    with pytest.raises(ConfigError, match="prompts_per_step = 8 .* 6 train examples"):
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=task, progress=False)
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "checkpoints").exists()
    config.replace(prompts_per_step=6, per_device_train_batch_size=8).check_task_fit(task)  # one full step fits


def test_the_in_run_evaluation_is_esft_eval_of_the_checkpoint_in_fp32(tmp_path, tokenizer, monkeypatch):
    """The held-out evaluation a run writes at its last step and `esft eval --dtype fp32` of its final checkpoint
    are one measurement: same examples, prompts, greedy completions and scores, from fp32 weights outside the
    training's bf16 autocast (a greedy argmax under autocast is another model's)."""
    import json

    import esft.evaluation
    from esft.evaluation import run_eval
    from esft.eval_config import EvalConfig

    generate, numerics = esft.evaluation.generate, []

    def spy(model, *args, **kwargs):
        numerics.append((torch.is_autocast_enabled("cpu"), next(model.parameters()).dtype))
        return generate(model, *args, **kwargs)

    monkeypatch.setattr(esft.evaluation, "generate", spy)
    out = tmp_path / "run"
    config = tiny_config(out, max_steps=1, eval_every=1, eval_limit=3, eval_max_new_tokens=5,
                         precision="bf16-autocast")  # training autocasts; the evaluation must not
    train_grpo(config, model=untied_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert numerics == [(False, torch.float32)] * 2  # steps 0 and 1
    in_run = [json.loads(line) for line in (out / "samples" / "eval_000001.jsonl").read_text().splitlines()]
    record = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == 1][0]
    summary = run_eval(EvalConfig(model=str(out / "checkpoints" / "final"), tasks=["grpo_tiny:ParityTask"], limit=3,
                                  max_new_tokens=5, dtype="fp32", device="cpu", output_dir=str(tmp_path / "eval")),
                       progress=False)
    rows = [json.loads(line) for line in next((tmp_path / "eval").glob("*.jsonl")).read_text().splitlines()]
    assert [r["completion"] for r in rows] == [r["completion"] for r in in_run]
    assert [r["score"] for r in rows] == [r["score"] for r in in_run]
    assert next(iter(summary.values()))["accuracy"] == record["test_accuracy"]


def test_the_micro_batch_split_does_not_change_the_update(tmp_path, tokenizer):
    """per_device_train_batch_size only splits a step's prompts_per_step * num_generations completions into
    micro-batches (gradient accumulation covers the rest): with the same rollouts (same seed, one generation
    round of the whole step either way), plain SGD without clipping makes the same update from 1, 2 or 4
    micro-batches, so neither the step's size nor the loss's scale depends on the split."""
    theta0 = dict(make_tiny_model().named_parameters())
    updates = []
    for micro_batch in (8, 4, 2):
        model = make_tiny_model()
        config = tiny_config(tmp_path / f"mb{micro_batch}", max_steps=1, eval_every=0, save_steps=0, optim="sgd",
                             max_grad_norm=0.0, learning_rate=1.0, per_device_train_batch_size=micro_batch)
        result = train_grpo(config, model=model, tokenizer=tokenizer, task=ParityTask(), progress=False)
        assert result.trainer.args.gradient_accumulation_steps == 8 // micro_batch
        updates.append(torch.cat([(p.detach() - theta0[n].detach()).flatten() for n, p in model.named_parameters()]))
    assert updates[0].norm() > 0
    for other in updates[1:]:
        assert torch.allclose(other, updates[0], rtol=1e-4, atol=1e-7)


def test_a_resume_inside_a_generation_round_retrains_it_as_the_uninterrupted_run(tmp_path, tokenizer):
    """With num_iterations = 2 each generation round serves two updates, and TRL keeps its completions only in
    memory: a run continued from step 1 sampled a new round at step 2, where the uninterrupted run reuses step 1's.
    The resume goes back to the round's start (here step 0) and equals the uninterrupted run; the old final
    checkpoint of step 1 is no longer presented as the run's final weights while it trains."""
    from transformers import TrainerCallback

    from esft.grpo.checkpoints import list_checkpoints

    class FinalsAtStart(TrainerCallback):
        def __init__(self):
            self.names = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.names = [folder.name for _, folder in list_checkpoints(tmp_path / "extended")]

    options = dict(eval_every=0, lr_scheduler_type="constant", num_iterations=2, save_steps=1,
                   max_completion_length=4)

    def run(name, steps, **extra):
        train_grpo(tiny_config(tmp_path / name, max_steps=steps, **options, **extra.pop("config", {})),
                   model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False, **extra)
        return ([r["total"] for r in read_jsonl(tmp_path / name / "drift.jsonl")],
                [r["completions"] for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"])

    whole = run("whole", 3)
    assert whole[1] == [8, 0, 8]  # a round at steps 1 and 3; step 2 reuses step 1's completions
    run("extended", 1)
    spy = FinalsAtStart()
    with pytest.warns(UserWarning, match="inside a generation round of num_iterations = 2"):
        extended = run("extended", 3, config={"resume": True}, callbacks=[spy])
    assert extended == whole
    assert "final" not in spy.names
