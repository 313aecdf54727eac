"""The hooks a config class declares for the config machinery (esft.config.ConfigHooks): a class without its own
`unknown_option_hint` gets the default suggestion, GRPOConfig its own, through both places that name an unknown
option (a config file / flag / preset in esft.config.coerce, an experiment spec's option block)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from esft.config import ConfigHooks, coerce


@dataclass
class Plain(ConfigHooks):
    steps: int = 3


def test_a_config_without_its_own_hint_gets_the_default_suggestion():
    from esft.es import ESConfig

    for cls in (Plain, ESConfig):
        assert cls.unknown_option_hint("stepz", ["steps"]) == " (did you mean steps?)"
        assert cls.unknown_option_hint("x", ["a", "b"]) == " (did you mean a, b?)"
        assert cls.unknown_option_hint("zzz", []) == ""
    with pytest.raises(ValueError, match=r"^run\.yaml:2: unknown option 'stepz' \(did you mean steps\?\)$"):
        coerce(Plain, {"stepz": 1}, "run.yaml:2")
    with pytest.raises(ValueError, match=r"^f: unknown option 'sigmaa' \(did you mean sigma\?\)$"):
        coerce(ESConfig, {"sigmaa": 0.1}, "f")


def test_grpo_config_names_where_a_trl_option_goes_instead():
    from esft.grpo.grpo_config import GRPOConfig

    assert GRPOConfig.unknown_option_hint("bf16", []) == " (TRL's option; esft sets it from precision)"
    assert GRPOConfig.unknown_option_hint("disable_tqdm", []) == " (TRL's option, which esft sets itself)"
    assert GRPOConfig.unknown_option_hint("use_vllm", []) == \
        " (another option of TRL's GRPOConfig goes under trl_args: {use_vllm: ...})"
    assert GRPOConfig.unknown_option_hint("temprature", ["temperature"]) == \
        " (did you mean temperature? another option of TRL's GRPOConfig goes under trl_args: {temprature: ...})"
    with pytest.raises(ValueError, match=r"^f: unknown option 'bf16' \(TRL's option; esft sets it from precision\)$"):
        coerce(GRPOConfig, {"bf16": True}, "f")


def test_an_experiment_spec_asks_each_algorithms_config_for_its_hint():
    from esft.experiments.algorithms import get_algorithm
    from esft.experiments.spec_checks import unknown_option_hint

    es, grpo = get_algorithm("es"), get_algorithm("grpo")
    assert unknown_option_hint(es, "sigmaa", ["sigma", "alpha"]) == " (did you mean sigma?)"
    assert unknown_option_hint(es, "use_vllm", ["sigma"]) == ""
    assert unknown_option_hint(grpo, "use_vllm", ["beta"]) == \
        " (another option of TRL's GRPOConfig goes under trl_args: {use_vllm: ...})"


def test_a_class_without_the_hooks_is_refused_on_every_use_not_only_on_a_bad_key():
    @dataclass
    class Bare:
        steps: int = 3

    with pytest.raises(TypeError, match=r"^Bare is built from options, so it must inherit esft\.config\.ConfigHooks$"):
        coerce(Bare, {"steps": 4}, "f")


def test_every_config_class_esft_builds_from_options_has_the_hooks():
    from esft.analysis.commands import COMMANDS
    from esft.analysis.report_builder import ReportConfig
    from esft.bench import BenchConfig
    from esft.eval_config import EvalConfig
    from esft.experiments.algorithms import ALGORITHMS

    classes = [c for c, _, _ in COMMANDS.values()] + [ReportConfig, BenchConfig, EvalConfig]
    classes += [a.config_cls for a in ALGORITHMS.values()]
    assert [c.__name__ for c in classes if not issubclass(c, ConfigHooks)] == []
