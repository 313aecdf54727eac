"""bf16 linears on AMX tiles (esft/kernels/amx_linear.cpp, esft.generation.packed). Run:
`pytest tests/test_amx_linear.py -q`.

The layout and the dispatch are tested on every machine; the kernel itself where the CPU has AMX (elsewhere those
tests skip, with the reason). Its results must be x W^T to bf16 rounding, row by row independent of the batch and
of the thread count, and on an AMX CPU the bits of oneDNN's bf16 matmul for up to 32 rows.
"""

from __future__ import annotations

import os
import pytest
import torch

from esft import kernels
from esft.generation.packed import amx_linear_reason, pack_weight, packed_linear, packed_linear_bf16, tile_layout


@pytest.fixture(scope="module")
def amx():
    module = kernels.load_amx_linear()
    if module is None:
        pytest.skip(f"AMX linear not available: {kernels.build_error('amx_linear')}")
    return module


def _onednn(x, w, bias=None):
    return torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 32), bias, "none",
                                              [], "")


# ---- the layout and the CPU check: every machine ----------------------------------------------------------------

def test_tile_layout_puts_each_element_where_the_kernel_reads_it():
    n, k = 64, 96
    w = torch.arange(n * k, dtype=torch.float32).reshape(n, k)
    t = tile_layout(w)
    assert t.shape == (2, 3, 16, 32, 2)
    for nb, kb, p, r, j in [(0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0), (1, 2, 15, 31, 1), (1, 0, 7, 3, 0),
                            (0, 2, 9, 30, 1)]:
        assert t[nb, kb, p, r, j] == w[32 * nb + r, 32 * kb + 2 * p + j]
    assert sorted(t.flatten().tolist()) == w.flatten().tolist()  # a permutation: nothing lost or repeated


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile amx_bf16 avx512_bf16\n\nprocessor\t: 1\n")
    flags = kernels.cpu_flags(info)
    assert {"avx512f", "amx_tile", "amx_bf16"} <= set(flags) and "processor" not in flags
    assert kernels.amx_missing(flags) is None
    assert kernels.amx_missing(frozenset({"avx512f", "avx512_bf16"})) == "this CPU has no amx_tile/amx_bf16"
    assert kernels.cpu_flags(tmp_path / "none") == []


