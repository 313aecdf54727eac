"""One stage's evaluation (esft.experiments.stage_eval.evaluate_stage) called twice on its own, below the runner's
skipping of done stages: a task whose greedy and sampled files are both current is read back, no model loaded;
the seconds each evaluation records are its own duration; the sampled line prints the pass@k values. Tiny random Llama (seconds).

Run: PYTHONPATH=src pytest -q tests/test_stage_eval_mutrep.py
"""

from __future__ import annotations

import json
import time

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.experiments import load_spec
from esft.experiments.stage_eval import evaluate_stage
from experiments_tiny import ES_BLOCK, TinyHooks, write_spec


def test_a_stage_evaluated_greedy_and_sampled_is_read_back_without_a_model(tmp_path, tokenizer, capsys):
    spec = load_spec(write_spec(tmp_path / "s.yaml", "single-task", ["boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                                evaluation={"limit": 1, "max_new_tokens": 2, "batch_size": 8, "holdout": [],
                                            "passk": {"samples": 2, "temperature": 1.0}}))
    tiny = TinyHooks(tokenizer)
    loads = []

    def load(*args):
        loads.append(args)
        return tiny.load_model(*args)

    t0 = time.perf_counter()
    first = evaluate_stage(spec, "tiny", ["boolq"], tmp_path / "base", load, progress=True, root=tmp_path)
    elapsed = time.perf_counter() - t0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "sampled x2:" in x]
    # right/wrong scores: the line prints the pass@k values, not the reason a reward has none
    assert f"pass@1 {first['boolq']['sampled']['pass@k']['1']['value']:.3f}, pass@2 " in line and "n/a" not in line
    assert len(loads) == 1
    # each recorded duration is a part of the call's, not a clock reading
    assert 0 <= first["boolq"]["seconds"] <= elapsed
    assert 0 <= first["boolq"]["sampled"]["seconds"] <= elapsed
    again = evaluate_stage(spec, "tiny", ["boolq"], tmp_path / "base", load, progress=False, root=tmp_path)
    assert len(loads) == 1  # both files current: nothing generated again
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)
