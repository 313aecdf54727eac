"""ESConfig / GRPOConfig defaults and cross-field checks, pinned where a mutation audit found them untested."""

from __future__ import annotations

import pytest

from esft.es.es_config import PRESETS as ES_PRESETS
from esft.es.es_config import ESConfig
from esft.grpo.grpo_config import PRESETS as GRPO_PRESETS
from esft.grpo.grpo_config import GRPOConfig


@pytest.mark.parametrize("cls, presets", [(ESConfig, ES_PRESETS), (GRPOConfig, GRPO_PRESETS)])
def test_a_run_without_a_preset_uses_the_papers_hyperparameters(cls, presets):
    """The defaults are the paper's (Table 17, the `paper` preset): `esft train es` without --preset runs the
    paper's sigma, alpha, N, batch and budget, and `esft train grpo` its K, lr, clip and schedule."""
    default = cls()
    assert {k: getattr(default, k) for k in presets["paper"]} == presets["paper"]


def test_es_defaults_leave_the_optional_parts_off():
    """Each option whose docstring says "0 = off / a single run / keep all" (and rank 1, one lane) defaults so:
    a plain run is the paper's binary reward, one noise stream, only the final checkpoint, all checkpoints kept."""
    c = ESConfig()
    assert (c.format_bonus, c.noise_stream, c.checkpoint_every, c.save_total_limit, c.num_workers) == (0.0, 0, 0, 0, 0)
    assert (c.rank, c.parallel_members, c.antithetic, c.noise, c.fitness_rule) == (1, 1, False, "per-tensor", "mean")


def test_grpo_defaults_leave_the_optional_parts_off():
    """GRPO's "0 = only the final one / keep all / never" options, and the paper's format reward, by default."""
    c = GRPOConfig()
    assert (c.format_bonus, c.save_steps, c.save_total_limit, c.eval_every, c.warmup_steps) == (0.0, 0, 0, 0, 0)
    assert (c.num_iterations, c.beta, c.log_kl, c.class_balanced) == (1, 0.0, True, False)


ES_BOUNDS = [  # (field, smallest value accepted, largest value refused below it)
    ("batch_size", 1, 0), ("iterations", 0, -1), ("max_new_tokens", 1, 0), ("seed", 0, -1), ("noise_stream", 0, -1),
    ("rank", 1, 0), ("generation_batch_size", 1, 0), ("eval_every", 0, -1), ("eval_limit", 0, -1),
    ("checkpoint_every", 0, -1), ("save_total_limit", 0, -1), ("samples_per_iteration", 0, -1),
    ("max_passage_chars", 1, 0), ("parallel_members", 1, 0), ("num_workers", 0, -1),
]
GRPO_BOUNDS = [
    ("max_steps", 1, 0), ("prompts_per_step", 1, 0), ("num_generations", 2, 1), ("per_device_train_batch_size", 1, 0),
    ("warmup_steps", 0, -1), ("num_iterations", 1, 0), ("max_completion_length", 1, 0), ("seed", 0, -1),
    ("save_steps", 0, -1), ("save_total_limit", 0, -1), ("eval_every", 0, -1), ("eval_limit", 0, -1),
    ("eval_max_new_tokens", 1, 0), ("samples_per_iteration", 0, -1), ("max_passage_chars", 1, 0),
    ("weight_decay", 0.0, -1e-9), ("max_grad_norm", 0.0, -1e-9), ("beta", 0.0, -1e-9), ("top_p", 1.0, 0.0),
]


@pytest.mark.parametrize("cls, field, ok, bad", [(ESConfig, *b) for b in ES_BOUNDS] + [(GRPOConfig, *b)
                                                                                       for b in GRPO_BOUNDS])
def test_each_bounded_option_takes_its_bound_and_refuses_the_value_past_it(cls, field, ok, bad):
    """Each option's documented floor (0 = off / never / keep all where the docstring says so, else 1; K >= 2, a
    group of one has no relative advantage; top_p in (0, 1]) is accepted, and the value just past it is refused
    as ConfigError naming the option, before any model loads."""
    from esft.config import ConfigError

    base = {"per_device_train_batch_size": 1} if cls is GRPOConfig else {}  # divides any completions per step
    assert getattr(cls(**{**base, field: ok}), field) == ok
    with pytest.raises(ConfigError, match=rf"^{field} = {bad!r} is not accepted"):
        cls(**{**base, field: bad})


def test_the_population_takes_one_member_per_32_bit_seed_and_one_member_only_unshaped():
    """Members draw distinct 32-bit seeds, so 2^32 members is the most a population holds; one member is a
    population only with raw fitness (a standardised or ranked single fitness is 0: no update, ever)."""
    from esft.config import ConfigError

    assert ESConfig(population_size=2 ** 32).population_size == 2 ** 32
    assert ESConfig(population_size=1, fitness_shaping="raw").population_size == 1
    for bad in (2 ** 32 + 1, 0):
        with pytest.raises(ConfigError, match=rf"^population_size = {bad} is not accepted"):
            ESConfig(population_size=bad)
    with pytest.raises(ConfigError, match=r"^population_size = 1 is not accepted; expected at least 2 with "
                                          r"fitness_shaping 'zscore'"):
        ESConfig(population_size=1)