def test_a_cpu_without_amx_is_told_so_and_nothing_is_built(monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setattr(kernels, "cpu_flags", lambda *a: frozenset({"avx512f", "avx512_bf16"}))

    def no_build(**kwargs):
        raise AssertionError("a build was tried on a CPU without AMX")

    monkeypatch.setattr(cpp_extension, "load", no_build)
    assert kernels.load_amx_linear() is None
    assert kernels.build_error("amx_linear") == "this CPU has no amx_tile/amx_bf16"
    assert kernels.kernel_status("amx_linear") == "this CPU has no amx_tile/amx_bf16"


def test_a_process_linux_refuses_the_tiles_counts_as_unavailable(monkeypatch):
    class Refused:
        @staticmethod
        def available():
            return False

    monkeypatch.setattr(kernels, "_CACHE", {"amx_linear": Refused()})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setattr(kernels, "cpu_flags", lambda *a: frozenset(kernels.AMX_FLAGS))
    assert kernels.load_amx_linear() is None
    assert "did not grant" in kernels.build_error("amx_linear")
    assert kernels.load_amx_linear() is None  # and stays so


def test_weights_the_kernel_cannot_take_keep_onednns_layout(monkeypatch):
    fp32 = torch.randn(64, 64)
    assert "bf16" in amx_linear_reason(fp32)
    assert pack_weight(fp32, 8).layout == torch._mkldnn
    odd = torch.randn(48, 64).to(torch.bfloat16)
    assert "multiples of 32" in amx_linear_reason(odd)
    assert pack_weight(odd, 8).layout == torch._mkldnn
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(packed_linear(x, pack_weight(odd, 8)), _onednn(x, odd))


def test_without_the_kernel_bf16_weights_run_on_onednn(monkeypatch):
    """The branch of a CPU without AMX (AMD's, or an Intel without it), on any machine."""
    monkeypatch.setattr(kernels, "load_amx_linear", lambda: None)
    w = torch.randn(64, 96).to(torch.bfloat16)
    assert "not available" in amx_linear_reason(w)
    handle = pack_weight(w, 8)
    assert handle.layout == torch._mkldnn
    x = torch.randn(7, 96)
    assert torch.equal(packed_linear_bf16(x, handle), _onednn(x.to(torch.bfloat16), w).to(torch.float32))


def test_a_finished_build_older_than_the_shared_header_is_not_imported(tmp_path, monkeypatch):
    """A read-only cache's build is imported without torch's loader only when newer than its sources, and the
    kernels' shared header is one of them."""
    import importlib.util

    source, header = tmp_path / "k.cpp", tmp_path / kernels.COMMON_HEADER
    source.write_text("")
    header.write_text("")
    folder = tmp_path / "build"
    folder.mkdir()
    library = folder / "esft_k_x.so"
    library.write_bytes(b"not a library")
    now = library.stat().st_mtime
    os.utime(source, (now - 60, now - 60))
    os.utime(header, (now + 60, now + 60))
    tried = []
    real = importlib.util.spec_from_file_location
    monkeypatch.setattr(importlib.util, "spec_from_file_location", lambda *a, **k: tried.append(a[1]) or real(*a, **k))
    assert kernels._import_finished_build(folder, "esft_k_x", source) is None
    assert tried == []  # stale: not even tried
    os.utime(header, (now - 60, now - 60))
    assert kernels._import_finished_build(folder, "esft_k_x", source) is None  # tried: not a library
    assert tried == [library]


# ---- the kernel: CPUs with AMX ----------------------------------------------------------------------------------

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (64, 32), (32, 64)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_compiled_pack_is_the_tile_layout(amx, n, k):
    w = torch.randn(n, k).to(torch.bfloat16)
    assert torch.equal(amx.pack(w), tile_layout(w))
    assert torch.equal(pack_weight(w, 32), tile_layout(w))


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 31, 32, 33, 64, 100, 300])
def test_linear_is_x_w_to_bf16_rounding(amx, n, k, rows):
    gen = torch.Generator().manual_seed(rows * 7 + n)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen)
    out = amx.linear(x, tile_layout(w), bias)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
    exact = x.double() @ w.double().T + bias.double()
    # the final bf16 rounding (unit roundoff 2^-8) of an fp32 sum of K + 1 terms (error at most (K + 1) 2^-24 of
    # the sum of their magnitudes, doubled for the rounding's own error on it)
    scale = x.double().abs() @ w.double().abs().T + bias.double().abs()
    bound = 2.0 ** -8 * exact.abs() + (k + 1) * 2.0 ** -23 * scale + 1e-30
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("rows", [1, 5, 16, 29, 32])
def test_up_to_32_rows_give_onednns_bits(amx, rows):
    """What the lean engine ran before this kernel (oneDNN's AMX matmul): the same bits for decode-sized batches."""
    for n, k in SHAPES[:4]:
        w = torch.randn(n, k).to(torch.bfloat16)
        x = torch.randn(rows, k).to(torch.bfloat16)
        b = torch.randn(n).to(torch.bfloat16)
        assert torch.equal(packed_linear(x, pack_weight(w, 32)), _onednn(x, w))
        assert torch.equal(packed_linear(x, pack_weight(w, 32), b), _onednn(x, w, b))


def test_a_rows_result_does_not_depend_on_the_batch_or_the_threads(amx):
    w = tile_layout(torch.randn(3072, 576).to(torch.bfloat16))
    x = torch.randn(300, 576).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = amx.linear(x, w, None)
        torch.set_num_threads(1)
        assert torch.equal(amx.linear(x, w, None), whole)
    finally:
        torch.set_num_threads(threads)
    for start, stop in [(0, 1), (17, 18), (40, 73), (299, 300), (256, 300)]:
        assert torch.equal(amx.linear(x[start:stop].contiguous(), w, None), whole[start:stop])
    assert amx.linear(x[:0].contiguous(), w, None).shape == (0, 3072)


