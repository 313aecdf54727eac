"""Experiment-spec refusals and the values parsing hands on (esft.experiments.spec, spec_checks) and the DART-ES
branches of esft.es.es_config.check_combinations; no model loads (a few seconds each).

Each bad spec must be refused at its line with words that say what is wrong: a check that silently disappears
would let the experiment train for hours and fail (or, worse, run with a value nobody asked for).
"""

from __future__ import annotations

import re

import pytest

from conftest import load_spec_text
from esft.experiments import SpecError

# one task and no holdouts: each parse builds only Countdown
BASE = """\
name: audit
kind: single-task
tasks: [countdown]
algorithms:
  es:
    iterations: 2
  grpo:
    max_steps: 2
evaluation:
  limit: 3
  holdout: []
"""


def _edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


ES = "  es:\n    iterations: 2\n"
EVAL = "  limit: 3\n"
TOP = "name: audit\n"


@pytest.mark.parametrize("old,new,line,match", [
    # top level
    ("kind: single-task\n", "", 1, r"missing required key 'kind'"),
    ("tasks: [countdown]", "tasks: []", 3, r"tasks: at least one task is needed"),
    ("tasks: [countdown]", "tasks: {countdown: 1}", 3, r"tasks must be a list of task names"),
    ("tasks: [countdown]", "tasks: [countdown]\nseeds: [3, 3]", 4, r"seeds repeat: \[3, 3\]"),
    ("tasks: [countdown]", "tasks: [countdown]\nseeds: [42, -1]", 4, r"seeds\[\] must be >= 0, got -1"),
    ("tasks: [countdown]", "tasks: [countdown]\nseeds: [42, true]", 4, r"seeds\[\] must be an integer, got True"),
    (TOP, TOP + "model: ''\n", 2, r"model must be a name or a path, got ''"),
    (TOP, TOP + "description: true\n", 2, r"description must be a text, got True"),
    (TOP, TOP + "sequential: [x]\n", 2, r"sequential must be a mapping, got \[.x.\]"),
    (TOP, TOP + "task_options: {countdwn: {}}\n", 2, r"task_options: unknown task 'countdwn' \(did you mean countdown"),
    (TOP, TOP + "sequential: {carry_optimizer_state: true}\n", 2,
     r"the `sequential` block only applies to kind: sequential"),
    ("kind: single-task", "kind: sequential\nsequential: {carry: true}", 3, r"unknown key 'carry' in sequential"),
    ("kind: single-task", "kind: sequential\nsequential: {carry_optimizer_state: 1}", 3,
     r"sequential.carry_optimizer_state must be true/false"),
    (TOP, TOP + "tables: {ifeval: strict}\n", 2, r"unknown key 'ifeval' in tables"),
    (TOP, TOP + "tables: {ifeval_metric: strict}\n", 2, r"tables.ifeval_metric must be one of accuracy, prompt_strict"),
    ("algorithms:\n" + ES + "  grpo:\n    max_steps: 2\n", "", 1, r"missing required key 'algorithms'"),
    ("kind: single-task", "kind: sequentail", 2,
     r"unknown kind 'sequentail' \(did you mean sequential\?\); one of: single-task, sequential"),
    ("tasks: [countdown]", "tasks: [countdown]\nseeds: true", 4,
     r"seeds must be a non-empty list of integers, got True"),
    ("tasks: [countdown]", "tasks: [countdown]\nseeds: []", 4, r"seeds must be a non-empty list of integers, got \[\]"),
    (TOP, "name: ''\n", 1, r"name must be a name, got ''"),
    ("tasks: [countdown]", "tasks: [countdown, Countdown]", 3, r"task 'Countdown' appears twice in tasks"),
    (TOP, TOP + "task_options: {countdown: {nope: 1}}\n", 2, r"task_options.countdown: .*'nope'"),
    # algorithms
    ("algorithms:\n" + ES + "  grpo:\n    max_steps: 2\n", "algorithms:\n  - es\n  - ppo\n", 6,
     r"unknown algorithm 'ppo' in algorithms.ppo"),
    (ES, ES + "  mine:\n    iterations: 2\n    algorithm: ppo\n", 9, r"unknown algorithm 'ppo' in algorithms.mine"),
    (ES, ES + "    seed: 3\n", 7, r"algorithms.es: 'seed' is set by the experiment"),
    (ES, ES + "    max_passage_chars: 400\n", 7,
     r"algorithms.es: 'max_passage_chars' is a task option; put it under the top-level task_options"),
    (ES, ES + "    sigma: -1\n", 7, r"algorithms.es.sigma = -1 is not accepted; expected a finite number > 0"),
    (ES, ES + "    population_size: 1\n", 5,  # zscore of one member is 0: the run would never move
     r"algorithms.es \(es\) on countdown: .*population_size = 1 is not accepted; expected at least 2 with "
     r"fitness_shaping 'zscore'"),
    ("    iterations: 2\n", "    iterations: [1, 1]\n", 6,
     r"budgets must be a non-empty increasing list, got \[1, 1\]"),
    # configs built from the blocks, refused at the method's line
    (ES, ES + "    fitness_rule: balanced\n", 5,
     r"algorithms.es \(es\) on countdown: fitness_rule = 'balanced' is not accepted.*needs a task with labels"),
    ("    iterations: 2\n", "    iterations: [1, 2]\n    save_total_limit: 1\n", 5,
     r"algorithms.es \(es\) on countdown: save_total_limit would delete the checkpoints"),
    ("algorithms:\n" + ES + "  grpo:\n    max_steps: 2\n", "algorithms: {}\n", 4,
     r"algorithms: at least one algorithm is needed"),
    (ES, ES + "    algorithm: 5\n", 7, r"algorithms.es.algorithm must be a name, got 5"),
    (ES, ES + "  grpo->ppo: {}\n", 7, r"unknown algorithm 'ppo' in algorithms.grpo->ppo"),
    (ES, ES + "    per_task: {boolq: {iterations: 1}}\n", 7,
     r"algorithms.es.per_task: 'boolq' is not one of the spec's tasks \(countdown\)"),
    (ES, ES + "    per_task: {countdown: {sigmaa: 1}}\n", 7,
     r"unknown option 'sigmaa' in algorithms.es.per_task.countdown for es"),
    (ES, ES + "    per_task: {countdown: {iterations: [1, 2]}}\n", 7,
     r"algorithms.es.per_task.countdown: iterations must be one number here \(es inside a chain"),
    ("    iterations: 2\n", "    iterations: [1, 2]\n    per_task: {countdown: {iterations: 3}}\n", 7,
     r"algorithms.es.per_task.countdown: a per-task iterations cannot be combined with the budget list \[1, 2\]"),
    # the per-task entry's own line, not the es block's (6) nor per_task's (8) nor the task's (9)
    ("    iterations: 2\n", "    iterations: [1, 2]\n    sigma: 0.01\n    per_task:\n      countdown:\n"
                          "        sigma: 0.02\n        iterations: 3\n", 11,
     r"algorithms.es.per_task.countdown: a per-task iterations cannot be combined with the budget list \[1, 2\]"),
    ("    iterations: 2\n", "    iterations: [1, 2]\n    per_task:\n      countdown:\n        iterations: 3\n", 9,
     r"algorithms.es.per_task.countdown: a per-task iterations cannot"),
    ("    iterations: 2\n", "    iterations: [4, 2]\n", 6, r"budgets must be a non-empty increasing list, got \[4, 2\]"),
    ("    iterations: 2\n", "    iterations: []\n", 6, r"budgets must be a non-empty increasing list, got \[\]"),
    ("    iterations: 2\n", "    iterations: [0, 2]\n", 6, r"algorithms.es.iterations must be >= 1, got 0"),
    (ES, ES + "  grpo->es: {preset: cpu}\n", 7, r"unknown key 'preset' in algorithms.grpo->es"),
    (ES, ES + "  grpo->es: {es: {iterations: [1, 2]}}\n", 7,
     r"algorithms.grpo->es.es: iterations must be one number here \(es inside a chain"),
    # evaluation
    (EVAL, EVAL + "  dtype: 16\n", 11, r"evaluation.dtype must be a string, got 16"),
    (EVAL, EVAL + "  dtype: float99\n", 11, r"evaluation.dtype must be one of 'auto', 'fp32'.*got 'float99'"),
    (EVAL, EVAL + "  device: cdua\n", 11, r"evaluation.device must be a torch device \(cpu, cuda.*got 'cdua'"),
    (EVAL, EVAL + "  device: meta\n", 11, r"evaluation.device must be a torch device \(cpu, cuda.*got 'meta'"),
    (EVAL, EVAL + "  after_single_task: some\n", 11,
     r"evaluation.after_single_task must be one of all, trained, trained\+holdout, got 'some'"),
    (EVAL, "  limit: true\n", 10, r"evaluation.limit must be an integer, got True"),
    (EVAL, "  limit: 0\n", 10, r"evaluation.limit must be >= 1, got 0"),
    (EVAL, EVAL + "  max_new_tokens: 0\n", 11, r"evaluation.max_new_tokens must be >= 1, got 0"),
    (EVAL, EVAL + "  batch_size: 0\n", 11, r"evaluation.batch_size must be >= 1, got 0"),
    (EVAL, EVAL + "  generation_options: {nope: 1}\n", 11, r"evaluation.generation_options: unknown option 'nope'"),
    (EVAL, EVAL + "  per_task: {boolq: {limit: 2}}\n", 11,
     r"evaluation.per_task: 'boolq' is not evaluated by this spec \(countdown\)"),
    (EVAL, EVAL + "  per_task: {countdown: {temperature: 2}}\n", 11,
     r"unknown key 'temperature' in evaluation.per_task.countdown"),
    (EVAL, EVAL + "  per_task: {countdown: {max_new_tokens: null}}\n", 11,
     r"evaluation.per_task.countdown.max_new_tokens must be an integer, got None"),
    (EVAL, EVAL + "  per_task: {countdown: {balanced: 1}}\n", 11,
     r"evaluation.per_task.countdown.balanced must be true or false, got 1"),
    # pass@k sampling
    (EVAL, EVAL + "  passk: {k: 1}\n", 11, r"evaluation.passk needs samples"),
    (EVAL, EVAL + "  passk: {samples: 1}\n", 11, r"evaluation.passk.samples must be >= 2, got 1"),
    (EVAL, EVAL + "  passk: {samples: 4, k: [1, 8]}\n", 11,
     r"evaluation.passk.k must be integers between 1 and samples \(4\), got 8"),
    (EVAL, EVAL + "  passk: {samples: 4, k: [0]}\n", 11, r"evaluation.passk.k must be integers .*got 0"),
    (EVAL, EVAL + "  passk: {samples: 4, k: []}\n", 11,
     r"evaluation.passk.k must name at least one k between 1 and samples \(4\), got \[\]"),
    (EVAL, EVAL + "  passk:\n    samples: 4\n    k: []\n", 13, r"evaluation.passk.k must name at least one k"),
    (EVAL, EVAL + "  passk: {samples: 4, k: [true]}\n", 11, r"evaluation.passk.k must be integers .*got True"),
    (EVAL, EVAL + "  passk: {samples: 4, temperature: 0}\n", 11,
     r"evaluation.passk.temperature must be a number in \(0, 10.0\], got 0"),
    (EVAL, EVAL + "  passk: {samples: 4, temperature: 10.5}\n", 11, r"evaluation.passk.temperature must be a number"),
    (EVAL, EVAL + "  passk: {samples: 4, temperature: true}\n", 11, r"evaluation.passk.temperature .*got True"),
    (EVAL, EVAL + "  passk: {samples: 4, top_p: 1.5}\n", 11, r"evaluation.passk.top_p must be a number in \(0, 1.0\]"),
    (EVAL, EVAL + "  passk: {samples: 4, seed: -1}\n", 11, r"evaluation.passk.seed must be >= 0, got -1"),
])
def test_bad_specs_are_refused_at_their_line(tmp_path, old, new, line, match):
    """Each refusal names the file, the line and what is wrong, before any compute."""
    with pytest.raises(SpecError, match=match) as info:
        load_spec_text(tmp_path, _edit(old, new))
    assert f"spec.yaml:{line}: " in str(info.value), str(info.value)


