"""Mutation-audit tests: build wires each ESConfig field to its component, the edges of the noise table and of
parameter writes, and an ES checkpoint / seed record round trip (masters, optimizer, coefficients)."""

from __future__ import annotations

import pytest
import torch
from es_tiny import one_thread, tiny_llama  # noqa: F401  (one_thread: autouse fixture)

from esft.config import ConfigError
from esft.es import build, es_rundir
from esft.es.es_config import ESConfig
from esft.es.noise import MasterWeights
from esft.es.noise_seeds import tensor_seed
from esft.es.param_writes import NORM_ROW, materialise, released, sq_norm, update_buffer


def test_make_strategy_takes_every_field_from_the_config():
    cfg = ESConfig(population_size=6, sigma=0.01, alpha=0.002, seed=7, antithetic=True, fitness_shaping="centered_rank",
                   optimizer="adam", noise_stream=3)
    es = build.make_strategy(cfg)
    assert (es.population_size, es.sigma, es.alpha, es.seed) == (6, 0.01, 0.002, 7)
    assert (es.antithetic, es.shaping_name, es.optimizer_name, es.stream) == (True, "centered_rank", "adam", 3)


def test_make_weights_selects_by_include_and_exclude_with_the_configs_noise():
    model = tiny_llama(hidden=16, layers=1)
    w = build.make_weights(model, ESConfig(include=["mlp"], exclude=["up_proj"], noise="table"))
    assert sorted(w.params) == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.gate_proj.weight"]
    assert w.mode == "table"
    lowrank = build.make_weights(model, ESConfig(noise="lowrank", rank=3, exclude=["embed"]))
    assert lowrank.rank == 3 and not any("embed" in n for n in lowrank.params)


def test_masters_share_the_models_storage_only_when_rollouts_run_on_copies():
    """One lane, fp32 rollouts, no packed path: members are written into the model itself, so the fp32 masters
    must be their own copy (a shared one would be overwritten by the first perturbation)."""
    model = tiny_llama(hidden=16, layers=1)
    assert not build.make_weights(model, ESConfig(rollout_dtype="float32", parallel_members=1)).shared
    assert build.make_weights(model, ESConfig(rollout_dtype="float32", parallel_members=2)).shared
    assert build.make_weights(model, ESConfig(rollout_dtype="bfloat16")).shared


def test_generation_config_is_greedy_with_the_configs_lengths():
    gc = build.generation_config(ESConfig(max_new_tokens=17, generation_batch_size=5))
    assert (gc.max_new_tokens, gc.batch_size, gc.temperature, gc.top_p) == (17, 5, 0.0, 1.0)


def test_the_mean_rule_carries_the_format_bonus_and_takes_no_options():
    assert build.make_fitness_rule("mean", 0.25).format_bonus == 0.25
    assert build.fitness_rule(ESConfig(format_bonus=0.5)).format_bonus == 0.5
    with pytest.raises(ValueError, match="takes no fitness_options"):
        build.make_fitness_rule("mean", 0.0, {"alpha": 1.0})


class _Questions:
    """A task object of the user's that is not an esft Task: load / prompt / score, yes-no gold answers."""

    splits = ("train", "test")

    def load(self, split, limit=None):
        return [{"q": i, "answer": "yes" if i % 3 else "no"} for i in range(6)][:limit]

    def prompt(self, example):
        return str(example["q"])

    def score(self, completion, example):
        return float(completion == example["answer"])


def test_the_balanced_rule_takes_a_task_object_as_its_task_would_be_built():
    """The trainer takes a task object as it is; the balanced rule read label_set / balance_key off it and stopped
    with AttributeError where the object had none (both optional for one). It now gets TaskAdapter's defaults, as
    `--task module:Class` builds it: no labels is the rule's own refusal, naming the object's class, and labels
    without a balance_key balance on the gold answers."""
    with pytest.raises(ValueError, match=r"needs a task with labels .*; '_Questions' has none$"):
        build.make_fitness_rule("balanced", task=_Questions())
    with pytest.raises(ValueError, match=r"; None has none$"):
        build.make_fitness_rule("balanced")

    class Labelled(_Questions):
        name = "questions"

        def label_set(self):
            return ("yes", "no")

    rule = build.make_fitness_rule("balanced", 0.5, task=Labelled())
    batch = Labelled().load("train")
    assert rule.labels == {"yes", "no"} and rule.format_bonus == 0.5
    assert [rule.label_of(ex) for ex in batch] == [ex["answer"] for ex in batch]


@pytest.mark.parametrize("field, value, match", [
    ("executor", "slurm", "unknown executor"), ("worker_backend", "tgi", "unknown worker_backend"),
    ("parallel_members", 0, ">= 1"), ("noise", "lowrank", "one batched pass")])
