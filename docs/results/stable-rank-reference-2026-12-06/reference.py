"""The stable rank ||W||_F^2 / ||W||_2^2 an update of i.i.d. Gaussian entries would have, averaged over the attention
q/k/v/o and MLP gate/up/down matrices as Table 4 averages (one of each per layer, so the mean over the 7 roles), at
the study's Qwen3-4B shapes and the embedded SmolLM2-135M's: the formula esft's report prints
(esft.analysis.weights.gaussian_stable_rank) and one drawn matrix per shape (float32, seed 0).

Run: python docs/results/stable-rank-reference-2026-12-06/reference.py"""

import torch

from esft.analysis.weights import gaussian_stable_rank, stable_rank

# (out, in) of each role's weight matrix, from the models' config.json (hidden, intermediate, heads x head_dim)
SHAPES = {
    "Qwen3-4B (hidden 2560, MLP 9728, 32 q / 8 kv heads of 128)": {
        "q_proj": (4096, 2560), "k_proj": (1024, 2560), "v_proj": (1024, 2560), "o_proj": (2560, 4096),
        "gate_proj": (9728, 2560), "up_proj": (9728, 2560), "down_proj": (2560, 9728)},
    "SmolLM2-135M (hidden 576, MLP 1536, 9 q / 3 kv heads of 64)": {
        "q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "o_proj": (576, 576),
        "gate_proj": (1536, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)},
}

if __name__ == "__main__":
    torch.manual_seed(0)
    for model, roles in SHAPES.items():
        print(model)
        formula, drawn = {}, {}
        for role, shape in roles.items():
            formula[role] = gaussian_stable_rank(shape)
            drawn[role] = stable_rank(torch.randn(*shape))
            print(f"  {role:10} {str(shape):14} formula {formula[role]:8.1f}   drawn {drawn[role]:8.1f}")
        attn = [formula[r] for r in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mlp = [formula[r] for r in ("gate_proj", "up_proj", "down_proj")]
        print(f"  mean of the 7 roles (Table 4's average): formula {sum(formula.values()) / 7:.1f}, "
              f"drawn {sum(drawn.values()) / 7:.1f}")
        print(f"  attention only {sum(attn) / 4:.1f}, MLP only {sum(mlp) / 3:.1f}")