def test_bad_input_is_refused(amx):
    w = tile_layout(torch.randn(64, 64).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16"):
        amx.linear(torch.randn(3, 64), w, None)
    with pytest.raises(RuntimeError, match="columns"):
        amx.linear(torch.randn(3, 32).to(torch.bfloat16), w, None)
    with pytest.raises(RuntimeError, match="packed"):
        amx.linear(torch.randn(3, 64).to(torch.bfloat16), torch.randn(64, 64).to(torch.bfloat16), None)
    with pytest.raises(RuntimeError, match="bias"):
        amx.linear(torch.randn(3, 64).to(torch.bfloat16), w, torch.randn(63))
    with pytest.raises(RuntimeError, match="multiples of 32"):
        amx.pack(torch.randn(48, 64).to(torch.bfloat16))


def test_the_lean_engines_bf16_rollouts_run_on_it(amx, tokenizer, monkeypatch):
    """bf16 rollouts (packed bf16 weights, esft's fast generation) multiply through the kernel: the stacked layers,
    the prompts' logits and the lm_head screen."""
    from test_lean import PROMPTS, _tiny

    from esft.config import FAST_CPU_GENERATION
    from esft.es.lanes import rollout_replica
    from esft.generation import GenerationConfig, generate

    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(amx, name)

        def linear(self, x, w, bias):
            calls.append((x.shape[0], w.shape[0] * 32))
            return amx.linear(x, w, bias)

    monkeypatch.setattr(kernels, "load_amx_linear", lambda: Counting())
    low = rollout_replica(_tiny("llama"), torch.bfloat16)
    out = generate(low, tokenizer, PROMPTS[:3], GenerationConfig(max_new_tokens=4, batch_size=3,
                                                                 **FAST_CPU_GENERATION))
    assert len(out) == 3
    cfg = low.config
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.hidden_size // cfg.num_attention_heads
    widths = {n for _, n in calls}
    assert {qkv, cfg.hidden_size, 2 * cfg.intermediate_size, cfg.vocab_size} <= widths
    assert any(rows <= 3 and n == qkv for rows, n in calls)  # the decode steps


def test_other_threads_run_while_it_multiplies(amx):
    """ES lanes are threads of one process: a kernel holding the GIL would run them one at a time."""
    import threading
    import time

    w = tile_layout(torch.randn(3072, 576).to(torch.bfloat16))
    x = torch.randn(4096, 576).to(torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        amx.linear(x, w, None)
        start = time.perf_counter()
        amx.linear(x, w, None)
        took = time.perf_counter() - start
        worker = threading.Thread(target=amx.linear, args=(x, w, None))
        stamps = [time.perf_counter()]
        worker.start()
        while worker.is_alive():
            stamps.append(time.perf_counter())
        worker.join()
    finally:
        torch.set_num_threads(threads)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert max(gaps) < took / 2, (max(gaps), took)


def test_packed_linear_takes_any_leading_shape_and_strides(amx):
    w = torch.randn(64, 96).to(torch.bfloat16)
    handle = pack_weight(w, 8)
    x = torch.randn(3, 5, 96).to(torch.bfloat16)
    flat = packed_linear(x.reshape(15, 96), handle)
    assert torch.equal(packed_linear(x, handle), flat.view(3, 5, 64))
    strided = torch.randn(15, 192).to(torch.bfloat16)[:, ::2]  # every other column: not contiguous
    assert torch.equal(packed_linear(strided, handle), packed_linear(strided.contiguous(), handle))


def _screen_packing(w, monkeypatch):
    """An LMHeadScreen of `w`, and the shapes `pack_weight` was handed while it was built."""
    from esft.generation import packed
    from esft.generation.vocab import VocabRows

    shapes, real = [], packed.pack_weight

    def recording(weight, batch_hint):
        shapes.append(tuple(weight.shape))
        return real(weight, batch_hint)

    monkeypatch.setattr(packed, "pack_weight", recording)
    return packed.LMHeadScreen(VocabRows(w), 4), shapes


def test_without_the_kernel_the_screen_packs_its_bf16_copy_whole(monkeypatch):
    """oneDNN's blocked layout is packed from the whole plain bf16 matrix (any machine: the kernel hidden)."""
    from esft.generation.packed import ROW_NORM_BLOCK, onednn_bf16

    if not onednn_bf16():
        pytest.skip("this torch's oneDNN has no bf16 matmul")
    monkeypatch.setattr(kernels, "load_amx_linear", lambda: None)
    w = torch.randn(ROW_NORM_BLOCK + 96, 64)
    screen, shapes = _screen_packing(w, monkeypatch)
    assert shapes == [tuple(w.shape)]
    assert screen.packed_bf16.layout == torch._mkldnn


def test_the_screen_writes_its_bf16_copy_into_the_tiles_strip_by_strip(amx, monkeypatch):
    """With the AMX linear the screen never holds a whole plain bf16 copy beside the packed one (54 MiB for
    SmolLM2's lm_head, at every member): blocks of rows are packed into their place, and the result is the bits
    of packing the whole matrix."""
    from esft.generation.packed import ROW_NORM_BLOCK

    w = torch.randn(2 * ROW_NORM_BLOCK + 96, 64, generator=torch.Generator().manual_seed(5))
    screen, shapes = _screen_packing(w, monkeypatch)
    assert [s[0] for s in shapes] == [ROW_NORM_BLOCK, ROW_NORM_BLOCK, 96]
    assert torch.equal(screen.packed_bf16, tile_layout(w.to(torch.bfloat16)))
