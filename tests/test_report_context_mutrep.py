"""How the report's evaluating analyses load a checkpoint (esft.analysis.report_context.ReportContext.load): the
architecture and tokenizer of the base folder, the tensors of the checkpoint. The KL section loads every stage so:
a stage loaded with the base weights gives a KL of zero, which no test of the whole report told apart.

Run: PYTHONPATH=src pytest -q tests/test_report_context_mutrep.py   (seconds, tiny random Llama)
"""

from __future__ import annotations

import torch

from conftest import make_tiny_model
from esft.analysis.report_builder import ReportConfig
from esft.analysis.report_context import ReportContext


def test_load_puts_the_checkpoints_tensors_on_the_base_architecture(tmp_path, tokenizer):
    base, stage = tmp_path / "base", tmp_path / "stage"
    make_tiny_model(hidden=32, layers=1, seed=0).save_pretrained(base)
    tokenizer.save_pretrained(base)
    make_tiny_model(hidden=32, layers=1, seed=1).save_pretrained(stage)  # no tokenizer: checkpoints need none
    ctx = ReportContext(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "report"), dtype="float32",
                                     device="cpu"), progress=False)
    name = "model.layers.0.mlp.down_proj.weight"
    want = {f: make_tiny_model(hidden=32, layers=1, seed=s).state_dict()[name] for f, s in (("base", 0), ("stage", 1))}
    assert not torch.equal(want["base"], want["stage"])
    for weights, expected in ((None, "base"), (base, "base"), (stage, "stage"), (base, "base")):
        model, tok = ctx.load(base, weights)
        assert torch.equal(model.state_dict()[name], want[expected]), (weights, expected)
        assert tok is ctx.tokenizers[str(base.resolve())]
