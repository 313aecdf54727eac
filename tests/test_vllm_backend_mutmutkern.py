"""vLLM backend seams without an engine, at the edges test_vllm_backend.py leaves open: Hugging Face names of two
parts, a vLLM tensor whose columns differ from the Hugging Face shape, where the engine core runs, weights held as
inference tensors, an update after an interrupted member, the re-packing of a CPU engine's kernels, and vLLM's
refusal of a model in one line."""

from __future__ import annotations

import os

import pytest
import torch

from es_tiny import ToyTask, one_thread, tiny_llama  # noqa: F401  (one_thread: autouse fixture)
from esft.es.es_config import ESConfig
from esft.es.noise import MasterWeights, Update
from esft.es.distributed.hf_replica import ReplicaSpec, masters_checksum
from esft.es.distributed.vllm_backend import UnsupportedLayout, VLLMReplica, hf_views
from test_vllm_backend import PACKED, FakeLLM, _set, equal, extension, shapes_of, snapshot, toy_parts, vllm_like


def test_a_two_part_name_of_a_packed_module_maps_to_its_rows():
    """`q_proj.weight` at the top of the model: module `q_proj` (packed into `qkv_proj`), leaf `weight`."""
    root = torch.nn.Module()
    root.packed_modules_mapping = PACKED
    q, k, v = torch.full((4, 3), 1.0), torch.full((2, 3), 2.0), torch.full((2, 3), 3.0)
    _set(root, "qkv_proj.weight", torch.cat([q, k, v]))
    shapes = {"q_proj.weight": [4, 3], "k_proj.weight": [2, 3], "v_proj.weight": [2, 3]}
    views = hf_views(root, shapes, ["k_proj.weight", "v_proj.weight"])
    assert torch.equal(views["k_proj.weight"], k) and torch.equal(views["v_proj.weight"], v)


def test_a_vllm_tensor_with_other_columns_is_refused_not_cut():
    """Padding adds vocabulary rows only: a tensor whose columns differ is another layout (tensor parallelism)."""
    root = torch.nn.Module()
    _set(root, "model.embed_tokens.weight", torch.zeros(256, 8))
    with pytest.raises(UnsupportedLayout, match="tensor parallelism"):
        hf_views(root, {"model.embed_tokens.weight": [250, 16]}, ["model.embed_tokens.weight"])
    with pytest.raises(UnsupportedLayout, match="tensor parallelism"):  # fewer rows than Hugging Face's
        hf_views(root, {"model.embed_tokens.weight": [300, 8]}, ["model.embed_tokens.weight"])
    assert hf_views(root, {"model.embed_tokens.weight": [250, 8]},
                    ["model.embed_tokens.weight"])["model.embed_tokens.weight"].shape == (250, 8)