def test_a_spec_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"spec.yaml:1: an experiment spec is a mapping of keys"):
        load_spec_text(tmp_path, "- countdown\n- es\n")


def test_carrying_the_optimizer_state_of_runs_that_save_none_is_refused(tmp_path):
    """sequential.carry_optimizer_state beside TRL's save_only_model: the GRPO checkpoints hold no optimizer.pt, so
    every later stage trained with fresh AdamW moments, without a word, while its records said they were carried."""
    text = ("name: audit\nkind: sequential\ntasks: [countdown, boolq]\nalgorithms:\n  grpo:\n    max_steps: 2\n"
            "    trl_args: {save_only_model: true}\nevaluation:\n  limit: 3\n  holdout: []\n"
            "sequential: {carry_optimizer_state: true}\n")
    with pytest.raises(SpecError, match=r"spec.yaml:7: algorithms.grpo.trl_args sets save_only_model, so its "
                                        r"checkpoints hold no optimizer state .* fresh AdamW moments"):
        load_spec_text(tmp_path, text)
    load_spec_text(tmp_path, text.replace("carry_optimizer_state: true", "carry_optimizer_state: false"))
    load_spec_text(tmp_path, text.replace("    trl_args: {save_only_model: true}\n", ""))


def test_base_spec_parses_with_the_values_it_names(tmp_path):
    """The spec all refusals above edit is itself valid (each refusal is caused by its edit), and its values arrive."""
    spec = load_spec_text(tmp_path, BASE)
    assert spec.name == "audit" and spec.kind == "single-task" and spec.tasks == ["countdown"]
    assert spec.seeds == [42] and spec.evaluation.all_tasks == ["countdown"] and spec.evaluation.limit == 3
    assert spec.config(spec.method("es").components[0], "countdown", 42).iterations == 2
    assert spec.config(spec.method("grpo").components[0], "countdown", 42).max_steps == 2


