"""esft: Evolution Strategies fine-tuning of LLMs, with a GRPO baseline and weight-space analyses.

esft maximises reward: every fitness and reward in this package is "higher is better".
"""

__version__ = "0.1.0"
