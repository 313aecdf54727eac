"""DART-ES (esft.es.dart) edges the rule tests leave open: option values written as text, and the refusal to
score a batch the rule did not propose. Pure numpy, no model.

Run: pytest tests/test_es_dart_audit.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from esft.es.dart import DartES, DartOptions


def test_option_values_written_as_text_are_read_as_numbers():
    """YAML 1.1 reads `1e-3` as text and a quoted number is text: each becomes its field's type, so a spec that
    writes them is neither refused nor run with a string."""
    opts = DartOptions.from_dict({"priority_temperature": "1e-3", "cooldown": " 2 ", "ema_decay": "0.5"})
    assert (opts.priority_temperature, opts.cooldown, opts.ema_decay) == (1e-3, 2, 0.5)
    assert isinstance(opts.cooldown, int) and isinstance(opts.priority_temperature, float)
    with pytest.raises(ValueError, match=r"DART-ES option cooldown = '2.5' is not accepted; expected an integer"):
        DartOptions.from_dict({"cooldown": "2.5"})
    with pytest.raises(ValueError, match=r"option weight_floor = 'high' is not accepted"):
        DartOptions.from_dict({"weight_floor": "high"})


def test_a_batch_of_another_size_than_the_proposed_one_is_refused():
    """Scoring answers of another batch would update the state of the proposed problems with foreign answers."""
    rule = DartES()
    rule.bind(10, seed=0)
    idx = rule.sample_batch(0, 0, 10, 4)
    answers = SimpleNamespace(scores=np.ones((2, 3)), well_formed=np.ones((2, 3), bool))
    before = rule.state_dict()
    with pytest.raises(RuntimeError, match="scores only batches it proposed"):
        rule(answers, [{}] * 3)
    assert rule.state_dict() == before
    full = SimpleNamespace(scores=np.ones((2, 4)), well_formed=np.ones((2, 4), bool))
    assert rule(full, [{}] * len(idx)).shape == (2,)
