"""fp32 and bf16 GFLOP/s of the oneDNN packed linears an ES decode step runs (SmolLM2-135M's shapes: stacked q/k/v
576->960, o 576->576, stacked gate/up 576->3072, down 1536->576, for 16 and 32 rows), and of a 2048^3 matmul,
each the best of many calls, on one thread (one ES lane) and on two.

    python matmul_shapes.py > matmul_shapes.txt
"""

import platform
import timeit

import torch

ops = torch.ops.mkldnn
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def best(fn, reps):
    """The fastest of `reps` calls, after 10 untimed ones."""
    timeit.repeat(fn, number=1, repeat=10)
    return min(timeit.repeat(fn, number=1, repeat=reps))


def linear_rates(rows, out, inner):
    w, x = torch.randn(out, inner), torch.randn(rows, inner)
    rates = {}
    for dt in (torch.float32, torch.bfloat16):
        packed, xd = ops._reorder_linear_weight(w.to(dt), rows), x.to(dt)
        t = best(lambda: ops._linear_pointwise(xd, packed, None, "none", [], ""), 300)
        rates[dt] = 2 * rows * out * inner / t / 1e9
    return rates


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        print(f"\nthreads {threads}")
        print("rows  out  inner  fp32 GFLOP/s  bf16 GFLOP/s  bf16/fp32")
        for rows in (16, 32):
            for out, inner in SHAPES:
                r = linear_rates(rows, out, inner)
                f, b = r[torch.float32], r[torch.bfloat16]
                print(f"{rows:4d} {out:4d} {inner:6d} {f:13.1f} {b:13.1f} {b / f:10.2f}")
        big = {}
        for dt in (torch.float32, torch.bfloat16):
            a = torch.randn(2048, 2048).to(dt)
            big[dt] = 2 * 2048 ** 3 / best(lambda: a @ a, 5) / 1e9
        print(f"2048^3 matmul: fp32 {big[torch.float32]:.1f}, bf16 {big[torch.bfloat16]:.1f} GFLOP/s "
              f"({big[torch.bfloat16] / big[torch.float32]:.2f}x)")


if __name__ == "__main__":
    main()