def test_the_engine_core_runs_in_process_only_for_esfts_own_engine(monkeypatch):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 is set for the engine esft builds (make_llm), and left alone when a caller
    brings its own engine factory."""
    import esft.es.distributed.vllm_backend.vllm_replica as vllm_replica

    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    ref = MasterWeights(hf)
    spec = ReplicaSpec(config=ESConfig(model="tiny", task="toy", max_new_tokens=7), builder=toy_parts,
                       options={"layout": {"selected": ref.names, "shapes": shapes_of(hf)}})
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    VLLMReplica(spec, engine_factory=lambda s: FakeLLM(vllm_like(hf)), sampling_factory=dict)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setattr(vllm_replica, "make_llm", lambda s: FakeLLM(vllm_like(hf)))
    VLLMReplica(spec, sampling_factory=dict)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def _spec(hf) -> ReplicaSpec:
    return ReplicaSpec(config=ESConfig(model="tiny", task="toy", max_new_tokens=7), builder=toy_parts,
                       options={"layout": {"selected": MasterWeights(hf).names, "shapes": shapes_of(hf)}})


def test_a_fresh_replica_is_rank_0_with_no_sync_time_and_refuses_optimizer_state():
    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    ref = MasterWeights(hf)
    replica = VLLMReplica(_spec(hf), engine_factory=lambda s: FakeLLM(vllm_like(hf)), sampling_factory=dict)
    assert replica.info()["rank"] == 0 and replica.sync_seconds == 0.0
    with pytest.raises(ValueError, match="no optimizer state"):
        replica.load_state(dict(ref.iter_masters()), {"step": 3})
    assert replica.load_state(dict(ref.iter_masters()), None) == masters_checksum(ref)


def test_an_engine_holding_inference_tensors_is_edited_in_inference_mode():
    """vLLM's GPU worker loads its weights as inference tensors, which only inference mode may edit in place: perturb,
    restore and update work there as on ordinary tensors, bit for bit as a PyTorch replica. Inference mode is
    thread-local, so the noise is drawn on the calling thread even where torch has several."""
    torch.set_num_threads(2)  # one_thread (autouse) restores the count afterwards
    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    with torch.inference_mode():
        vm = vllm_like(hf)
    assert all(p.is_inference() for p in vm.parameters())
    ref = MasterWeights(hf)
    ext = extension(vm)
    ext.esft_init(ref.names, shapes_of(hf))
    views = hf_views(vm, shapes_of(hf), ref.names)
    before = snapshot(vm)
    ref.perturb(5, 1, 0.01)
    ext.esft_perturb(5, 1, 0.01)
    assert all(torch.equal(views[n], p) for n, p in ref.params.items())
    ref.restore()
    ext.esft_restore()
    assert equal(snapshot(vm), before)
    update = Update(seeds=(5, 6), coefficients=(1.0, -0.5), scale=0.01)
    assert ext.esft_apply([5, 6], [1.0, -0.5], 0.01) == ref.apply(update)
    assert ext.esft_checksum() == masters_checksum(ref)


def test_an_update_after_an_interrupted_member_starts_from_the_centre():
    """A member evaluation stopped while perturbed: the update restores the centre first, so the weights are the
    updated centre, as a PyTorch replica's, not the perturbed member plus the update."""
    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    vm = vllm_like(hf)
    ref = MasterWeights(hf)
    ext = extension(vm)
    ext.esft_init(ref.names, shapes_of(hf))
    ext.esft_perturb(7, 1, 0.05)
    update = Update(seeds=(7, 8), coefficients=(0.5, 1.0), scale=0.01)
    assert ext.esft_apply([7, 8], [0.5, 1.0], 0.01) == ref.apply(update)
    views = hf_views(vm, shapes_of(hf), ref.names)
    assert all(torch.equal(views[n], p) for n, p in ref.params.items())
    assert ext.esft_mismatches() == [] and ext.esft_checksum() == masters_checksum(ref)


def _vllm_layer_utils(monkeypatch) -> list:
    """`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm` (vLLM's CPU weight packing), recording
    its calls; vLLM's own module where vLLM is installed, a stand-in elsewhere."""
    import sys
    import types

    calls: list = []

    def dispatch(layer, remove_weight=True):
        calls.append((layer, remove_weight))

    try:
        import vllm.model_executor.layers.utils as layer_utils
    except ImportError:
        class VocabParallelEmbedding(torch.nn.Module):
            pass

        class ParallelLMHead(VocabParallelEmbedding):
            pass

        names = ["vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.utils",
                 "vllm.model_executor.layers.vocab_parallel_embedding"]
        mods = {n: types.ModuleType(n) for n in names}
        for parent, child in zip(names[:3], names[1:4]):
            setattr(mods[parent], child.rpartition(".")[2], mods[child])
        mods[names[2]].vocab_parallel_embedding = mods[names[4]]
        mods[names[4]].VocabParallelEmbedding = VocabParallelEmbedding
        mods[names[4]].ParallelLMHead = ParallelLMHead
        for n, m in mods.items():
            monkeypatch.setitem(sys.modules, n, m)
        layer_utils = mods[names[3]]
    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", dispatch, raising=False)
    return calls


def test_a_cpu_engines_edited_layers_are_repacked_once_after_each_edit(monkeypatch):
    """Layers with a packed CPU kernel (`cpu_linear`) whose weight esft edits are re-packed, keeping the weight,
    before the next generation after an edit, and only then; a packed layer esft does not edit is left alone."""
    calls = _vllm_layer_utils(monkeypatch)
    hf = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    vm = vllm_like(hf)
    modules = dict(vm.named_modules())
    edited = [modules["model.layers.0.self_attn.qkv_proj"], modules["model.layers.0.mlp.gate_up_proj"]]
    untouched = modules["model.layers.1.self_attn.qkv_proj"]
    for m in edited + [untouched]:
        m.cpu_linear = object()
    selected = [n for n in MasterWeights(hf).names if n.startswith("model.layers.0.")]
    ext = extension(vm)
    assert ext.esft_init(selected, shapes_of(hf))["packed_layers"] == 2
    assert ext.esft_sync() == 0.0 and calls == []  # nothing edited yet
    ext.esft_perturb(3, 1, 0.01)
    seconds = ext.esft_sync()
    assert 0.0 <= seconds < 60.0
    assert [(id(layer), keep) for layer, keep in calls] == [(id(m), False) for m in edited]
    assert ext.esft_sync() == 0.0 and len(calls) == 2  # up to date: no second re-pack
    ext.esft_restore()
    ext.esft_sync()
    assert len(calls) == 4


