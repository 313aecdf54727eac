"""Each row of `LocalExecutor`'s result (esft.es.executor) belongs to its member only: a generate function that
returns another number of completions than prompts is refused, rather than leaving the row's last examples
unscored (0) and its fitness lowered as if the member had got them wrong.

Run: . .venv/bin/activate && pytest -q tests/test_es_executor_rows.py   (~2 s)
"""

from __future__ import annotations

import pytest

from es_tiny import ToyTask, bit_equal, state, stub_generate, tiny_llama
from esft.es.executor import LocalExecutor
from esft.es.noise import MasterWeights


@pytest.mark.parametrize("change", [-1, 1], ids=["one-short", "one-extra"])
@pytest.mark.parametrize("centre", [False, True])
def test_a_generate_that_returns_another_number_of_completions_is_refused(change, centre):
    def generate(model, tokenizer, prompts, cfg):
        gens = stub_generate(model, tokenizer, prompts, cfg)
        return gens[:change] if change < 0 else gens + gens[:change]

    model = tiny_llama()
    ex = LocalExecutor(model, None, MasterWeights(model), ToyTask(), 0.05, None, generate_fn=generate)
    batch = ToyTask().load("train")[:4]
    with pytest.raises(ValueError, match="returned [35] completions for 4 prompts"):
        ex.evaluate_center(batch) if centre else ex.evaluate_members([(1, 1), (2, -1)], batch)
    assert bit_equal(state(model), state(tiny_llama()))  # and the model is left at the centre
