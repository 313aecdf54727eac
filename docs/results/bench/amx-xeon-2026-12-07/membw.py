"""Streaming read rate of this machine (GB/s) on 1 and 2 torch threads: the best of 5 fp32 sums over a 1 GiB
tensor, the bound for decode steps that read every weight and cached key once."""
import time, torch
x = torch.ones(2**28)
for threads in (1, 2):
    torch.set_num_threads(threads)
    x.sum()
    best = min((lambda t: (x.sum(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
    print(f"threads {threads} read {2**30 / best / 1e9:6.1f} GB/s")
