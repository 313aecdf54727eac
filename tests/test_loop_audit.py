"""The decode loop (esft.generation.loop.decode_loop) against a scripted step function: per-row finishing, eos
handling, the forwards it asks for, and which row's random stream each sampled token comes from.

Run: pytest tests/test_loop_audit.py -q   (pure torch, no model)
"""

from __future__ import annotations

import torch

from esft.generation import GenerationConfig
from esft.generation.loop import decode_loop, row_streams

V = 12  # vocabulary of the scripted rows
EOS = 2


def _peaked(tokens: list[int]) -> torch.Tensor:
    """Logits [n, V] whose argmax in row i is tokens[i]."""
    logits = torch.zeros(len(tokens), V)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


class ScriptedStep:
    """A DecodeStep whose next logits for the batch's original row r after loop step s come from `script(r, s)`
    (s + 1 is the index of the token they predict); records what the loop feeds it and which rows it keeps."""

    def __init__(self, batch: int, script):
        self.rows = torch.arange(batch)  # original row of each live row
        self.script = script
        self.calls: list[tuple[int, list[int], list[int]]] = []  # (step, original rows, tokens fed)
        self.kept: list[list[int]] = []

    def keep(self, index: torch.Tensor) -> None:
        self.kept.append(index.tolist())
        self.rows = self.rows[index]

    def __call__(self, token: torch.Tensor, step: int) -> torch.Tensor:
        self.calls.append((step, self.rows.tolist(), token.tolist()))
        return torch.stack([self.script(int(r), step) for r in self.rows])


def _greedy_script(tokens: list[list[int]]):
    """Row r's greedy tokens are tokens[r] (the prefill logits give tokens[r][0])."""
    return lambda r, s: _peaked([tokens[r][s + 1]])[0]


def test_rows_finish_on_eos_and_are_dropped_from_the_step():
    """Row 1 emits eos first, row 0 one step later, row 2 runs to max_new_tokens: each row keeps its tokens up to
    and including its eos, finished rows are dropped (keep, on_keep) and never fed again, the step receives each
    live row's own last token, and the last token of the budget costs no forward."""
    tokens = [[5, EOS, 9, 9], [EOS, 9, 9, 9], [7, 8, 9, 4]]
    step = ScriptedStep(3, _greedy_script(tokens))
    kept_outside = []
    out = decode_loop(step, _peaked([t[0] for t in tokens]), GenerationConfig(max_new_tokens=4), [EOS],
                      on_keep=lambda index: kept_outside.append(index.tolist()))
    assert out == [[5, EOS], [EOS], [7, 8, 9, 4]]
    assert step.calls == [(0, [0, 2], [5, 7]), (1, [2], [8]), (2, [2], [9])]  # 3 forwards for 4 tokens
    assert step.kept == kept_outside == [[0, 2], [1]]  # positions among the rows live at the time


def test_all_rows_finishing_ends_the_loop_without_another_forward():
    tokens = [[3, EOS, 9], [EOS, 9, 9]]
    step = ScriptedStep(2, _greedy_script(tokens))
    out = decode_loop(step, _peaked([3, EOS]), GenerationConfig(max_new_tokens=3), [EOS])
    assert out == [[3, EOS], [EOS]]
    assert step.calls == [(0, [0], [3])] and step.kept == [[0]]
    both = ScriptedStep(2, _greedy_script(tokens))
    assert decode_loop(both, _peaked([EOS, EOS]), GenerationConfig(max_new_tokens=3), [EOS]) == [[EOS], [EOS]]
    assert both.calls == [] and both.kept == []


def test_one_token_budget_runs_no_forward():
    step = ScriptedStep(2, _greedy_script([[4], [5]]))
    assert decode_loop(step, _peaked([4, 5]), GenerationConfig(max_new_tokens=1), [EOS]) == [[4], [5]]
    assert step.calls == []


def test_every_eos_id_finishes_a_row_and_all_are_suppressed_before_min_new_tokens():
    """A model with two eos ids (2 and 7): either finishes a row, and before min_new_tokens neither can be picked,
    so each row takes its best other token there (greedy, as transformers' MinNewTokensLengthLogitsProcessor)."""
    eos = [EOS, 7]
    # per row and position: (best token, runner-up)
    prefs = [[(7, 5), (EOS, 6), (7, 1)], [(9, 3), (EOS, 4), (EOS, 1)], [(7, 3), (8, 1), (9, 1)]]

    def logits_for(row, position):
        x = torch.zeros(V)
        best, second = prefs[row][position]
        x[best], x[second] = 5.0, 4.0
        return x

    first = torch.stack([logits_for(r, 0) for r in range(3)])
    step = ScriptedStep(3, lambda r, s: logits_for(r, s + 1))
    out = decode_loop(step, first.clone(), GenerationConfig(max_new_tokens=3, min_new_tokens=2), eos)
    assert out == [[5, 6, 7], [9, 4, EOS], [3, 8, 9]]
    free = ScriptedStep(3, lambda r, s: logits_for(r, s + 1))
    assert decode_loop(free, first.clone(), GenerationConfig(max_new_tokens=3), eos) == [[7], [9, EOS], [7]]
    assert free.calls == [(0, [1], [9])]


def test_sampled_rows_draw_from_their_own_streams_after_rows_finish():
    """Sampling draws one number per live row and step from that row's stream (seed, row key): a row's tokens do
    not shift to another row's stream when an earlier row finishes. Rows 1 and 2 sample uniformly from tokens
    4..7 (top_p 1: vocabulary order, so a draw u takes token 4 + floor(4u)); row 0 can only emit eos."""
    allowed = torch.full((V,), -float("inf"))
    allowed[4:8] = 0.0
    only_eos = torch.full((V,), -float("inf"))
    only_eos[EOS] = 0.0

    def script(r, s):
        return only_eos if r == 0 else allowed

    keys = [10, 11, 12]
    config = GenerationConfig(max_new_tokens=5, temperature=1.0, seed=3)
    step = ScriptedStep(3, script)
    out = decode_loop(step, torch.stack([script(r, -1) for r in range(3)]), config, [EOS], row_keys=keys)
    streams = row_streams(3, keys)
    expected = [[EOS]] + [[4 + int(4 * streams[r].random()) for _ in range(5)] for r in (1, 2)]
    assert out == expected
    assert step.kept == [[1, 2]]
    # without row_keys the rows are keyed by their positions in the batch
    plain = decode_loop(ScriptedStep(3, script), torch.stack([script(r, -1) for r in range(3)]), config, [EOS])
    streams = row_streams(3, range(3))
    assert plain == [[EOS]] + [[4 + int(4 * streams[r].random()) for _ in range(5)] for r in (1, 2)]