def test_lowest_accepted_values_pass(tmp_path):
    """The bounds are inclusive: limit 1, 2 samples, k = samples, seed 0, one budget."""
    spec = load_spec_text(tmp_path, _edit(EVAL, "  limit: 1\n  passk: {samples: 2, k: [2, 1, 2], seed: 0}\n")
                 .replace("    iterations: 2\n", "    iterations: [1]\n"))
    assert spec.evaluation.limit == 1 and spec.method("es").budgets == [1]
    assert spec.evaluation.passk.k == [1, 2] and spec.evaluation.passk.seed == 0  # sorted, repeats dropped
    assert load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown]\nseeds: [0, 7]")).seeds == [0, 7]
    assert load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown]\nseeds: 7")).seeds == [7]


def test_per_task_options_override_the_block_for_their_task_only(tmp_path):
    text = BASE.replace("tasks: [countdown]", "tasks: [countdown, countdown:numbers=2]").replace(
        ES, "  es:\n    iterations: 2\n    max-new-tokens: 20\n    per_task: {'countdown:numbers=2': "
            "{max_new_tokens: 64}}\n")
    spec = load_spec_text(tmp_path, text)
    es = spec.method("es").components[0]
    assert es.options == {"iterations": 2, "max_new_tokens": 20}  # the dashed spelling is the field's
    assert spec.config(es, "countdown:numbers=2", 42).max_new_tokens == 64
    assert spec.config(es, "countdown", 42).max_new_tokens == 20


