"""Evolution Strategies fine-tuning (esft maximises reward).

noise     seeded per-tensor Gaussian noise, fp32 master weights with exact perturb / restore / update
strategy  ask/tell ES, fitness shaping (zscore, centered_rank), SGD or Adam update
executor  population evaluation seam (LocalExecutor) and fitness-rule seam (MeanReward)
config    ESConfig, presets ("paper", "cpu"), YAML / argparse glue
trainer   train_es(config): the loop, run directory, checkpoints, resume
replay    rebuild theta_t and per-step drift from the base model and seeds.jsonl
"""

from esft.es.config import PRESETS, ESConfig, preset
from esft.es.noise import MasterWeights, Update, gaussian, select_parameters, tensor_seed
from esft.es.strategy import ES, Member, centered_rank, zscore

__all__ = ["ES", "ESConfig", "MasterWeights", "Member", "PRESETS", "Update", "centered_rank", "gaussian",
           "preset", "select_parameters", "tensor_seed", "zscore", "train_es"]


def train_es(config, **kwargs):
    """See esft.es.trainer.train_es (imported lazily to keep `import esft.es` light)."""
    from esft.es.trainer import train_es as _train_es

    return _train_es(config, **kwargs)
