"""The bytes decode-heavy's decode steps must read at least (esft.bench.roofline.decode_read_bytes; `esft bench`
reports it as `decode_read_bytes` from 2026-12-07), for the bf16 and fp32 rollouts of section 1, and where that puts the bf16 iteration
against this machine's 28.2 GB/s streaming read (membw.txt) and 2,459.3 GFLOP/s bf16 matmul.

    PYTHONPATH=src python docs/results/bench/amx-xeon-2026-12-07/decode_bytes.py > .../decode_bytes.txt
"""
from esft.bench.roofline import ModelShape, bandwidth_bound, decode_read_bytes
from esft.bench.workloads import build_workload
from esft.generation import encode_prompts
from esft.models import load_tokenizer, model_skeleton

tok = load_tokenizer("smollm2-135m")
work = build_workload("decode-heavy", tok)
lengths = [len(i) for i in encode_prompts(tok, work.prompts)]
shape = ModelShape.of(model_skeleton("smollm2-135m"))
print(shape)
print(f"prompts {len(lengths)}, prompt tokens {sum(lengths)} (mean {sum(lengths) / len(lengths):.1f}), 256 new each")
for name, weight, cache in (("bf16 rollouts", 2, 2), ("fp32 rollouts", 4, 4)):
    member = decode_read_bytes(shape, lengths, [256] * len(lengths), batch_size=work.generation_batch_size,
                               weight_bytes=weight, cache_bytes=cache, head_bytes=2)  # the screened head: bf16
    print(f"{name}: {member / 1e9:.2f} GB per member, {4 * member / 1e9:.1f} GB for 4 members, "
          f"{4 * member / 28.2e9:.1f} s at 28.2 GB/s")
    if weight == 2:
        bound = bandwidth_bound({"fp32": 447919441920, "bf16": 9972630945792}, 4 * member, 42.015, 2459.32, 28.2)
        print(f"  against the 42.015 s iteration: bandwidth_ratio {bound['bandwidth_ratio']:.3f}, "
              f"roofline_ceiling {bound['roofline_ceiling']:.3f}")