def test_bf16_rollouts_are_refused_with_the_ray_executor_and_with_low_rank_noise_each():
    """bf16 rollouts run on the local executor's member-by-member path: Ray alone, or low-rank noise alone, is
    enough to refuse them (each combination on its own, not only both together)."""
    from esft.config import ConfigError

    assert ESConfig(rollout_dtype="bfloat16").rollout_dtype == "bfloat16"
    for other in ({"executor": "ray"}, {"noise": "lowrank"}):
        with pytest.raises(ConfigError, match=r"^rollout_dtype = 'bfloat16' is not accepted"):
            ESConfig(rollout_dtype="bfloat16", **other)


@pytest.mark.parametrize("key, ok, bad", [
    ("threads_per_worker", 0, -1), ("checksum_every", 0, -1), ("start_timeout_s", 1e-9, 0),
    ("member_timeout_s", 0, -1e-9), ("num_cpus_per_worker", 0, -1e-9), ("gpu_memory_utilization", 1, 1.0000001),
    ("gpu_memory_utilization", 1e-9, 0), ("max_model_len", 0, -1), ("kv_cache_memory_bytes", 1, 0),
    ("use_gpu", False, 0), ("enforce_eager", True, 1),
])
def test_each_ray_executor_option_takes_its_bound_and_refuses_the_value_past_it(key, ok, bad):
    """The floor each executor option's words promise (0 = the default where they say so) is accepted with the Ray
    executor, and the value just past it refused naming the option."""
    from esft.config import ConfigError

    assert ESConfig(executor="ray", executor_options={key: ok}).executor_options == {key: ok}
    with pytest.raises(ConfigError, match=rf"expected {key} as .* \(got {bad!r}\)"):
        ESConfig(executor="ray", executor_options={key: bad})


def test_a_resume_refuses_another_output_dir_and_takes_its_own(tmp_path):
    """`--resume RUN --output-dir OTHER` would continue RUN's state in another folder: refused; the run's own folder
    (as typed another way) is the same run."""
    from esft.es.es_config import resume_config, save_yaml

    run = tmp_path / "run"
    run.mkdir()
    save_yaml(ESConfig(output_dir=str(run), iterations=3), run / "config.yaml")
    with pytest.raises(ValueError, match="names another folder"):
        resume_config(run, {"output_dir": str(tmp_path / "other")})
    config = resume_config(run, {"output_dir": str(run / ".." / "run")})
    assert config.resume is True and config.output_dir == str(run)


@pytest.mark.parametrize("floor", [-1, True, 1.5, "3"])
def test_a_min_new_tokens_that_is_not_a_count_is_refused(floor):
    """generation_options' min_new_tokens (benchmarks force full-length completions with it) is an integer >= 0:
    a negative, a bool, a float or text is refused with the config, before any model loads."""
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=r"min_new_tokens as an integer >= 0"):
        ESConfig(generation_options={"min_new_tokens": floor})
    assert ESConfig(generation_options={"min_new_tokens": 0}).generation_options == {"min_new_tokens": 0}


def test_an_antithetic_population_is_even():
    """Antithetic members come in mirrored pairs: any even size is accepted, any odd size refused."""
    from esft.config import ConfigError

    for n in (2, 4, 6):
        assert ESConfig(antithetic=True, population_size=n).population_size == n
    for n in (3, 5, 9):
        with pytest.raises(ConfigError, match=rf"^population_size = {n} is not accepted; expected an even number"):
            ESConfig(antithetic=True, population_size=n)
    assert ESConfig(antithetic=False, population_size=3).population_size == 3


def test_a_resume_reads_rollout_dtype_auto_as_the_recorded_dtype_and_refuses_another(tmp_path):
    """`--rollout-dtype auto` on a resume means the dtype the run recorded (no change); an explicit other dtype is
    a change a resume refuses, and "auto" for another option (dtype) is a change like any other value."""
    from esft.es.es_config import resume_config, save_yaml

    run = tmp_path / "run"
    run.mkdir()
    save_yaml(ESConfig(output_dir=str(run), rollout_dtype="float32"), run / "config.yaml")
    assert resume_config(run, {"rollout_dtype": "auto"}).rollout_dtype == "float32"
    with pytest.raises(ValueError, match=r"cannot change \['rollout_dtype'\]"):
        resume_config(run, {"rollout_dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"cannot change \['dtype'\]"):
        resume_config(run, {"dtype": "auto"})
