"""Weight-space and behaviour analyses of fine-tuned models (the study's tables and figures).

weights    update norms, sparsity, stable rank, cosine; per tensor / family; streamed from checkpoints
kl         KL(pi_after || pi_before) on test prompts, token-aligned on generated ids, k1 / k3 / exact
landscape  accuracy along linear paths and along update / random directions
drift      squared displacement per step vs the random-walk law alpha^2 T d / N; per-tensor fits
sparsity   functional sparsity: keep only |d| > tau and re-evaluate
runs       discovery of ES / GRPO run directories, sequential chains, ES-GRPO pairs
commands   `esft analyze weights|kl|landscape|drift|sparsity`: one analysis each

`esft report DIR` writes report.md with every table and figure the runs support: report_builder assembles it
from each analysis's report section (weights_report, kl_report, landscape_report, sparsity; drift_runs for the
drift of the runs), which share a report_context (runs, output folder, report_cache); esft.tables renders the rows
and esft.paper holds the study's reference values.

Submodules are imported on use (`from esft.analysis import weights`), so importing this package is cheap.
"""
