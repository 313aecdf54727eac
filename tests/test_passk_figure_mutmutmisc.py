"""The pass@k figure's pieces read from a summary (esft.passk_figure): the colour a method takes when its own is
used, the note for a summary without pass@k, the baseline's interval, a model's legend name.

Run: PYTHONPATH=src pytest -q tests/test_passk_figure_mutmutmisc.py   (< 1 s)
"""

from __future__ import annotations

from esft.passk_figure import (FALLBACK_COLORS, METHOD_COLORS, baseline_from_summary, method_color, model_label,
                               skipped_note)


def test_a_method_whose_colour_is_taken_gets_the_first_free_fallback():
    assert method_color("ES (iter=4)", set()) == METHOD_COLORS["es"]
    assert method_color("ES", {METHOD_COLORS["es"]}) == FALLBACK_COLORS[0]
    assert method_color("dart", {FALLBACK_COLORS[0], FALLBACK_COLORS[1]}) == FALLBACK_COLORS[2]
    every = set(FALLBACK_COLORS)  # none free: cycle by how many are taken
    assert method_color("dart", every) == FALLBACK_COLORS[len(every) % len(FALLBACK_COLORS)]


def test_the_skipped_note_is_the_first_summary_without_pass_at_k_that_says_why():
    with_pk = {"pass@k": {"1": {"value": 0.5, "ci95": [0.1, 0.9]}}, "pass@k_note": "unused"}
    unexplained = {"pass@k": None}
    explained = {"pass@k": None, "pass@k_note": "pass@k needs right/wrong scores"}
    assert skipped_note([("ES", with_pk), ("base", unexplained)]) is None
    assert skipped_note([("ES", with_pk), ("GRPO", explained)]) == "GRPO: pass@k needs right/wrong scores"


def test_the_baseline_keeps_its_interval_and_answer():
    base = baseline_from_summary({"constant_baseline": 0.6, "constant_baseline_ci95": [0.5, 0.7],
                                  "constant_answer": "yes"})
    assert (base.value, base.ci95, base.answer) == (0.6, (0.5, 0.7), "yes")
    assert baseline_from_summary({"constant_baseline": 0.6}).ci95 is None
    assert baseline_from_summary({"constant_baseline": None}) is None


def test_a_checkpoint_is_named_with_its_run_folder_and_a_hub_id_as_it_is():
    assert model_label("/data/runs/es-1/checkpoints/final/") == "es-1/checkpoints/final"
    assert model_label("/data/models/qwen/step-3") == "qwen/step-3" and model_label("/models/x") == "models/x"
    assert model_label("/ckpt") == "/ckpt"  # a short path as it is
    assert model_label("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B" and model_label("smollm2") == "smollm2"


def test_the_k_axis_holds_every_k_with_room_on_both_sides():
    from esft.passk_figure import PassKCurve, passk_figure

    curve = PassKCurve("ES", [1, 2, 8], [0.2, 0.3, 0.5], [0.1, 0.2, 0.4], [0.3, 0.4, 0.6])
    lo, hi = passk_figure([curve], "t").axes[0].get_xlim()
    assert lo == 1 / 2 ** 0.25 and hi == 8 * 2 ** 0.25  # a quarter octave beyond the first and last k
