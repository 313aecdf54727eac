"""Prints each A/B run's cpu-preset readings (run from this folder: python summarize.py)."""
import glob, json
for path in sorted(glob.glob("*-[0-9].json"), key=lambda p: (p.split("-")[1], p)):
    try:
        d = json.load(open(path))
    except ValueError:
        continue
    r = d["workloads"]["cpu-preset"]
    print(f"{path:12} iterations {r['esft_iterations_s']} fp32 {r['fp32_rollout_iterations_s']} "
          f"bf16/fp32 {r['speedup_vs_fp32']} overhead {r['overhead_fraction']} inference_ratio {r['inference_ratio']} "
          f"pure {r['pure_generations_s']}")
