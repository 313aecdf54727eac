"""Reference values from the study (docs/es-vs-grpo-paper.txt): the numbers printed next to our measurements
(esft.analysis.report_builder), the names and accounting its tables use (esft.experiments), and the few settings
taken from it. Every number of the study that esft uses is here, nowhere else.

The study trains Qwen3-4B-Instruct (d = 4.02e9) and Llama-3.2-3B-Instruct (d = 3.21e9) sequentially on
Countdown -> Math -> Chemistry -> BoolQ; tables below are indexed by stage (0-based). Qwen unless noted.
"""

from __future__ import annotations

from typing import Iterable, Sequence

STAGE_TASKS = ("countdown", "math", "chemistry", "boolq")

#: The study's display names of the tasks (Tables 1, 2); the header of its Tables 5-8 calls chemistry "SciK".
TASK_DISPLAY = {"countdown": "Countdown", "math": "Math", "chemistry": "Chemistry", "boolq": "BoolQ",
                "mmlu": "MMLU", "ifeval": "IFEval"}
TASK_DISPLAY_SHORT = {**TASK_DISPLAY, "chemistry": "SciK"}

# Table 3: ||dtheta||_2 from the base at each sequential checkpoint: (ES, GRPO, ratio)
TABLE3 = [(87.28, 1.00, 87), (122.76, 1.15, 107), (149.99, 1.65, 91), (173.00, 1.84, 94)]

# Table 4: sparsity (|d| <= 1e-5) and stable rank (mean over attention QKVO and MLP matrices):
# (sparsity ES, sparsity GRPO, stable rank ES, stable rank GRPO)
TABLE4 = [(0.038, 0.880, 1100, 60), (0.029, 0.880, 1090, 70), (0.024, 0.877, 1084, 89), (0.021, 0.877, 1078, 103)]

# Table 20: cosine(ES update, GRPO update): (Qwen3-4B, Llama-3.2-3B)
TABLE20 = [(1.0e-4, 0.8e-4), (1.6e-4, 1.0e-4), (2.2e-4, 1.0e-4), (2.7e-4, 1.3e-4)]

# Table 1: single-task accuracy (%): task -> (base, ES 100 it, ES 300 it, GRPO)
TABLE1 = {"countdown": (20.5, 75.1, 78.6, 74.5), "math": (61.8, 72.4, 74.0, 68.8),
          "chemistry": (63.4, 68.1, 76.5, 74.9), "boolq": (83.7, 87.2, 88.1, 86.6)}

# Incremental KL, GRPO, median [min, max] over 3 seeds: eval task -> per stage. (The text file carries this
# table's values under the caption of Table 12; the ES counterpart, Table 11, has no values in the text.)
TABLE12_GRPO_INCREMENTAL = {
    "countdown": [(0.381, 0.293, 0.454), (0.008, 0.006, 0.012), (0.012, 0.004, 0.030), (0.017, 0.005, 0.029)],
    "math": [(0.050, 0.048, 0.056), (0.009, 0.003, 0.010), (0.010, 0.007, 0.016), (0.006, 0.005, 0.011)],
    "chemistry": [(0.012, 0.000, 0.115), (0.010, 0.000, 0.019), (0.117, 0.072, 3.738), (0.056, 0.017, 0.105)],
    "boolq": [(0.051, 0.035, 0.061), (0.010, 0.003, 0.010), (0.038, 0.028, 4.431), (0.239, 0.094, 0.322)],
}
# Cumulative KL from the base, mean +- std over 3 seeds, Qwen: stage -> per eval task (countdown, math, chem, boolq)
TABLE13_ES_CUMULATIVE = [
    [(0.206, 0.023), (0.062, 0.008), (0.132, 0.014), (0.133, 0.006)],
    [(0.436, 0.032), (0.178, 0.021), (0.755, 0.477), (0.355, 0.079)],
    [(0.536, 0.059), (0.250, 0.033), (2.541, 2.390), (0.545, 0.211)],
    [(0.551, 0.112), (0.288, 0.028), (2.013, 1.781), (0.545, 0.158)],
]
TABLE14_GRPO_CUMULATIVE = [
    [(0.376, 0.081), (0.052, 0.004), (0.040, 0.066), (0.049, 0.013)],
    [(0.420, 0.113), (0.069, 0.018), (0.087, 0.129), (0.072, 0.025)],
    [(0.435, 0.143), (0.093, 0.038), (1.297, 2.120), (1.904, 3.140)],
    [(0.435, 0.115), (0.091, 0.024), (1.282, 2.062), (0.194, 0.063)],
]

