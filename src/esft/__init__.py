"""esft: Evolution Strategies fine-tuning of LLMs, with a GRPO baseline and weight-space analyses.

esft maximises reward: every fitness and reward in this package is "higher is better".

    import esft
    from esft.es import preset
    esft.train_es(preset("cpu", output_dir="runs/es"))    # esft.api.train_es; esft.train_grpo likewise

This facade is the top of the package: modules inside esft never import it (the version is esft.version's).
"""

from typing import Any

from esft.version import __version__

__all__ = ["__version__", "train_es", "train_grpo"]


def __getattr__(name: str) -> Any:
    # lazy: `import esft` stays light; the trainers (torch, and TRL for GRPO) load on first use
    if name in ("train_es", "train_grpo"):
        from esft import api

        return getattr(api, name)
    raise AttributeError(f"module 'esft' has no attribute {name!r}")
