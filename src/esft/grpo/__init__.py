"""GRPO baseline on TRL's `GRPOTrainer`, with runs directly comparable to ES runs (esft maximises reward).

grpo_config  GRPOConfig (TRL option names), presets ("paper", "cpu"), mapping onto TRL's GRPOConfig
trl_trainer  EsftGRPOTrainer: TRL's trainer plus measured accounting, KL at beta = 0, esft's checkpoint layout
ledger       per-step counts of prompts, completions and tokens generated / trained on
drift_log    ||theta_t - theta_0||^2 after every optimizer step (drift.jsonl), no per-step checkpoints
callbacks    metrics.jsonl records (ES vocabulary), samples/, held-out evaluation callback
interrupt    on Ctrl-C / SIGTERM, the checkpoint of the last finished step
run          train_grpo(config): the entry point, run directory, resume (also esft.train_grpo, esft.api)

Run-directory files shared with ES (JSONL logs, checkpoint names, TrainResult) are esft.rundir's.

TRL is an optional dependency (`pip install esft[grpo]`); importing this package does not import it.
"""

from esft.grpo.grpo_config import PRESETS, GRPOConfig, preset

__all__ = ["GRPOConfig", "PRESETS", "preset", "train_grpo"]


def train_grpo(config, **kwargs):
    """See esft.grpo.run.train_grpo (imported lazily: TRL is heavy and optional)."""
    from esft.grpo.run import train_grpo as _train_grpo

    return _train_grpo(config, **kwargs)

# loaded with this package so that a key of ES's config given to this trainer names its command, whichever
# package was imported first (esft.config.other_command_words finds the trainers among the loaded classes)
import esft.es.es_config  # noqa: E402,F401
