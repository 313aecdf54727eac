"""`esft bench --memory-rounds N` (esft.bench.memory): each side's peak RSS from its own process, alternated
rounds, the commands the `cpu` preset implies, and refusals before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from esft.bench import format_table
from esft.bench.memory import memory_commands, peak_rss_kb, peak_rss_rounds


def _allocating(mib: int, mark: Path, name: str) -> list[str]:
    """A process that records its name in `mark`, then holds `mib` MiB written page by page."""
    code = (f"open({str(mark)!r}, 'a').write({name!r} + ' '); b = bytearray({mib} << 20); "
            "b[::4096] = b'\\x01' * len(b[::4096])")
    return [sys.executable, "-c", code]


def test_each_process_s_own_peak_is_read_not_this_one_s(tmp_path):
    mark = tmp_path / "order"
    held = bytearray(400 << 20)  # this process's peak (as the bench's, which holds the model) must not count
    held[::4096] = b"\x01" * len(held[::4096])
    big = peak_rss_kb(_allocating(300, mark, "big"), tmp_path / "big.log")
    small = peak_rss_kb(_allocating(20, mark, "small"), tmp_path / "small.log")
    assert big - small > 250 * 1024  # kB: the 280 MiB more the first one held, not the parent's or a sum
    assert small < 100 * 1024
    del held


def test_rounds_alternate_es_then_evaluation_and_give_each_round_s_ratio(tmp_path):
    mark = tmp_path / "order"
    report = peak_rss_rounds(lambda k: (_allocating(240, mark, "es"), _allocating(60, mark, "eval")), 3, tmp_path,
                             log=lambda msg: None)
    assert mark.read_text().split() == ["es", "eval"] * 3
    assert len(report["rounds"]) == 3
    for r in report["rounds"]:
        assert r["es_peak_rss_kb"] > r["eval_peak_rss_kb"] + 150 * 1024
        assert r["ratio"] == round(r["es_peak_rss_kb"] / r["eval_peak_rss_kb"], 3)
    ratios = sorted(r["ratio"] for r in report["rounds"])
    assert (report["ratio_min"], report["ratio_median"], report["ratio_max"]) == (ratios[0], ratios[1], ratios[2])
    assert report["es_command"].startswith(f"{sys.executable} -c ")
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [f"{s}-{k}.log" for s in ("es", "eval")
                                                            for k in (1, 2, 3)]
    table = format_table({"matmul_gflops": 1.0, "dtype": "float32", "threads": 2, "params": 1e6, "population": 4,
                          "noise": "table", "generation_overrides": {}, "workloads": {}, "memory": report})
    assert f"ES over the evaluation {ratios[0]:.2f}-{ratios[2]:.2f}x (median {ratios[1]:.2f}x)" in table


def test_a_failing_side_raises_with_its_output(tmp_path):
    failing = [sys.executable, "-c", "import sys; print('no such task'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"exited with 3:\nno such task"):
        peak_rss_kb(failing, tmp_path / "x.log")


def test_the_commands_are_the_cpu_preset_and_an_evaluation_of_its_batch(tmp_path):
    from esft.cli import build_parser
    from esft.es.es_config import PRESETS

    es, evaluation = memory_commands("some-model", tmp_path)
    assert es[:3] == evaluation[:3] == [sys.executable, "-m", "esft"]
    parser = build_parser()
    es_args, eval_args = parser.parse_args(es[3:]), parser.parse_args(evaluation[3:])
    preset = PRESETS["cpu"]
    assert (es_args.preset, es_args.model, es_args.iterations, es_args.eval_every) == ("cpu", "some-model", 1, 0)
    assert eval_args.model == "some-model" and eval_args.tasks == [preset["task"]]
    assert eval_args.limit == preset["batch_size"] and eval_args.max_new_tokens == preset["max_new_tokens"]
    assert eval_args.max_passage_chars == preset["max_passage_chars"]
    assert eval_args.batch_size == preset["generation_batch_size"]
    assert Path(es_args.output_dir).parent == Path(eval_args.output_dir).parent == tmp_path


def test_negative_memory_rounds_are_refused_before_the_model_loads(monkeypatch, capsys):
    import esft.models
    from esft.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(esft.models, "load_model", no_load)
    assert main(["bench", "--workloads", "cpu-preset", "--memory-rounds", "-1"]) == 2
    assert "--memory-rounds" in capsys.readouterr().err


def test_every_round_writes_its_own_folders(tmp_path, monkeypatch):
    """An ES run refuses an output folder that holds a run: round 2 used to reuse round 1's and fail."""
    import esft.bench.memory as memory

    def once(folder: Path) -> list[str]:  # like `esft train es`: refuses a folder already written
        code = f"import os, sys; p = {str(folder)!r}; sys.exit(2) if os.path.exists(p) else os.makedirs(p)"
        return [sys.executable, "-c", code]

    made = []

    def commands(model, output):
        made.append(output)
        return once(output / "es"), once(output / "eval")

    monkeypatch.setattr(memory, "memory_commands", commands)
    report = memory.measure_memory("m", 3, log=lambda msg: None)
    assert len(report["rounds"]) == 3 and len(set(made)) == 3


def test_a_failed_measurement_is_reported_and_named_in_the_table(tmp_path, monkeypatch):
    import esft.bench.memory as memory

    failing = [sys.executable, "-c", "import sys; print('no such task'); sys.exit(3)"]
    monkeypatch.setattr(memory, "memory_commands", lambda model, output: (failing, failing))
    assert "exited with 3:\nno such task" in memory.measure_memory("m", 2, log=lambda msg: None)["error"]
    table = format_table({"matmul_gflops": 1.0, "dtype": "float32", "threads": 2, "params": 1e6, "population": 4,
                          "noise": "table", "generation_overrides": {}, "workloads": {},
                          "memory": {"error": "esft train es ... exited with 2"}})
    assert "peak RSS not measured: esft train es ... exited with 2" in table