def test_check_layout_refuses_a_layout_changed_after_the_config_was_checked(field, value, match):
    """check_layout guards the executors by itself (replicas and replay call it on configs they did not build)."""
    cfg = ESConfig(executor="ray")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=match):
        build.check_layout(cfg)


def test_ray_options_of_a_local_run_are_named_as_ignored():
    """`--num-workers 4` (or --ray-address, --executor-options) without `--executor ray` ran one local process
    without a word. A warning, not an error: a Ray run resumed with --executor local keeps them in its config."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build.warn_unread_ray_options(ESConfig())
        build.warn_unread_ray_options(ESConfig(executor="ray", num_workers=4))
    with pytest.warns(UserWarning, match=r"num_workers=4, ray_address='auto' ignored: the local executor"):
        build.warn_unread_ray_options(ESConfig(num_workers=4, ray_address="auto"))
    with pytest.warns(UserWarning, match=r"executor_options=\{'threads_per_worker': 1\} ignored"):
        build.warn_unread_ray_options(ESConfig(executor_options={"threads_per_worker": 1}))


def test_a_rank_without_lowrank_noise_is_named_in_a_warning(recwarn):
    """`--rank 4` without `--noise lowrank` was dropped silently (the run drew full-rank noise)."""
    with pytest.warns(UserWarning, match=r"rank=4 ignored: noise 'table'"):
        build.warn_unread_rank(ESConfig(noise="table", rank=4))
    build.warn_unread_rank(ESConfig(noise="lowrank", rank=4))
    build.warn_unread_rank(ESConfig(noise="table"))
    assert not recwarn.list


def test_a_save_total_limit_without_numbered_checkpoints_is_named_in_a_warning(recwarn):
    """`--save-total-limit 2 --checkpoint-every 0` was accepted silently: only `final` is written, never counted."""
    with pytest.warns(UserWarning, match=r"save_total_limit=2 ignored: checkpoint_every 0 writes only the final"):
        build.warn_unread_rank(ESConfig(save_total_limit=2, checkpoint_every=0))
    build.warn_unread_rank(ESConfig(save_total_limit=2, checkpoint_every=5))
    assert not recwarn.list


def test_the_trainer_warns_of_an_unread_rank_before_the_model_loads(tmp_path, monkeypatch):
    import esft.models
    from esft.api import es_trainer

    def load_model(*args, **kwargs):
        raise RuntimeError("model loading")

    monkeypatch.setattr(esft.models, "load_model", load_model)
    config = ESConfig(model="smollm2-135m", task="boolq", noise="table", rank=4, output_dir=str(tmp_path / "run"))
    with pytest.warns(UserWarning, match="rank=4 ignored"), pytest.raises(RuntimeError, match="model loading"):
        es_trainer(config, progress=False)


def test_executor_options_of_both_backends_are_accepted_and_others_refused():
    build.check_executor_options(ESConfig(executor="ray", executor_options={"gpu_memory_utilization": 0.5,
                                                                            "threads_per_worker": 1}))
    config = ESConfig(executor="ray")
    config.executor_options = {"bogus": 1}  # set after the config's own check (which refuses it too)
    with pytest.raises(ValueError, match="unknown executor_options"):
        build.check_executor_options(config)


@pytest.mark.parametrize("options, key", [
    ({"threads_per_worker": "two"}, "threads_per_worker"),
    ({"threads_per_worker": 1.5}, "threads_per_worker"),
    ({"checksum_every": -1}, "checksum_every"),
    ({"member_timeout_s": -5}, "member_timeout_s"),
    ({"start_timeout_s": 0}, "start_timeout_s"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"enforce_eager": "false"}, "enforce_eager"),
    ({"vllm_kwargs": "x"}, "vllm_kwargs"),
    # text the workers' int() would refuse after Ray's start-up, or that Ray takes as given (num_cpus)
    ({"threads_per_worker": "2"}, "threads_per_worker"),
    ({"kv_cache_memory_bytes": "4e9"}, "kv_cache_memory_bytes"),
    ({"num_cpus_per_worker": "2"}, "num_cpus_per_worker"),
    ({"member_timeout_s": float("inf")}, "member_timeout_s"),
    ({"checksum_every": True}, "checksum_every"),
])
def test_ray_executor_option_values_are_refused_when_the_config_is_built(options, key):
    """A Ray run's executor option value the workers cannot use is refused with the config (before Ray starts),
    naming the option; `threads_per_worker: two` used to fail after Ray's start-up with int()'s bare message."""
    with pytest.raises(ConfigError, match=rf"expected {key} as "):
        ESConfig(executor="ray", executor_options=options)
    ESConfig(executor="local", executor_options=options)  # a local run reads none of them (a warning says so)
    ESConfig(executor="ray", executor_options={"threads_per_worker": 2, "member_timeout_s": 0, "use_gpu": None,
                                               "max_model_len": None, "checksum_every": 0, "vllm_kwargs": None,
                                               "num_cpus_per_worker": 0.5, "kv_cache_memory_bytes": 10**400})
    ESConfig(executor="ray", executor_options={"max_model_len": 0, "start_timeout_s": 10**400})  # no overflow


def test_unknown_ray_executor_option_is_refused_when_the_config_is_built():
    """An experiment spec's `executor_options: {bogus: 1}` on a Ray block passed `--dry-run` (which builds configs
    only) and failed when the stage started; the config refuses it, and knows the keys the executor reads."""
    from esft.es.es_config import EXECUTOR_VALUES

    assert set(EXECUTOR_VALUES) == build.RAY_OPTIONS | build.VLLM_OPTIONS
    assert "threads_per_worker" in build.RAY_OPTIONS and "kv_cache_memory_bytes" in build.VLLM_OPTIONS
    with pytest.raises(ConfigError, match=r"unknown executor_options \['bogus'\]"):
        ESConfig(executor="ray", executor_options={"bogus": 1, "threads_per_worker": 1})


def test_make_local_executor_passes_the_layout_and_refuses_vllm():
    model = tiny_llama(hidden=16, layers=1)
    cfg = ESConfig(parallel_members=3, rollout_dtype="float32")
    kw = dict(model=model, tokenizer=None, weights=build.make_weights(model, cfg), task=None,
              strategy=build.make_strategy(cfg), gen_config=None)
    ex = build.make_local_executor(cfg, **kw)
    assert ex.parallel_members == 3 and ex.rollout_dtype is None
    cfg.worker_backend = "vllm"
    with pytest.raises(ValueError, match="use --executor ray"):
        build.make_local_executor(cfg, **kw)


def test_the_kernels_are_built_on_the_calling_thread_before_any_lane(monkeypatch):
    # a Ctrl-C during a build on a lane thread waited for the build to end; the main thread's stops it at once
    import threading

    from esft import kernels
    from esft.generation import GenerationConfig

    threads: list[tuple[str, str]] = []
    for name in ("decode_attention", "param_passes"):
        monkeypatch.setattr(kernels, f"load_{name}",
                            lambda name=name: threads.append((name, threading.current_thread().name)))
    model = tiny_llama(hidden=16, layers=1)
    cfg = ESConfig(parallel_members=2, rollout_dtype="float32")
    kw = dict(model=model, tokenizer=None, weights=build.make_weights(model, cfg), task=None,
              strategy=build.make_strategy(cfg))
    main = threading.main_thread().name
    build.make_local_executor(cfg, **kw, gen_config=GenerationConfig(fused_attention=False))
    assert threads == [("param_passes", main)]  # every perturbation and update runs it
    threads.clear()
    build.make_local_executor(cfg, **kw, gen_config=GenerationConfig(fused_attention=True))
    assert sorted(threads) == [("decode_attention", main), ("param_passes", main)]


# ---- seeds and parameter-write edges ------------------------------------------------------------------------

def test_tensor_seeds_are_pinned_across_versions():
    """Old seed logs replay only while these stay put (sha256 of "seed:name", first 8 bytes little-endian, top
    bit cleared)."""
    assert tensor_seed(42, "model.embed_tokens.weight") == 8297689256022487937
    assert tensor_seed(1, "lm_head.weight") == 8434574950256779075  # a digest with its top bit set
    assert tensor_seed(3, "noise-table", "table") == 7966648288525360442
    assert tensor_seed(-5, "x", "shared-seed") == 2 ** 63 - 5


def test_materialise_gives_a_freed_view_with_an_offset_storage_for_all_its_elements():
    t = torch.zeros(10)[2:]
    t.untyped_storage().resize_(0)
    assert released(t)
    materialise(t).fill_(1.0)
    assert not released(t) and t.untyped_storage().nbytes() >= 10 * 4 and bool((t == 1).all())


def test_sq_norm_counts_a_tail_of_one_element():
    assert sq_norm(torch.tensor([3.0])) == 9.0
    assert sq_norm(torch.full((NORM_ROW + 1,), 2.0)) == 4.0 * (NORM_ROW + 1)


def test_update_buffer_is_no_larger_than_the_largest_tensor():
    assert update_buffer(10, "cpu").numel() == 10 and update_buffer(10, "cpu").dtype == torch.float32


# ---- checkpoints and seed records ---------------------------------------------------------------------------------

def test_a_bf16_checkpoint_restores_the_fp32_masters_the_optimizer_and_the_step(tmp_path):
    model = tiny_llama(hidden=16, layers=1, dtype=torch.bfloat16)
    weights = MasterWeights(model)
    masters = {n: t.clone() + 1e-4 for n, t in weights.iter_masters()}  # off the bf16 grid
    weights.load_masters(masters)
    optimizer = torch.optim.Adam(list(weights.master.values()), lr=0.1)
    for t in weights.master.values():
        t.grad = torch.ones_like(t)
    optimizer.step()
    expected = {n: t.clone() for n, t in weights.iter_masters()}
    folder = es_rundir.save_checkpoint(tmp_path, "iter_000004", 4, model, None, weights, optimizer)
    fresh = tiny_llama(seed=1, hidden=16, layers=1, dtype=torch.bfloat16)
    fresh_w = MasterWeights(fresh)
    fresh_opt = torch.optim.Adam(list(fresh_w.master.values()), lr=0.1)
    assert es_rundir.load_checkpoint(folder, fresh, fresh_w, fresh_opt) == 4
    assert all(torch.equal(t, expected[n]) for n, t in fresh_w.iter_masters())
    state = fresh_opt.state_dict()["state"]
    assert len(state) == len(expected) and all(int(s["step"]) == 1 for s in state.values())
    no_opt = es_rundir.save_checkpoint(tmp_path, "final", 4, model, None, weights)
    with pytest.raises(es_rundir.CheckpointDamaged, match="no optimizer state"):
        es_rundir.load_checkpoint(no_opt, fresh, fresh_w, fresh_opt)


def test_tied_weights_are_aliased_under_both_names():
    aliases = es_rundir.parameter_aliases(tiny_llama(hidden=16, layers=1))
    assert sorted(aliases["model.embed_tokens.weight"]) == ["lm_head.weight", "model.embed_tokens.weight"]


def test_a_seed_record_round_trips_members_coefficients_and_the_update_kind():
    from esft.es.noise import Update

    update = Update(seeds=(11, 12), coefficients=(0.1 + 0.2, -1 / 3), scale=2.5e-4, kind="sgd")
    rec = es_rundir.seed_record(0, [3, 1], [(11, 0), (12, 0)], [0.5, 0.25], [1.0, -1.0], update, 0.125)
    assert rec["members"] == [[11, 0], [12, 0]]
    del rec["kind"]  # logs from before the optimizer option: plain SGD
    assert es_rundir.update_from_record(rec) == update


def test_an_include_that_selects_nothing_is_refused_from_the_skeleton_before_the_weights_load(tmp_path, monkeypatch):
    """`--include nomatch` used to fail only once the model's weights had loaded (minutes for a large model)."""
    import esft.models
    from esft.es.trainer import ESTrainer

    model = tiny_llama(hidden=16, layers=1)
    model.save_pretrained(tmp_path / "m")
    skeleton = esft.models.model_skeleton(str(tmp_path / "m"))
    assert [n for n, _ in skeleton.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(p.is_meta for p in skeleton.parameters())

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded")

    monkeypatch.setattr(esft.models, "load_model", no_weights)
    config = dict(model=str(tmp_path / "m"), task="boolq", output_dir=str(tmp_path / "run"))
    for selection in (dict(include=["nomatch"]), dict(exclude=["."]), dict(include=["mlp"], exclude=["proj"])):
        with pytest.raises(ValueError, match="no parameters selected"):
            ESTrainer(ESConfig(**config, **selection), progress=False)
    # a selection that matches goes on to load the weights (here: the stand-in's refusal)
    with pytest.raises(AssertionError, match="the weights loaded"):
        ESTrainer(ESConfig(**config, include=["mlp"], exclude=["up_proj"]), progress=False)
    build.check_selection(ESConfig(model=str(tmp_path / "absent"), include=["nomatch"]))  # load_model reports it


@pytest.mark.parametrize("key", ["enable_prefix_caching", "worker_extension_cls", "enforce_eager", "seed"])
def test_vllm_kwargs_may_not_replace_what_esft_sets(key):
    """`vllm_kwargs` was applied last, so `{enable_prefix_caching: true}` let a member reuse the KV cache of another
    member's weights and `{enforce_eager: false}` passed the CPU refusal; other LLM(...) arguments still pass."""
    with pytest.raises(ConfigError, match=rf"vllm_kwargs without the arguments esft sets itself \({key}: "):
        ESConfig(executor="ray", executor_options={"vllm_kwargs": {key: 1, "max_num_seqs": 64}})
    ESConfig(executor="ray", executor_options={"vllm_kwargs": {"max_num_seqs": 64, "block_size": 16}})
