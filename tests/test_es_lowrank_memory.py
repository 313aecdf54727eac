"""A low-rank rank whose population's factors cannot fit in memory is refused before the model loads
(esft.es.lowrank.factor_bytes / check_factor_memory, wired by esft.es.build.check_lowrank_memory).

Run: PYTHONPATH=src pytest -q tests/test_es_lowrank_memory.py   (seconds, CPU)
"""

from __future__ import annotations

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import tiny_llama
from esft.es import build
from esft.es.es_config import PRESETS, ESConfig, preset
from esft.es.lowrank import (LowRankWeights, PopulationPerturbation, check_factor_memory, factor_bytes,
                             held_factor_bytes)

GIB = 1 << 30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_held_bytes_are_the_factors_a_population_perturbation_really_holds(dtype):
    model = tiny_llama(dtype=dtype)  # tied embedding / lm_head: one pair of factors
    weights = LowRankWeights(model, rank=3)
    members = [(11, 1), (11, -1), (12, 1)]
    shapes = [tuple(p.shape) for p in weights.params.values()]
    with PopulationPerturbation(model, weights, members, 0.01) as pert:
        real = sum(t.nbytes for pair in pert.factors.values() for t in pair)
    assert real == held_factor_bytes(shapes, 3, 3, dtype.itemsize)


def test_peak_bytes_count_the_fp32_scratch_of_the_matrix_being_built():
    # one [3, 2] matrix, 2 members, rank 1, fp32: member parts 4 * (2 * (3 + 2) + 3) = 52 bytes (the last raw A
    # included), then the concatenated A and its transposed copy (2 * 4 * 2 * 3 = 48): 100
    assert factor_bytes([(3, 2)], 2, 1, 4) == 100
    # a second matrix is built beside the first one's held factors (2 * (3 + 2) * 4 = 40 bytes)
    assert factor_bytes([(3, 2), (3, 2)], 2, 1, 4) == 140
    # bf16: B phase = parts + A_cat^T in bf16 (12) + concatenated B (16) + its bf16 cast (8) = 88 < 100
    assert factor_bytes([(3, 2)], 2, 1, 2) == 100
    shapes = [(576, 49152), (576, 576), (1536, 576)]
    for rank in (1, 7, 64):
        assert factor_bytes(shapes, 8, rank, 4) == rank * factor_bytes(shapes, 8, 1, 4)
        assert factor_bytes(shapes, 8, rank, 4) >= held_factor_bytes(shapes, 8, rank, 4)


def test_a_rank_whose_factors_exceed_the_available_memory_is_refused_with_the_largest_rank_that_fits():
    shapes = [(576, 49152), (576, 576)]
    per_rank = factor_bytes(shapes, 30, 1, 4)
    available = 10 * per_rank + per_rank // 2
    check_factor_memory(shapes, 30, 10, 4, available)
    with pytest.raises(ValueError) as err:
        check_factor_memory(shapes, 30, 11, 4, available)
    message = str(err.value)
    assert "rank 11" in message and "the largest rank that fits is 10" in message
    assert f"{factor_bytes(shapes, 30, 11, 4) / GIB:.2f} GiB" in message and f"{available / GIB:.2f} GiB" in message
    with pytest.raises(ValueError, match="not even rank 1 fits"):
        check_factor_memory(shapes, 30, 1, 4, per_rank - 1)
    check_factor_memory(shapes, 30, 100000, 4, None)  # unknown memory: no refusal


