"""Evolution Strategies fine-tuning (esft maximises reward).

noise        seeded per-tensor Gaussian noise, fp32 master weights with exact perturb / restore / update
noise_seeds  the per-tensor seed hash and the shared noise table (re-exported by noise)
strategy     ask/tell ES (owns sigma), fitness shaping (zscore, centered_rank), SGD or Adam update
lowrank      low-rank (EGGROLL) noise: the population answers in one batched pass
executor     population evaluation seam: Executor (base, on_update / close hooks), LocalExecutor
population   PopulationResult (what an executor returns: scores, texts, each completion's fields) and its stacking
lanes        a member lane's model copy, glibc's mmap threshold, the OpenMP check
fitness      fitness-rule seam: FitnessRule (base, hooks with defaults), MeanReward, the uniform batch sampler
dart         DART-ES: difficulty-weighted fitness and replay of hard problems (a stateful FitnessRule)
es_config    ESConfig, presets ("paper", "cpu"), YAML / argparse glue
build        config -> strategy, weights, generation config, fitness rule, local executor
es_rundir    seeds.jsonl records and checkpoints with fp32 masters (the shared run files are esft.rundir's)
trainer      ESTrainer: the loop, run directory, checkpoints, resume; its executor is injected
replay       rebuild theta_t and per-step drift from the base model and seeds.jsonl
report       summary and plots of a run directory
distributed  executors on other processes: factory, HF replica, Ray executor (esft.es.distributed)

`esft.train_es(config)` (esft.api) builds the executor a config asks for, Ray included, and runs the trainer.
"""

from esft.es.es_config import PRESETS, ESConfig, preset

# noise and strategy import torch: loaded on first use, so that the config (and `esft train es --help`) stays light
_LAZY = {"MasterWeights": "noise", "Update": "noise", "gaussian": "noise", "select_parameters": "noise",
         "tensor_seed": "noise", "ES": "strategy", "Member": "strategy", "centered_rank": "strategy",
         "zscore": "strategy"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"esft.es.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'esft.es' has no attribute {name!r}")

__all__ = ["ES", "ESConfig", "MasterWeights", "Member", "PRESETS", "Update", "centered_rank", "gaussian",
           "preset", "select_parameters", "tensor_seed", "zscore", "train_es"]


def train_es(config, **kwargs):
    """The ES loop on a given executor (`executor=` / `executor_factory=`) or, for `executor: local`, the local
    one; esft.train_es (esft.api) also builds Ray executors. Imported lazily to keep `import esft.es` light."""
    from esft.es.trainer import ESTrainer

    return ESTrainer(config, **kwargs).train()