def test_evaluation_settings_per_task_and_default(tmp_path):
    from esft.experiments.spec import TaskEval

    spec = load_spec_text(tmp_path, _edit(EVAL, "  limit: 5\n  max_new_tokens: 10\n  batch_size: 4\n  dtype: bf16\n"
                                       "  device: cpu\n  tasks: [countdown, countdown:numbers=2]\n"
                                       "  per_task: {'countdown:numbers=2': {limit: null, max_new_tokens: 3, "
                                       "batch_size: 1, balanced: true}}\n"))
    assert spec.evaluation.for_task("countdown") == TaskEval(limit=5, max_new_tokens=10, batch_size=4)
    assert spec.evaluation.for_task("countdown:numbers=2") == TaskEval(None, 3, 1, True)
    assert (spec.evaluation.dtype, spec.evaluation.device) == ("bf16", "cpu")


def test_a_chain_starts_from_the_base_blocks_and_its_sub_blocks_win(tmp_path):
    """`grpo->es` takes each step's options from the block of the same name, its own sub-block on top; a scalar
    budget of a plain block stays that block's budget (no budget list, no snapshots)."""
    text = _edit(ES, "  es:\n    iterations: 5\n    sigma: 0.01\n"
                     "  grpo->es: {display: Hybrid, es: {iterations: 2}}\n  es->grpo: {}\n")
    spec = load_spec_text(tmp_path, text)
    chain = spec.method("grpo->es")
    assert chain.display == "Hybrid" and spec.method("es->grpo").display == "ES->GRPO"
    assert spec.method("es").display == "ES" and spec.method("es").budgets == []
    assert [c.algorithm for c in chain.components] == ["grpo", "es"]
    assert chain.components[1].options == {"iterations": 2, "sigma": 0.01}
    assert chain.components[0].options == {"max_steps": 2}
    assert spec.config(spec.method("es").components[0], "countdown", 42).iterations == 5


def test_the_spec_name_beats_the_file_name(tmp_path):
    assert load_spec_text(tmp_path, BASE).name == "audit"
    assert load_spec_text(tmp_path, BASE.replace(TOP, "")).name == "spec"  # the file's stem


def test_a_shipped_spec_is_found_with_or_without_its_suffix():
    from esft.experiments.spec import resolve_spec_path, shipped_specs

    assert resolve_spec_path("cpu-compare.yaml") == resolve_spec_path("cpu-compare") == shipped_specs()["cpu-compare"]
    with pytest.raises(FileNotFoundError, match=r"no spec file 'cpu-comparee', and no shipped spec of that name "
                                                r"\(did you mean cpu-compare"):
        resolve_spec_path("cpu-comparee")


def test_a_model_folder_that_does_not_exist_is_refused_by_check_spec_model(tmp_path):
    from esft.experiments.spec import check_spec_model

    spec = load_spec_text(tmp_path, _edit(TOP, TOP + f"model: {tmp_path / 'missing'}/\n"))
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'spec.yaml'}:2: ") + r".*missing"):
        check_spec_model(spec)