def test_the_trainer_refuses_a_huge_rank_from_the_skeleton_before_the_weights_load(tmp_path, monkeypatch):
    import esft.models
    from esft.es.trainer import ESTrainer

    tiny_llama(hidden=16, layers=1).save_pretrained(tmp_path / "m")

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded")

    monkeypatch.setattr(esft.models, "load_model", no_weights)
    monkeypatch.setattr(build, "available_memory", lambda: 64 << 20)
    config = dict(model=str(tmp_path / "m"), task="boolq", output_dir=str(tmp_path / "run"), noise="lowrank",
                  device="cpu", population_size=4)
    with pytest.raises(ValueError, match="the largest rank that fits is"):
        ESTrainer(ESConfig(**config, rank=100000), progress=False)
    with pytest.raises(AssertionError, match="the weights loaded"):  # a normal rank goes on to load the weights
        ESTrainer(ESConfig(**config, rank=4), progress=False)
    # full-rank noise, another device (host memory is not what the factors take there) or unknown memory: no check
    build.check_lowrank_memory(ESConfig(**{**config, "noise": "table"}, rank=100000))
    build.check_lowrank_memory(ESConfig(**{**config, "device": "cuda"}, rank=100000))
    # the model's dtype sets the bytes of the held factors: bf16 fits where fp32 does not (without the embedding,
    # whose fp32 scratch would outweigh every held factor of this tiny model)
    config["exclude"] = ["embed"]
    matrices = LowRankWeights(tiny_llama(hidden=16, layers=1), exclude=["embed"]).params.values()
    shapes = [tuple(p.shape) for p in matrices]
    bf16, fp32 = factor_bytes(shapes, 4, 64, 2), factor_bytes(shapes, 4, 64, 4)
    monkeypatch.setattr(build, "available_memory", lambda: (bf16 + fp32) // 2)
    build.check_lowrank_memory(ESConfig(**config, rank=64, dtype="bfloat16"))
    with pytest.raises(ValueError, match="rank 64"):
        build.check_lowrank_memory(ESConfig(**config, rank=64, dtype="float32"))
    monkeypatch.setattr(build, "available_memory", lambda: None)
    build.check_lowrank_memory(ESConfig(**config, rank=100000))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_shipped_presets_and_a_normal_rank_fit_a_small_machine(name, monkeypatch):
    """SmolLM2-135M (the default model, read offline): rank 1 and 4 need well under 2 GiB for every preset's
    population; rank 100000 (~4 TB for 30 members) does not."""
    monkeypatch.setattr(build, "available_memory", lambda: 2 * GIB)
    for rank in (1, 4):
        build.check_lowrank_memory(preset(name, noise="lowrank", rank=rank, device="cpu"))
    with pytest.raises(ValueError, match="rank 100000"):
        build.check_lowrank_memory(preset(name, noise="lowrank", rank=100000, device="cpu"))


def test_peak_bytes_of_a_wide_matrix_are_its_b_phase():
    # one [2, 3] matrix (more columns than rows), 2 members, rank 1: member parts 4 * (2 * (2 + 3) + 2) = 48 bytes;
    # A phase: + the concatenated A and its transposed copy (8 * 2 * 2 = 32) = 80; B phase: + the kept A_cat^T
    # (fp32: 16 bytes) + the concatenated B (4 * 2 * 3 = 24) = 88, the larger one
    assert factor_bytes([(2, 3)], 2, 1, 4) == 88
    # bf16: B phase = parts + A_cat^T in bf16 (8) + concatenated B (24) + its bf16 cast (12) = 92 > A phase (80)
    assert factor_bytes([(2, 3)], 2, 1, 2) == 92
    # the second matrix is built beside the first one's held factors (bf16: 2 * 2 * (2 + 3) = 20 bytes)
    assert factor_bytes([(2, 3), (2, 3)], 2, 1, 2) == 20 + 92


def test_a_budget_of_exactly_one_rank_names_rank_1_as_the_largest_that_fits():
    shapes = [(576, 49152), (576, 576)]
    per_rank = factor_bytes(shapes, 30, 1, 4)
    check_factor_memory(shapes, 30, 1, 4, per_rank)
    with pytest.raises(ValueError, match="the largest rank that fits is 1$"):
        check_factor_memory(shapes, 30, 2, 4, per_rank + per_rank // 2)
