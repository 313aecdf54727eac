"""What `esft experiment run` checks before any stage runs, as `esft train` checks its flags before a model loads:
the devices a spec names against this machine, ES parameter selections against the model's parameter names,
evaluation options a run with eval_every 0 would ignore; and a stage that trained nothing before it failed, which
a re-run with a fixed spec must not refuse as "trained with other options".

Run: pytest tests/test_experiments_before_stages.py -q
"""

from __future__ import annotations

import pytest

from conftest import load_spec_text
from esft.experiments import SpecError

# one task and no holdouts: each parse builds only Countdown
SPEC = """\
name: checks
kind: single-task
tasks: [countdown]
algorithms:
  es:
    preset: cpu
    iterations: 2
  grpo:
    preset: cpu
    max_steps: 2
evaluation:
  limit: 3
  holdout: []
"""
ES = "    iterations: 2\n"
GRPO = "    max_steps: 2\n"
EVAL = "  limit: 3\n"


def _spec(tmp_path, old: str, new: str):
    assert old in SPEC
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace(old, new, 1))
    return path


def _never_run(monkeypatch):
    """The runner, replaced: a spec refused before its stages never reaches it (without the check, the real
    runner would evaluate the base model first)."""
    from esft.experiments import runner

    def refused(*args, **kwargs):
        raise AssertionError("the experiment started")

    monkeypatch.setattr(runner, "run_experiment", refused)


# ---- devices: checked against this machine before any stage, as `esft train --device` ----------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    device: cuda\n", 8, "algorithms.es.device"),
    (GRPO, GRPO + "    device: cuda\n", 11, "algorithms.grpo.device"),
    (EVAL, EVAL + "  device: cuda\n", 13, "evaluation.device"),
    (ES, ES + "    per_task:\n      countdown: {device: cuda}\n", 9, "algorithms.es.per_task.countdown.device"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, device: 'cuda:0'}\n", 12, "algorithms.grpo->es.es.device"),
])
def test_a_device_this_machine_lacks_is_refused_before_any_stage(tmp_path, capsys, monkeypatch, old, new, line,
                                                                 where):
    """`device: cuda` on a machine without CUDA evaluated the base model, then failed each stage with "Torch not
    compiled with CUDA enabled" (evaluation.device: the base stage failed and training started anyway). The run
    is refused at the line, with `esft train --device`'s words; the dry run still passes: a spec may be checked on
    another machine than the one that runs it (the shipped paper specs name cuda)."""
    import torch

    from esft.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _never_run(monkeypatch)
    path, out = _spec(tmp_path, old, new), tmp_path / "out"
    assert main(["experiment", "run", str(path), "--output-dir", str(out), "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["experiment", "run", str(path), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"esft: error: {path}:{line}: {where} = 'cuda") and len(err.splitlines()) == 1, err
    assert "sees no CUDA device, so use cpu here" in err
    assert not out.exists()


def test_devices_this_machine_has_pass(tmp_path):
    from esft.experiments.spec_checks import check_spec_devices

    spec = load_spec_text(tmp_path, SPEC.replace(ES, ES + "    device: cpu\n").replace(EVAL, EVAL + "  device: cpu\n"))
    check_spec_devices(spec)


# ---- ES parameter selections: from the model's skeleton, before any weights load ---------------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    include: [nosuchparam]\n", 8, "algorithms.es.include"),
    (ES, ES + "    per_task:\n      countdown:\n        exclude: ['.']\n", 10,
     "algorithms.es.per_task.countdown.exclude"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, include: [nosuchparam]}\n", 12,
     "algorithms.grpo->es.es.include"),
])
def test_a_parameter_selection_that_selects_nothing_is_refused_by_the_dry_run(tmp_path, capsys, monkeypatch, old,
                                                                              new, line, where):
    """`include: [nosuchparam]` passed --dry-run and failed only after the base model's evaluation ("no parameters
    selected"); `esft train es --include nosuchparam` is refused before the weights load. The spec is too, by the
    dry run as by the run (the check reads the model's config, no weights)."""
    from esft.cli import main

    _never_run(monkeypatch)
    path = _spec(tmp_path, old, new)
    for dry in (["--dry-run"], []):
        assert main(["experiment", "run", str(path), "--output-dir", str(tmp_path / "out"), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"esft: error: {path}:{line}: {where}: no parameters selected"), err
    assert main(["experiment", "run", str(_spec(tmp_path, ES, ES + "    include: ['layers\\.0\\.']\n")),
                 "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0


# ---- evaluation options a run with eval_every 0 never reads ------------------------------------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    eval_every: 0\n    eval_limit: 10\n", 9, "algorithms.es.eval_limit = 10"),
    (ES, ES + "    eval_every: 0\n    eval-balanced: true\n", 9, "algorithms.es.eval-balanced = True"),
    (GRPO, GRPO + "    eval_max_new_tokens: 8\n", 11, "algorithms.grpo.eval_max_new_tokens = 8"),  # preset cpu: 0
    (ES, ES + "    per_task:\n      countdown: {eval_every: 0, eval_limit: 5}\n", 9,
     "algorithms.es.per_task.countdown.eval_limit = 5"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, eval_every: 0, eval_limit: 5}\n", 12,
     "algorithms.grpo->es.es.eval_limit = 5"),
])
def test_an_evaluation_option_a_run_never_reads_is_refused_at_its_line(tmp_path, old, new, line, where):
    """`eval_every: 0, eval_limit: 10` passed the dry run while `esft train es --eval-every 0 --eval-limit 10` is
    refused ("--eval-limit would be ignored"): the same rule (esft.validation.unread_eval_option), at the line."""
    with pytest.raises(SpecError) as info:
        load_spec_text(tmp_path, SPEC.replace(old, new, 1))
    message = str(info.value)
    assert f"spec.yaml:{line}: {where} is not accepted" in message, message
    assert "eval_every is 0" in message and "command line" not in message, message


def test_evaluation_options_a_run_reads_or_that_ask_for_none_pass(tmp_path):
    for new in ("    eval_every: 0\n    eval_limit: 0\n    eval_balanced: false\n",  # asks for no evaluation
                "    eval_every: 5\n    eval_limit: 10\n"):
        spec = load_spec_text(tmp_path, SPEC.replace(ES, ES + new, 1))
        assert spec.config(spec.method("es").components[0], "countdown", 42).eval_limit in (0, 10)
    load_spec_text(tmp_path, SPEC.replace(GRPO, GRPO + "    eval_every: 2\n    eval_limit: 4\n", 1))
