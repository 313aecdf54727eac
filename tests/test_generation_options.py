"""`generation_options` of evaluation (`esft eval`, experiment specs): "fast" = the ES CPU presets' engine path,
validated before any model loads, recorded in the stage settings, and reaching the generation engine."""

from __future__ import annotations

import dataclasses

import pytest

from esft.config import FAST_CPU_GENERATION
from esft.generation import ENGINE_OPTIONS, GenerationConfig, engine_options


def test_engine_options_resolve_names_and_mappings():
    assert engine_options(None) == engine_options("exact") == engine_options({}) == {}
    assert engine_options("fast") == FAST_CPU_GENERATION
    assert engine_options("fast") is not FAST_CPU_GENERATION  # a copy: callers may not mutate the constant
    assert engine_options({"share_prefix": True, "prefill_buckets": 2}) == {"share_prefix": True, "prefill_buckets": 2}
    assert set(ENGINE_OPTIONS) <= set(GenerationConfig.__dataclass_fields__)
    GenerationConfig(**engine_options("fast"))  # every fast option is a GenerationConfig field


@pytest.mark.parametrize("value, message", [
    ("quick", "'fast', 'exact' or a mapping"),
    ({"max_new_tokens": 5}, "unknown option 'max_new_tokens'"),
    ({"prefill_buckets": 0}, "prefill_buckets = 0 is not accepted; expected a positive integer"),
    ({"prefill_buckets": True}, "expected a positive integer"),
    ({"packed_linear": "yes"}, "packed_linear = 'yes' is not accepted; expected true or false"),
    ({"engine": "vllm"}, "engine = 'vllm' is not accepted; expected esft or hf"),
])
def test_engine_options_refuse_bad_values(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine_options(value)


SPEC = """\
name: t
kind: sequential
tasks: [countdown]
seeds: [42]
algorithms:
  es:
    preset: cpu
    iterations: [2]
evaluation:
  limit: 3
"""


def test_spec_generation_options_reach_the_stage_settings(tmp_path):
    from esft.experiments import load_spec
    from esft.experiments.stage_eval import task_settings

    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    # unset: the settings of results evaluated before the option existed, so they stay current
    assert "generation_options" not in task_settings(load_spec(str(path)), "countdown", "m")
    path.write_text(SPEC + "  generation_options: fast\n")
    spec = load_spec(str(path))
    assert spec.evaluation.generation_options == FAST_CPU_GENERATION
    assert task_settings(spec, "countdown", "m")["generation_options"] == FAST_CPU_GENERATION


def test_spec_refuses_bad_generation_options_naming_the_line(tmp_path):
    from esft.experiments import SpecError, load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(SPEC + "  generation_options: {packed: true}\n")
    with pytest.raises(SpecError, match=r"spec.yaml:11.*evaluation.generation_options: unknown option 'packed'"):
        load_spec(str(path))


def test_eval_config_takes_fast_exact_and_yaml_text():
    from esft.eval_config import EvalConfig

    assert EvalConfig(generation_options="fast").generation_options == FAST_CPU_GENERATION
    assert EvalConfig(generation_options="exact").generation_options == {}
    assert EvalConfig(generation_options="{share_prefix: true}").generation_options == {"share_prefix": True}
    with pytest.raises(ValueError, match="unknown option 'lean_step'"):
        EvalConfig(generation_options={"lean_step": True})


def test_cli_refuses_bad_generation_options_before_loading(monkeypatch, capsys):
    import esft.models
    from esft.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    assert main(["eval", "--tasks", "countdown", "--limit", "2", "--generation-options", "turbo"]) == 2
    assert "(--generation-options): generation_options = 'turbo' is not accepted; expected 'fast', 'exact'" in \
        capsys.readouterr().err


def test_run_eval_generates_through_the_fast_path_with_the_exact_answers(tiny_model, tokenizer, monkeypatch,
                                                                         tmp_path):
    """The options reach the engine (seen at the generate call), and on the tiny model the fast path's greedy
    completions equal the exact path's."""
    import json

    import esft.evaluation
    from esft.evaluation import run_eval
    from esft.eval_config import EvalConfig

    seen = []
    real = esft.evaluation.generate

    def spy(model, tokenizer, prompts, config, **kwargs):
        seen.append(config)
        return real(model, tokenizer, prompts, config, **kwargs)

    monkeypatch.setattr(esft.evaluation, "generate", spy)
    texts = {}
    for name in ("exact", "fast"):
        cfg = EvalConfig(tasks=["countdown"], limit=4, max_new_tokens=6, batch_size=2, generation_options=name,
                         output_dir=str(tmp_path / name))
        run_eval(cfg, model=tiny_model, tokenizer=tokenizer, progress=False)
        rows = (tmp_path / name / "countdown.jsonl").read_text().splitlines()
        texts[name] = [json.loads(r)["completion"] for r in rows]
    assert not seen[0].packed_linear and not seen[0].share_prefix
    assert all(getattr(seen[1], k) == v for k, v in FAST_CPU_GENERATION.items())
    assert len(texts["fast"]) == 4 and texts["fast"] == texts["exact"]


@pytest.mark.parametrize("field, value, accepted", [
    ("top_p", 0.0, "a number in (0.0, 1.0]"), ("top_p", 1.5, "a number in (0.0, 1.0]"),
    ("top_p", float("nan"), "a number in (0.0, 1.0]"), ("temperature", -0.5, "a finite number >= 0"),
    ("temperature", float("inf"), "a finite number >= 0"), ("max_new_tokens", 0, "an integer >= 1"),
    ("max_new_tokens", 2.5, "an integer"), ("batch_size", 0, "an integer >= 1"),
    ("min_new_tokens", -1, "an integer >= 0"), ("prefill_buckets", 0, "an integer >= 1"),
    ("engine", "vllm", "one of 'esft', 'hf'"), ("lean", "yes", "true or false"),
])
def test_generation_config_refuses_bad_fields_when_built(field, value, accepted):
    """A GenerationConfig built from the Python API was not checked at all: temperature -0.5 decoded greedily,
    top_p 0 sampled from one token and 1.5 from all of them, without a word; a bad value now raises
    ConfigError (a ValueError) naming the field and what it accepts, before any model is involved."""
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=f"{field} = .* is not accepted; expected "
                                          + accepted.replace("(", r"\(").replace(")", r"\)")):
        GenerationConfig(**{field: value})
    ok = GenerationConfig(temperature=0.7, top_p=1.0, max_new_tokens=1, min_new_tokens=0, engine="hf")
    with pytest.raises(ConfigError, match=field):  # dataclasses.replace builds anew, so it is checked too
        dataclasses.replace(ok, **{field: value})


