"""ESConfig / GRPOConfig defaults and cross-field checks, pinned where a mutation audit found them untested."""

from __future__ import annotations

import pytest

from esft.es.es_config import PRESETS as ES_PRESETS
from esft.es.es_config import ESConfig
from esft.grpo.grpo_config import PRESETS as GRPO_PRESETS
from esft.grpo.grpo_config import GRPOConfig


@pytest.mark.parametrize("cls, presets", [(ESConfig, ES_PRESETS), (GRPOConfig, GRPO_PRESETS)])
def test_a_run_without_a_preset_uses_the_papers_hyperparameters(cls, presets):
    """The defaults are the paper's (Table 17, the `paper` preset): `esft train es` without --preset runs the
    paper's sigma, alpha, N, batch and budget, and `esft train grpo` its K, lr, clip and schedule."""
    default = cls()
    assert {k: getattr(default, k) for k in presets["paper"]} == presets["paper"]


def test_es_defaults_leave_the_optional_parts_off():
    """Each option whose docstring says "0 = off / a single run / keep all" (and rank 1, one lane) defaults so:
    a plain run is the paper's binary reward, one noise stream, only the final checkpoint, all checkpoints kept."""
    c = ESConfig()
    assert (c.format_bonus, c.noise_stream, c.checkpoint_every, c.save_total_limit, c.num_workers) == (0.0, 0, 0, 0, 0)
    assert (c.rank, c.parallel_members, c.antithetic, c.noise, c.fitness_rule) == (1, 1, False, "per-tensor", "mean")


def test_grpo_defaults_leave_the_optional_parts_off():
    """GRPO's "0 = only the final one / keep all / never" options, and the paper's format reward, by default."""
    c = GRPOConfig()
    assert (c.format_bonus, c.save_steps, c.save_total_limit, c.eval_every, c.warmup_steps) == (0.0, 0, 0, 0, 0)
    assert (c.num_iterations, c.beta, c.log_kl, c.class_balanced) == (1, 0.0, True, False)