def test_a_misspelt_model_name_is_refused_at_its_line(tmp_path):
    from esft.experiments.spec import check_spec_model

    spec = load_spec_text(tmp_path, _edit(TOP, TOP + "model: smollm2-136m\n"))
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'spec.yaml'}:2: model = 'smollm2-136m'")):
        check_spec_model(spec)


def test_a_budget_of_zero_is_refused_alone_as_in_a_list(tmp_path):
    """`iterations: [0, 2]` was refused while `iterations: 0` planned a stage "es to 0" that trains nothing; a
    negative budget names the bound >= 1 too (it said ">= 0", and 0 was refused next)."""
    for budget in ("0", "[0, 2]", "-2"):
        with pytest.raises(SpecError, match=r":6: .*iterations.* (must be >= 1|expected an integer >= 1)"):
            load_spec_text(tmp_path, _edit("    iterations: 2\n", f"    iterations: {budget}\n"))


def test_completions_longer_than_the_models_context_are_refused_at_their_line(tmp_path):
    """A max_new_tokens past the model's context (8192 for SmolLM2) allocated a KV cache of tens of GB and died
    once the model had loaded; --dry-run passed it."""
    from esft.experiments.spec import check_spec_model

    spec = load_spec_text(tmp_path, _edit("  limit: 3\n", "  limit: 3\n  max_new_tokens: 100000000\n"))
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'spec.yaml'}:11: evaluation.max_new_tokens "
                                                  "(countdown) = 100000000 is not accepted; expected an integer from 1 "
                                                  "to 8192, the context length of model smollm2-135m")):
        check_spec_model(spec)
    with pytest.raises(SpecError, match=r":5: algorithms.es \(es\) on countdown: max_new_tokens = 9000 .* 1 to 8192"):
        load_spec_text(tmp_path, _edit("    iterations: 2\n", "    iterations: 2\n    max_new_tokens: 9000\n"))
    check_spec_model(load_spec_text(tmp_path, _edit("  limit: 3\n", "  limit: 3\n  max_new_tokens: 8192\n")))


def test_after_single_task_in_a_sequential_spec_is_refused_at_its_line(tmp_path):
    """A sequential stage evaluates every task, so the key would change nothing there: refused, not ignored."""
    text = _edit(EVAL, EVAL + "  after_single_task: trained\n").replace("kind: single-task", "kind: sequential")
    with pytest.raises(SpecError, match=r"spec.yaml:11: evaluation.after_single_task only applies to kind: "
                                        r"single-task"):
        load_spec_text(tmp_path, text)
    spec = load_spec_text(tmp_path, text.replace("kind: sequential", "kind: single-task"))
    assert spec.evaluation.after_single_task == "trained"


# ---- DART-ES options of the ES config (esft.es.es_config.check_combinations) -------------------------------------

@pytest.mark.parametrize("rule", ["mean", "balanced"])
def test_fitness_options_of_another_rule_are_refused(rule):
    from esft.config import ConfigError
    from esft.es.es_config import ESConfig

    with pytest.raises(ConfigError, match=f"no options for fitness rule '{rule}' \\(they are DART-ES's: "
                       "fitness_rule dart, --fitness dart on the command line\\)"):
        ESConfig(fitness_rule=rule, fitness_options={"cooldown": 1})
    assert ESConfig(fitness_rule=rule, format_bonus=0.3).format_bonus == 0.3  # the mean rule's knob: no DART check


def test_format_bonus_with_dart_must_be_zero_or_dart_s_own_coefficient():
    from esft.config import ConfigError
    from esft.es.dart import DartOptions
    from esft.es.es_config import ESConfig

    coef = DartOptions().format_coef
    assert ESConfig(fitness_rule="dart", format_bonus=0.0, fitness_options={"format_coef": 0.3}).format_bonus == 0
    assert ESConfig(fitness_rule="dart", format_bonus=coef).format_bonus == coef
    custom = ESConfig(fitness_rule="dart", format_bonus=0.3, fitness_options={"format_coef": "0.3"})
    assert custom.fitness_options == {"format_coef": 0.3}  # as DART-ES reads it
    for bonus in (coef / 2, coef * 2):  # below and above the coefficient
        with pytest.raises(ConfigError, match=rf"0 or {coef} with fitness rule 'dart'.*format_coef: {bonus}"):
            ESConfig(fitness_rule="dart", format_bonus=bonus)
    # the format_coef given is what the user asked for: the advice drops the bonus, not copies it over the coef
    with pytest.raises(ConfigError, match=r"0 or 0.3 with fitness rule 'dart'.*set format_bonus 0 \(--format-bonus 0\) "
                       r"beside the format_coef given\)"):
        ESConfig(fitness_rule="dart", format_bonus=coef, fitness_options={"format_coef": 0.3})
    with pytest.raises(ConfigError, match=r"options DART-ES accepts \(unknown DART-ES options \['nope'\]"):
        ESConfig(fitness_rule="dart", fitness_options={"nope": 1})