# Drift (Figures 6, 9-11 and text): the theory alpha^2 T d / N with alpha = sigma / 2 = 0.00075, N = 30, 500 steps
DRIFT = {
    "matrices": ("rho ~ 1 and R^2 indistinguishable from 1 (within the top 2e-4 of the R^2 range) "
                 "for every weight matrix"),
    "norms": "RMSNorm gains rise steeply and saturate: rho and R^2 scatter widely, R^2 often negative",
    "total": "total drift follows alpha^2 T d / N with no fitted parameter (R^2 ~ 1) for ES; GRPO does not",
}

LANDSCAPE = {
    "interpolation": "no barrier: the path between final ES and GRPO stays near or above the straight line",
    "directions": "accuracy is flat along the ES direction far beyond ||dGRPO||; random directions of the same "
                  "per-tensor norm degrade accuracy",
}

FUNCTIONAL_SPARSITY = "Ba et al.: ~78% functional sparsity of the ES update costs < 0.5 pp accuracy"
#: that sparsity level, one of the targets of the functional-sparsity sweep
FUNCTIONAL_SPARSITY_LEVEL = 0.78

#: Table 4's sparsity threshold: an update entry with |d| <= SPARSITY_EPS counts as unchanged
SPARSITY_EPS = 1e-5

# Table 18's FLOP accounting, per parameter and processed token: 2 for a forward pass, 6 for forward + backward.
# An ES iteration generates (forward only): 2 * iters * N * batch * P * L; a GRPO step generates and trains:
# (2 + 6) * T * prompts * K * P * L.
FLOPS_FORWARD = 2
FLOPS_FORWARD_BACKWARD = 6
ES_FLOPS_PER_TOKEN = FLOPS_FORWARD
GRPO_FLOPS_PER_TOKEN = FLOPS_FORWARD + FLOPS_FORWARD_BACKWARD


#: ES iterations per stage behind the study's ES values of Tables 3-8 and 11-16 ("ES (iter=100)" in the captions of
#: Tables 5, 7, 13, 15; Table 3's norms solve the random-walk law alpha^2 T d / N at T ~ 100, 200, 300, 400)
ES_ITERATIONS = 100


def es_budget_note(iterations: Iterable[int | None]) -> str:
    """"" when every ES stage set beside the study's ES values ran its ES_ITERATIONS; else a sentence naming the
    budgets these ran, so that a reader does not compare 300 iterations with the study's 100."""
    other = sorted({int(i) for i in iterations if i is not None and int(i) != ES_ITERATIONS})
    if not other:
        return ""
    return (f"The study's ES values are of {ES_ITERATIONS} iterations per stage; these ES stages ran "
            f"{', '.join(map(str, other))}.")


def stage_label(i: int) -> str:
    return f"T{i} {STAGE_TASKS[i].capitalize()}" if 0 <= i < len(STAGE_TASKS) else f"T{i}"


def stage_index(task: str | None) -> int | None:
    """Index of `task` in the study's training sequence, None when the study did not train it."""
    return STAGE_TASKS.index(task) if task in STAGE_TASKS else None


def sequence_stage(tasks: Sequence[str], i: int) -> int | None:
    """The study's stage whose cumulative values (Tables 3, 4, 20: updates measured from the base model) compare
    with stage `i` of a chain that trained `tasks`: i itself where the chain trained the study's sequence up to it,
    else None (a single-task BoolQ run's one budget is not the study's four after its fourth task)."""
    return i if list(tasks[:i + 1]) == list(STAGE_TASKS[:i + 1]) else None


def kl_reference(algo: str, kind: str, task: str, trained: str) -> tuple[str, str] | None:
    """The study's KL cell on `task` after training `trained` (wherever that task sits in the study's sequence),
    as it prints it, with its statistic: ("median [min, max]", "median") (Table 12) or ("mean +- std", "mean")
    (Tables 13, 14); None where it gives none (a task it did not train, or a chain such as grpo->es it did not
    run)."""
    if trained not in STAGE_TASKS or task not in STAGE_TASKS or algo not in ("es", "grpo"):
        return None
    k, j = STAGE_TASKS.index(trained), STAGE_TASKS.index(task)
    if kind == "incremental" and algo == "grpo":
        med, lo, hi = TABLE12_GRPO_INCREMENTAL[task][k]
        return f"{med} [{lo}, {hi}]", "median"
    if kind == "cumulative" or k == 0:  # after the first stage incremental == cumulative
        tab = TABLE13_ES_CUMULATIVE if algo == "es" else TABLE14_GRPO_CUMULATIVE
        mean, sd = tab[k][j]
        return f"{mean} +- {sd}", "mean"
    return None


def accuracy_reference(task: str | None) -> str:
    """Table 1's row for `task` (base, ES at 100 and 300 iterations, GRPO; %), or "n/a"."""
    ref = TABLE1.get(task or "")
    return f"base {ref[0]}, ES(100) {ref[1]}, ES(300) {ref[2]}, GRPO {ref[3]}" if ref else "n/a"
