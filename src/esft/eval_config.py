"""`EvalConfig`: what `esft eval` (and esft.evaluation.run_eval) evaluates, and how, checked before any model
loads: the tasks and their options, the split and its limit, greedy or sampled decoding (pass@k), the output folder.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from esft.config import ConfigError, ConfigHooks, check_fields, mapping_field, passage_cut
from esft.config_rules import Rule, at_least, in_range, non_negative, one_of
from esft.passk import parse_ks
from esft.tasks import split_task_list
from esft.tasks.labels import BALANCE_SEED


@dataclass
class EvalConfig(ConfigHooks):
    """What `esft eval` runs."""

    model: str = "smollm2-135m"
    """Embedded model name, local Hugging Face folder, or hub id."""
    tasks: list[str] = field(default_factory=lambda: ["boolq"])
    """Task names (countdown, math, chemistry, boolq, mmlu, ifeval), with options as in
    countdown:numbers=2,max_number=20,ops=+* (esft.tasks)."""
    split: str = "test"
    """Which split to evaluate."""
    limit: int | None = None
    """Examples per task (the first `limit` of the deterministic split); None (`--limit none`, the default) = the
    whole split."""
    balanced: bool = False
    """Labelled tasks (esft.tasks.labels.LABELLED_TASKS: boolq, chemistry, mmlu, a Countdown variant with several
    operators, a data task scored by mcq, ...): evaluate a label-balanced subset of the split (equal count per gold
    label, `limit` in all, drawn by balance_seed) instead of its first `limit` examples; use >= 400."""
    balance_seed: int = BALANCE_SEED
    """Seed of the balanced subset's draw."""
    max_new_tokens: int = 1024
    """Generation budget per completion (paper: 1024)."""
    batch_size: int = 32
    """Prompts per generation batch."""
    temperature: float = 0.0
    """0 = greedy (paper protocol)."""
    top_p: float = 1.0
    """Nucleus mass when sampling."""
    seed: int = 0
    """Sampling seed."""
    dtype: str = "auto"
    """auto (fp32 on CPU, bf16 on GPU), fp32, bf16, fp16."""
    device: str | None = None
    """cpu, cuda, cuda:1 ...; None = CUDA if available."""
    output_dir: str | None = None
    """Where to write summary.json and each task's completions, `<task>.jsonl` (a line per completion: example
    index, sample number when sampled, score, the completion, the example; a data-file task `sums.jsonl` gives
    `sums.jsonl.jsonl`), and with --samples `<task>.passk.png`; None = print only."""
    max_passage_chars: int | None = None
    """BoolQ only: cut passages to this many characters (None = full passage, the paper's setting)."""
    samples: int = 1
    """n: completions per question. > 1 (needs temperature > 0) reports pass@k, mean@n and maj@k."""
    k: list[int] = field(default_factory=list)
    """k values of pass@k and maj@k, e.g. 1,8,32 (each <= samples); empty = 1 and n."""
    generation_options: dict[str, Any] = field(default_factory=dict)
    """How the engine runs: empty = the exact path (greedy outputs equal plain greedy `model.generate`'s, without
    the penalties a model's generation_config.json may set); "fast" = the ES CPU presets' path
    (esft.config.FAST_CPU_GENERATION: ~5x faster on CPU, logits equal to ~1e-6 relative); or a mapping of
    esft.generation.ENGINE_OPTIONS, e.g. {share_prefix: true}."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options of the tasks read from a data file, dataset or module (prompt_field, answer_field, system_prompt,
    reward, ...: esft.tasks.dataset_task); the built-in tasks take theirs in the name."""

    def __post_init__(self) -> None:
        objects = [t for t in ([] if isinstance(self.tasks, str) else self.tasks) if not isinstance(t, str)]
        if objects:  # str() of an object read as an unknown task name
            raise ConfigError("tasks", objects[0], "task names, `module:Class` or data files (text): evaluate a task "
                              "object with esft.evaluation.evaluate_task(model, tokenizer, task, examples, gen_config)")
        # a comma-separated --tasks is split at every comma, also inside one task's options: join them again
        self.tasks = split_task_list(self.tasks)
        self.task_options = mapping_field("task_options", self.task_options)  # --task-options as YAML / JSON text
        from esft.generation import engine_options, options_refusal

        try:
            self.generation_options = engine_options(self.generation_options)
        except ValueError as exc:
            raise options_refusal(self.generation_options, exc) from None
        check_fields(self, EVAL_RULES)
        if self.top_p < 1 and self.temperature <= 0:  # greedy decoding takes the top token: no nucleus to cut
            warnings.warn(f"top_p {self.top_p:g} has no effect with greedy decoding (temperature 0); give "
                          "--temperature above 0 to sample", stacklevel=3)
        if self.samples > 1 and self.temperature <= 0:
            # greedy decoding would give n identical completions: pass@k would equal pass@1
            raise ConfigError("samples", self.samples, "1 with greedy decoding, or temperature > 0 for samples > 1 "
                              "(e.g. --temperature 0.6)")
        if self.k:
            # fail before loading the model; kept as reported (sorted, once each) so summary.json's config names
            # the k values its results hold
            try:
                self.k = parse_ks(self.k, self.samples)
            except ValueError:
                raise ConfigError("k", self.k, f"values in [1, samples={self.samples}] (whole numbers): pass@k and "
                                  "maj@k need at least k samples per question") from None
        from esft.tasks.custom import external_kind

        if self.task_options and not any(external_kind(name) for name in self.tasks):
            # only tasks read from a data file, dataset or module take them: the run would ignore them
            raise ValueError(f"task_options {self.task_options} apply only to tasks read from a data file, dataset "
                             f"or module, and none of {self.tasks} is one; built-in tasks take theirs in the name "
                             "(countdown:numbers=2)")

    def task_checks(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(config key, task name, constructor options) of every task evaluated, as `run_eval` builds them."""
        from esft.tasks.custom import external_kind

        return [("tasks", name, {**task_options(name, self.max_passage_chars),
                                 **(self.task_options if external_kind(name) else {})}) for name in self.tasks]

    def generation_limits(self) -> dict[str, int]:
        """{config key: the most tokens a completion may generate} (esft.validation.check_names)."""
        return {"max_new_tokens": self.max_new_tokens}

    def check_task_fit(self, task: Any, name: str | None = None) -> None:
        """The task has the split evaluated, holding examples (esft.validation.check_splits), before the model
        loads, and with `balanced` a balanced subset of it exists (a label missing from a small data file's split).
        `balanced` on a task without labels evaluates its first `limit` examples: nothing to refuse. `name`: the
        task as the user wrote it (`task_checks`)."""
        from esft.validation import check_balanced_set, check_splits

        # the default split was not the user's choice: the refusal then names the task, as the user wrote it (a
        # task class `my_tasks:NoTest` by that, not by the `name` its class declares)
        shown = task.shown_name()
        typed = [t for t in self.tasks if t == shown or str(t).startswith(f"{shown}:")]
        key, value = (("split", self.split) if self.split != type(self).split
                      else ("tasks", name or (typed[0] if typed else shown or ",".join(self.tasks))))
        check_splits(key, value, task, (self.split,))
        if self.balanced:
            check_balanced_set(task, self.limit, self.split, key="limit")

    @property
    def sampled(self) -> bool:
        """True when the pass@k protocol runs (several samples, or k asked for explicitly)."""
        return self.samples > 1 or bool(self.k)


#: what each EvalConfig field accepts beyond its type (esft.config.check_fields)
EVAL_RULES: dict[str, Rule] = {
    "tasks": Rule("at least one task name", bool), "limit": at_least(1), "balance_seed": at_least(0),
    "max_new_tokens": at_least(1), "batch_size": at_least(1), "temperature": non_negative(),
    "top_p": in_range(0.0, 1.0), "seed": at_least(0), "samples": at_least(1), "max_passage_chars": at_least(1),
    "dtype": one_of("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16"),
    "model": Rule("a model name, folder or hub id (non-empty)", bool),
}


def task_options(name: str, max_passage_chars: int | None = None) -> dict[str, Any]:
    """The constructor options `esft eval` gives task `name` (esft.config.passage_cut)."""
    return passage_cut(name, max_passage_chars)


__all__ = ["EVAL_RULES", "EvalConfig", "task_options"]