# ---- values parsing hands on, and defaults the module docstring and the dataclasses name -------------------------

def test_evaluation_defaults_and_values_arrive(tmp_path):
    """Null means the default (no holdouts, every example, dtype auto, no pass@k); the other keys arrive as given."""
    spec = load_spec_text(tmp_path, _edit(EVAL + "  holdout: []\n", "  limit: null\n  holdout: null\n  dtype: null\n"
                                                        "  passk: null\n  after_single_task: trained\n"
                                                        "  balanced: true\n"))
    ev = spec.evaluation
    assert (ev.limit, ev.holdout, ev.dtype, ev.passk, ev.after_single_task, ev.balanced) == \
        (None, [], "auto", None, "trained", True)
    assert spec.model == "smollm2-135m" and spec.ifeval_metric == "prompt_strict"


def test_passk_defaults_and_values(tmp_path):
    """k defaults to [1, samples] and a single k is a list of one; temperature and top_p default to 1.0 (floats even
    when written as integers), the seed to 0, the sampled tasks to the training tasks. The bounds of (0, high] take
    any positive value from 1e-6 on."""
    pk = load_spec_text(tmp_path, _edit(EVAL, EVAL + "  passk: {samples: 4}\n")).evaluation.passk
    assert (pk.k, pk.temperature, pk.top_p, pk.seed, pk.tasks) == ([1, 4], 1.0, 1.0, 0, ["countdown"])
    assert pk.settings() == {"samples": 4, "k": [1, 4], "temperature": 1.0, "top_p": 1.0, "seed": 0}
    pk = load_spec_text(tmp_path, _edit(EVAL, EVAL + "  passk: {samples: 4, k: 2, temperature: 2, top_p: 0.000001, "
                                            "seed: 5}\n")).evaluation.passk
    assert (pk.k, pk.temperature, pk.top_p) == ([2], 2.0, 1e-6) and type(pk.temperature) is float
    assert pk.settings()["seed"] == 5  # a finished sampled evaluation with another seed is not the same one
    assert load_spec_text(tmp_path, _edit(EVAL, EVAL + "  passk: {samples: 4, temperature: 0.000001}\n")) \
        .evaluation.passk.temperature == 1e-6


def test_holdout_tasks_take_per_task_settings_and_pass_at_k(tmp_path):
    """A holdout task is evaluated, so evaluation.per_task and passk.tasks may name it; the training tasks come
    first in all_tasks."""
    spec = load_spec_text(tmp_path, _edit("  holdout: []\n", "  holdout: [boolq]\n  per_task: {boolq: {limit: 2}}\n"
                                                    "  passk: {samples: 2, tasks: [boolq]}\n"))
    assert spec.evaluation.all_tasks == ["countdown", "boolq"]
    assert spec.evaluation.for_task("boolq").limit == 2 and spec.evaluation.passk.tasks == ["boolq"]


def test_algorithm_and_task_forms(tmp_path):
    """`algorithms: [es, grpo]` gives each its defaults; a task list may be one comma-separated string, and task
    names are case-insensitive."""
    spec = load_spec_text(tmp_path, _edit("algorithms:\n" + ES + "  grpo:\n    max_steps: 2\n", "algorithms: [es, grpo]\n"))
    assert [m.label for m in spec.methods] == ["es", "grpo"] and spec.methods[0].components[0].options == {}
    spec = load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: 'countdown:numbers=2,ops=+, Countdown'"))
    assert spec.tasks == ["countdown:numbers=2,ops=+", "countdown"]


def test_budgets_reach_the_config(tmp_path):
    """A budget list is the method's budgets, each reaching the trainer's budget field; a per-task budget beside one
    budget number wins for its task; save_total_limit is fine with a single budget."""
    spec = load_spec_text(tmp_path, _edit("    iterations: 2\n", "    iterations: [1, 3]\n"))
    es = spec.method("es")
    assert es.budgets == [1, 3] and spec.config(es.components[0], "countdown", 42, budget=3).iterations == 3
    spec = load_spec_text(tmp_path, _edit(ES, ES + "    per_task: {countdown: {iterations: 3}}\n"))
    assert spec.config(spec.method("es").components[0], "countdown", 42).iterations == 3
    spec = load_spec_text(tmp_path, _edit("    iterations: 2\n", "    iterations: [2]\n    save_total_limit: 1\n"))
    assert spec.method("es").budgets == [2]


