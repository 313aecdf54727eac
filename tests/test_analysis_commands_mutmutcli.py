"""`esft analyze` commands (esft.analysis.commands): what a missing law parameter says, and the greedy decoding the
evaluating analyses use. The analyses themselves are replaced by recorders. Run:
`pytest tests/test_analysis_commands_mutmutcli.py -q`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.mark.parametrize("recorded", [{"alpha": 0.5}, {"population_size": 8}])
def test_drift_with_only_one_of_alpha_and_population_names_both(tmp_path, monkeypatch, recorded):
    from esft.analysis import commands as C
    from esft.analysis import drift as D

    es = tmp_path / "es"
    es.mkdir()
    (es / "config.yaml").write_text(yaml.safe_dump(recorded))
    (es / "drift.jsonl").write_text("{}\n")
    monkeypatch.setattr(D, "read_series", lambda p: f"series:{Path(p).parent.name}")
    monkeypatch.setattr(D, "analyze_series", lambda s, a, n: pytest.fail("the law needs both alpha and N"))
    with pytest.raises(ValueError, match="alpha and population are needed"):
        C.run_drift(C.DriftConfig(run=str(es), output_dir=str(tmp_path / "o")))


def test_kl_defaults_to_greedy_completions_as_the_papers_evaluation():
    from esft.analysis.commands import KLConfig

    assert KLConfig().temperature == 0.0


@pytest.mark.parametrize("device", [None, "cpu"])
def test_drift_replays_on_the_device_given_else_leaves_the_run_s_own_to_the_replay(tmp_path, monkeypatch, device):
    from esft.analysis import commands as C
    from esft.analysis import drift as D
    from esft.es import replay

    es = tmp_path / "es"
    es.mkdir()
    (es / "config.yaml").write_text(yaml.safe_dump({"alpha": 0.5, "population_size": 8}))
    (es / "seeds.jsonl").write_text("{}\n")
    loads, replays = [], []

    class Series:
        def write(self, path):
            pass

    monkeypatch.setattr(replay, "load_base", lambda run, device=None: loads.append((run, device)) or ("m", "t"))
    monkeypatch.setattr(D, "es_series", lambda run, model=None, progress=False: replays.append(model) or Series())
    monkeypatch.setattr(D, "analyze_series", lambda s, a, n: {"tensors": {}})
    monkeypatch.setattr(D, "plot_total", lambda *a, **k: None)
    C.run_drift(C.DriftConfig(run=str(es), device=device, output_dir=str(tmp_path / "o")))
    # a device given loads the base there; none leaves es_series to load it as the run recorded
    assert loads == ([(es, "cpu")] if device else []) and replays == (["m"] if device else [None])


def test_the_random_direction_takes_the_per_tensor_norms_of_the_es_update_it_is_named_after(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import landscape as L

    es, grpo = tmp_path / "es", tmp_path / "grpo"
    es.mkdir()
    grpo.mkdir()
    randoms = []

    class Delta:
        def __init__(self, base, path, label):
            self.label, self.norm = label, 2.0 if label == "ES" else 8.0

        def bind(self, model):
            return self

    class Random(Delta):
        def __init__(self, like, seed, label):
            randoms.append((like.label, label))
            self.label, self.norm = label, like.norm

    monkeypatch.setattr(C, "model_folder", lambda spec: f"resolved:{spec}")
    monkeypatch.setattr(C, "load_with_weights", lambda base, w, dtype, device: ("model", "tok"))
    monkeypatch.setattr(L, "prepare_tasks", lambda names, limit, task_options: {})
    monkeypatch.setattr(L, "DeltaDirection", Delta)
    monkeypatch.setattr(L, "RandomDirection", Random)
    monkeypatch.setattr(L, "interpolation_path", lambda *a, **k: {})
    monkeypatch.setattr(L, "default_magnitudes", lambda norms, points: [0.0])
    monkeypatch.setattr(L, "direction_sweep", lambda *a, **k: {})
    monkeypatch.setattr(L, "plot_interpolation", lambda *a: None)
    monkeypatch.setattr(L, "plot_direction_sweep", lambda *a, **k: None)
    C.run_landscape(C.LandscapeConfig(base="b", es=str(es), grpo=str(grpo), tasks=["boolq"],
                                      output_dir=str(tmp_path / "o")))
    assert randoms == [("ES", "random (per-tensor norms of ES)")]
