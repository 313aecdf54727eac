"""Shared fixtures. Run the whole suite with `pytest -q`; the quick part with `pytest -q -m "not slow"`.

`tokenizer` is the real SmolLM2 tokenizer (from the embedded model, converted once to the esft cache);
`tiny_model` is a random-init Llama with that vocabulary, small enough for trainer tests on CPU.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# trackio's runs go to a folder of this session, not the user's (trackio reads it once, when it is imported)
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="esft-tests-trackio-")
atexit.register(shutil.rmtree, os.environ["TRACKIO_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer():
    from esft.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


def record_kv_reuse(monkeypatch) -> list[bool]:
    """Patch `KVBuffers.take` to record, for each buffer a KV cache takes, whether it is one given back earlier
    (by data pointer), so a test can tell reuse from fresh allocation."""
    from esft.generation.kv_cache import KVBuffers

    take = KVBuffers.take
    reused: list[bool] = []

    def recording_take(self, shape, dtype, device):
        given = {t.data_ptr() for kept in self._free.values() for t in kept}
        out = take(self, shape, dtype, device)
        reused.append(out.data_ptr() in given)
        return out

    monkeypatch.setattr(KVBuffers, "take", recording_take)
    return reused


def make_tiny_model(vocab_size: int = 49152, seed: int = 0, hidden: int = 64, layers: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    return model


def bf16_es_checkpoint(folder, tokenizer, model, shift: float = 1e-4) -> dict:
    """`folder` as an ES checkpoint of a bf16 model: `model` rounded to bf16 in its model file, fp32 masters
    (the rounded values + `shift`, below bf16's spacing) in masters.safetensors beside it; returns the masters."""
    import torch
    from safetensors.torch import save_file

    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    exact = {n: p.detach().float() + shift for n, p in model.named_parameters()}
    save_file(exact, str(folder / "masters.safetensors"))
    return exact


def prefix_caches(model, prefix_cache, rows: int, copies: int = 2) -> list:
    """`copies` independent DynamicCaches, each holding `prefix_cache`'s one row of keys and values repeated for
    `rows` rows: a shared prompt prefix already in the cache (share_prefix), one per prefill compared."""
    from transformers import DynamicCache

    caches = []
    for _ in range(copies):
        c = DynamicCache(config=model.config)
        for i, layer in enumerate(prefix_cache.layers):
            c.update(layer.keys.expand(rows, -1, -1, -1).contiguous(),
                     layer.values.expand(rows, -1, -1, -1).contiguous(), i)
        caches.append(c)
    return caches


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A random-init Llama with the SmolLM2 tokenizer saved as a model folder (what `--model PATH` loads)."""
    from esft.models import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model().save_pretrained(folder)
    load_tokenizer("smollm2-135m").save_pretrained(folder)
    return folder


@pytest.fixture()
def tiny_model():
    return make_tiny_model()


@pytest.fixture()
def es_cli(tmp_path, tokenizer):
    """`esft train es` on a tiny random model and a 20-line data task (2 iterations of 2 members, an evaluation
    every iteration), as a function of the output folder and extra flags; returns the exit code."""
    import json

    from esft.cli import main

    folder = tmp_path / "tiny"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(20)))

    def run(out, *extra):
        return main(["train", "es", "--model", str(folder), "--task", str(data), "--iterations", "2",
                     "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "3", "--eval-every", "1",
                     "--eval-limit", "2", "--device", "cpu", "--dtype", "float32", "--output-dir", str(out),
                     *extra])
    return run


@contextlib.contextmanager
def torch_threads(n: int):
    """torch on `n` threads inside the block, then as before."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture()
def one_thread():
    """One thread: fast and deterministic on a shared 2-core machine."""
    with torch_threads(1):
        yield


@pytest.fixture()
def two_threads():
    """Lanes split torch's threads: 2 threads -> 2 lanes of 1 (this machine's layout)."""
    with torch_threads(2):
        yield


def load_spec_text(tmp_path, text: str):
    """An experiment spec parsed from `text`, written as spec.yaml in `tmp_path` (errors name its lines)."""
    from esft.experiments import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


def importable_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    """`source` written as module `name` in `tmp_path`, importable for this test (a user's reward or task module,
    imported afresh even when an earlier test imported one of that name)."""
    import sys

    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


@pytest.fixture()
def user_tasks(tmp_path, monkeypatch):
    """The module `obj_tasks` of tests/user_task_classes.py, importable as a user's script module would be."""
    import sys

    from user_task_classes import USER_TASKS

    (tmp_path / "obj_tasks.py").write_text(USER_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("obj_tasks", None)
    import obj_tasks

    return obj_tasks