def test_a_preset_passage_cut_does_not_reach_the_config_and_options_are_plain(tmp_path):
    """The cpu preset's BoolQ passage cut is a task option, not the spec's (task_options hold those); option values
    are plain lists and dicts, which config.yaml (yaml.safe_dump) can hold."""
    import dataclasses

    import yaml

    spec = load_spec_text(tmp_path, _edit(ES, "  es:\n    preset: cpu\n    iterations: 2\n    exclude: ['lm_head']\n"))
    config = spec.config(spec.method("es").components[0], "countdown", 42)
    assert config.max_passage_chars is None and config.exclude == ["lm_head"]
    yaml.safe_dump(dataclasses.asdict(config))


def test_a_tracker_that_is_not_installed_is_refused_at_the_method_line(tmp_path, monkeypatch):
    def missing(report_to):
        raise ValueError(f"report_to {report_to!r} needs a package")

    monkeypatch.setattr("esft.tracking.check_backends", missing)
    with pytest.raises(SpecError, match=r"spec.yaml:5: algorithms.es \(es\) on countdown: report_to .* needs a "
                                        r"package"):
        load_spec_text(tmp_path, BASE)


def test_evaluated_tasks_are_built_and_checked_at_their_line(tmp_path):
    """An evaluated task that does not build, or has no test examples, is refused at the line that names it: the
    evaluation's tasks line, or the holdout line."""
    two = tmp_path / "two.jsonl"
    two.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    with pytest.raises(SpecError, match=r"spec.yaml:11: evaluation of .*missing.jsonl:reward=exact: expected a task "
                                        r"esft can build from it: task data file .* does not exist"):
        load_spec_text(tmp_path, _edit(EVAL, EVAL + f"  tasks: [countdown, '{tmp_path / 'missing.jsonl'}:reward=exact']\n"))
    with pytest.raises(SpecError, match=r"spec.yaml:11: evaluation of .*two.jsonl.*its test split is empty"):
        load_spec_text(tmp_path, _edit("  holdout: []\n", f"  holdout: ['{two}:reward=exact']\n"))


def test_a_balanced_limit_beyond_the_rarest_label_is_refused_at_its_per_task_line(tmp_path):
    with pytest.raises(SpecError, match=r"spec.yaml:15: evaluation of boolq \(balanced\): limit 100000 is not "
                                        r"accepted; expected a balanced held-out set that exists"):
        load_spec_text(tmp_path, _edit("  holdout: []\n", "  holdout: [boolq]\n  per_task:\n    boolq:\n      balanced: true\n"
                                                 "      limit: 100000\n"))


def test_a_folder_is_not_a_spec_file(tmp_path):
    from esft.experiments.spec import resolve_spec_path

    (tmp_path / "spec.yaml").write_text(BASE)
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a spec file \(YAML\): its spec is .*spec.yaml"):
        resolve_spec_path(tmp_path)


def test_a_balanced_evaluation_without_a_limit_is_checked_too(tmp_path):
    """limit null balances as many examples as the rarest label allows, which still needs every label in the test
    split (as `esft eval --balanced` checks): a label missing there failed each stage's evaluation after training."""
    import json

    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"question": f"q{i}", "answer": "A"}) + "\n" for i in range(10))
                   + json.dumps({"question": "q", "answer": "B"}) + "\n")
    with pytest.raises(SpecError, match=r"spec.yaml:10: evaluation of .*one.jsonl.* \(balanced\): limit None is not "
                                        r"accepted; expected a balanced held-out set that exists \(cannot balance: "
                                        r"no example has label 'B'\)"):
        load_spec_text(tmp_path, _edit(EVAL + "  holdout: []\n", f"  limit: null\n  holdout: "
                                                        f"['{one}:prompt_field=question,reward=mcq,test_size=2']\n"
                                                        "  balanced: true\n"))


def test_a_spec_built_from_python_mappings_parses_and_names_its_path():
    """parse_spec takes plain dicts (the Python API, a spec built in code), which carry no lines."""
    from esft.experiments.spec import parse_spec

    spec = parse_spec({"kind": "single-task", "tasks": ["countdown"], "algorithms": {"es": {"iterations": 2}},
                       "evaluation": {"limit": 3, "holdout": []}}, path="built")
    assert spec.config(spec.method("es").components[0], "countdown", 42).iterations == 2
    with pytest.raises(SpecError, match=r"^built:1: unknown key 'limt' in evaluation"):
        parse_spec({"kind": "single-task", "tasks": ["countdown"], "algorithms": ["es"],
                    "evaluation": {"limt": 3}}, path="built")