def test_cli_refuses_bad_sampling_values_before_loading(monkeypatch, capsys):
    import esft.models
    from esft.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    for flags, message in ((["--top-p", "0"], "top_p = 0.0 is not accepted"),
                           (["--top-p", "1.5"], "top_p = 1.5 is not accepted"),
                           (["--temperature", "-0.5"], "temperature = -0.5 is not accepted")):
        assert main(["eval", "--tasks", "countdown", "--limit", "2", "--samples", "2", *flags]) == 2
        assert message in capsys.readouterr().err


def test_a_default_generation_config_is_the_exact_greedy_protocol():
    """GenerationConfig() is the paper's evaluation protocol (greedy, up to 1024 tokens) on the exact engine path:
    every option that is not bit-identical to `model.generate` (share_prefix, prefill_buckets > 1, packed_linear,
    fused_attention, screened_lm_head) is opt-in, and sampling, once asked for, starts from seed 0 over the whole
    distribution (top_p 1)."""
    config = GenerationConfig()
    assert (config.max_new_tokens, config.temperature, config.min_new_tokens) == (1024, 0.0, 0)
    assert (config.engine, config.lean, config.batch_size) == ("esft", True, 32)
    assert (config.share_prefix, config.prefill_buckets) == (False, 1)
    assert (config.packed_linear, config.fused_attention, config.screened_lm_head) == (False, False, False)
    assert (config.seed, config.top_p) == (0, 1.0)
