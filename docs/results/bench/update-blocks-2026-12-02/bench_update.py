"""One ES update of SmolLM2-135M with table noise: whole-tensor passes (the code before 2026-12-02) against
`esft.es.param_writes.add_update` at several block sizes, alternated in one process so that both meet the same
machine state. Also checks that every variant leaves the same masters, bit for bit.

Run: python bench_update.py [share|copy] [repeats]   ("share": masters in the model's storage, as with bf16
rollouts; "copy": fp32 masters copied into the model's parameters after the update)."""

from __future__ import annotations

import hashlib
import statistics
import sys
import time

import torch

from esft.es import param_writes
from esft.es.noise import MasterWeights, Update
from esft.models import load_model


def whole_tensor_update(w: MasterWeights, update: Update) -> float:
    """The sgd update as it was: direction over the whole tensor, scale, add, copy, one fp32 norm per tensor."""
    sq = 0.0
    acc, scratch = w._scratch(), w._scratch()
    for name, param in w.params.items():
        a = w.direction(name, update, acc=acc, scratch=scratch)
        a.mul_(float(update.scale))
        w.master[name].add_(a)
        if not w.shared:
            param.copy_(w.master[name])
        sq += float(torch.linalg.vector_norm(a)) ** 2
    return sq ** 0.5


def digest(w: MasterWeights) -> str:
    h = hashlib.sha256()
    for _, m in w.iter_masters():
        h.update(m.numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "share"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(2)
    model, _ = load_model("smollm2-135m", dtype="float32", device="cpu")
    model.requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0)  # first touch of the memory-mapped checkpoint, outside the timings
    w = MasterWeights(model, noise="table", share_storage=mode == "share")
    # the bench's cpu-preset update: N 4 antithetic = 2 seeds
    up = Update(seeds=(11, 12), coefficients=(0.3, -0.7), scale=1.5e-4)
    blocks = [1 << 16, 1 << 18, 1 << 20]
    times: dict[str, list[float]] = {"whole-tensor": []} | {f"2^{b.bit_length() - 1}": [] for b in blocks}
    start = {n: m.clone() for n, m in w.iter_masters()}
    digests, norms = {}, {}
    for r in range(repeats):
        for key in times:
            for n, m in w.iter_masters():  # every variant starts from the same masters
                m.copy_(start[n])
            if key == "whole-tensor":
                t = time.perf_counter()
                norm = whole_tensor_update(w, up)
            else:
                param_writes.UPDATE_BLOCK = 1 << int(key[2:])
                t = time.perf_counter()
                norm = w.apply(up)
            times[key].append(time.perf_counter() - t)
            digests[key], norms[key] = digest(w), norm
    exact = 0.0  # the norm of scale * direction, summed in float64
    for n, _ in w.iter_masters():
        exact += float(w.direction(n, up).mul_(up.scale).double().square().sum())
    print(f"mode {mode}, threads {torch.get_num_threads()}, repeats {repeats}")
    for key, ts in times.items():
        print(f"{key:>13}: median {statistics.median(ts):.3f} s, min {min(ts):.3f} s, masters {digests[key]}, "
              f"norm {norms[key]!r} (float64: {exact ** 0.5!r})")


if __name__ == "__main__":
    main()