def test_a_task_name_is_case_insensitive_but_its_option_values_are_kept(tmp_path):
    spec = load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: ['Countdown:system_prompt=Be Brief']"))
    assert spec.tasks == ["countdown:system_prompt=Be Brief"]


GRPO = "  grpo:\n    max_steps: 2\n"


@pytest.mark.parametrize("option, hint", [
    ("bf16: true", "(TRL's option; esft sets it from precision)"),
    ("disable_dropout: true", "(TRL's option, which esft sets itself)"),
    ("num_train_epochs: 1", "(did you mean num_iterations? another option of TRL's GRPOConfig goes under trl_args: "
                            "{num_train_epochs: ...})"),
])
def test_a_trl_key_in_a_specs_grpo_block_says_where_it_goes(tmp_path, option, hint):
    """The same hint as in a GRPO config file (tests/test_config.py): a TRL user's key in the spec's grpo block is
    named as TRL's option esft sets itself, or pointed to trl_args (it said only "unknown option")."""
    with pytest.raises(SpecError) as refused:
        load_spec_text(tmp_path, _edit(GRPO, GRPO + "    " + option + "\n"))
    key = option.split(":")[0]
    expected = f"spec.yaml:9: unknown option {key!r} in algorithms.grpo for grpo (GRPOConfig) {hint}"
    assert str(refused.value).endswith(expected), str(refused.value)


def test_an_unknown_es_option_in_a_spec_names_the_close_matches(tmp_path):
    """ES's config has no hint of its own: its unknown options keep the plain close matches."""
    with pytest.raises(SpecError) as refused:
        load_spec_text(tmp_path, _edit(ES, ES + "    sigmaa: 1\n"))
    assert str(refused.value).endswith("spec.yaml:7: unknown option 'sigmaa' in algorithms.es for es (ESConfig) "
                                       "(did you mean sigma?)"), str(refused.value)


def test_a_grpo_option_in_a_specs_es_block_names_its_trainer(tmp_path):
    """As in a config file (tests/test_config.py): GRPO's `max_steps` under the es block says whose option it is."""
    with pytest.raises(SpecError) as refused:
        load_spec_text(tmp_path, _edit(ES, ES + "    max_steps: 1\n"))
    assert str(refused.value).endswith("spec.yaml:7: unknown option 'max_steps' in algorithms.es for es (ESConfig) "
                                       "(an option of `esft train grpo`, not of `esft train es`)"), str(refused.value)


def test_an_evaluation_that_leaves_out_a_training_task_is_refused(tmp_path):
    """The tables set each stage's accuracy on every training task beside the base model's: an evaluation.tasks
    without one ran every stage to tables of dashes (their notes naming an evaluation of the spec's limit). A
    training task evaluated as a holdout is evaluated."""
    with pytest.raises(SpecError, match=r"spec.yaml:11: evaluation.tasks leaves out the training task\(s\) "
                                        r"countdown: the tables compare"):
        load_spec_text(tmp_path, _edit(EVAL, EVAL + "  tasks: [boolq]\n"))
    spec = load_spec_text(tmp_path, _edit("  holdout: []\n", "  tasks: [boolq]\n  holdout: [countdown]\n"))
    assert spec.evaluation.all_tasks == ["boolq", "countdown"]


def test_task_options_of_a_task_the_spec_does_not_use_are_refused(tmp_path):
    """Options of a task the spec neither trains nor evaluates applied to nothing, silently: `task_options: {boolq:
    ...}` beside a task written `boolq:max_passage_chars=100` (keyed by that whole name) ran without them."""
    with pytest.raises(SpecError, match=r"spec.yaml:2: task_options: 'boolq' is neither trained nor evaluated by "
                                        r"this spec \(countdown, boolq:max_passage_chars=100\), so its options would "
                                        r"apply to nothing; the spec writes it 'boolq:max_passage_chars=100'"):
        load_spec_text(tmp_path, _edit(TOP, TOP + "task_options: {boolq: {max_passage_chars: 50}}\n").replace(
            "tasks: [countdown]", "tasks: [countdown, 'boolq:max_passage_chars=100']"))
    with pytest.raises(SpecError, match=r"spec.yaml:2: task_options: 'math' is neither trained nor evaluated by "
                                        r"this spec \(countdown\), so its options would apply to nothing$"):
        load_spec_text(tmp_path, _edit(TOP, TOP + "task_options: {math: {system_prompt: hi}}\n"))
    spec = load_spec_text(tmp_path, _edit(TOP, TOP + "task_options: {boolq: {max_passage_chars: 50}}\n").replace(
        "  holdout: []\n", "  holdout: [boolq]\n"))  # evaluated as a holdout: its options apply
    assert spec.task_options == {"boolq": {"max_passage_chars": 50}}