@pytest.mark.parametrize("text", ["no config.json in /models/x", "no config.json in /models/x\n  (from a traceback)"])
def test_a_plain_refusal_of_vllm_is_said_by_its_first_line(monkeypatch, text):
    """An error without pydantic's `errors()`: its first line, whether it has one line or several."""
    from esft.es.distributed.vllm_backend.vllm_replica import check_engine_config

    def refuse(kwargs):
        raise OSError(text)

    monkeypatch.setattr("esft.models.resolve_model_path", lambda name: "/models/x")
    cfg = ESConfig(model="/models/x", executor="ray", worker_backend="vllm")
    with pytest.raises(ValueError) as info:
        check_engine_config(cfg, model_config=refuse, device_type="cpu")
    assert str(info.value) == ("vLLM cannot run model '/models/x': no config.json in /models/x; use "
                               "--worker-backend hf for this model")


def test_tensor_checksum_sums_the_bit_patterns_at_the_tensors_own_width():
    """Known values: fp32 1.0 = 0x3f800000 and -2.0 = 0xc0000000 (int32 -2**30); bf16 1.0 = 0x3f80, -2.0 = 0xc000
    (int16 -16384); fp16 1.0 = 0x3c00, -2.0 = 0xc000; float64 1.0 = 0x3ff0000000000000."""
    from esft.es.distributed.vllm_backend.extension import tensor_checksum

    pair = [1.0, -2.0]
    assert tensor_checksum(torch.tensor(pair, dtype=torch.float32)) == 0x3F800000 - 2**30
    assert tensor_checksum(torch.tensor(pair, dtype=torch.bfloat16)) == 0x3F80 - 16384
    assert tensor_checksum(torch.tensor(pair, dtype=torch.float16)) == 0x3C00 - 16384
    assert tensor_checksum(torch.tensor([1.0], dtype=torch.float64)) == 0x3FF0000000000000


def test_a_bf16_engines_masters_start_from_the_fp32_weights_of_its_folder(tmp_path):
    """As the driver's (esft.es.start_weights): the engine's folder stores fp32 tensors, so the masters are those,
    not the engine's bf16 rounding; a start that is no folder (a hub id) keeps the engine's own."""
    from safetensors.torch import save_file

    hf32 = tiny_llama(vocab_size=250)
    stored = {n: p.detach().clone().contiguous() for n, p in hf32.named_parameters()}
    save_file(stored, str(tmp_path / "model.safetensors"))
    hf16 = tiny_llama(dtype=torch.bfloat16, vocab_size=250)
    rounded = masters_checksum(MasterWeights(hf16))
    expected = MasterWeights(tiny_llama(dtype=torch.bfloat16, vocab_size=250))
    expected.load_masters(stored)
    ext = extension(vllm_like(hf16))
    ext.esft_init(expected.names, shapes_of(hf16), start=str(tmp_path))
    assert ext.esft_checksum() == masters_checksum(expected) != rounded
    hub = extension(vllm_like(hf16))
    hub.esft_init(expected.names, shapes_of(hf16), start="owner/not-a-folder")
    assert hub.esft_checksum() == rounded


def test_a_cpu_engines_process_gets_its_thread_count_and_no_core_binding(monkeypatch):
    """`threads` sets torch's count (0 and the default leave it); VLLM_CPU_OMP_THREADS_BIND defaults to nobind and
    a value the user set stays."""
    from esft.es.distributed.vllm_backend.vllm_replica import prepare_cpu_process

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    torch.set_num_threads(2)  # one_thread (autouse) restores the count afterwards
    prepare_cpu_process()
    assert torch.get_num_threads() == 2 and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    prepare_cpu_process(0)
    assert torch.get_num_threads() == 2
    prepare_cpu_process(1)
    assert torch.get_num_threads() == 1
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    prepare_cpu_process(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
