"""How often each barrier test declares a barrier on a flat interpolation path (no barrier exists): 5 points
(t = 0, 1/4, 1/2, 3/4, 1), n = 100 examples, every point scoring the same examples, 1000 paths per scenario.

  independent: every (point, example) right with probability 0.6
  correlated:  example i has an ability a_i ~ U(0, 1); right with probability 0.3 + 0.6 a_i at every point

Run: python docs/results/barrier-test-2026-12-06/simulate.py"""

import numpy as np

from esft.analysis import barrier as B

TS = [0, 0.25, 0.5, 0.75, 1]


def rates(draw, seed: int, paths: int = 1000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    paired = means = 0
    for _ in range(paths):
        s = draw(rng)
        paired += B.paired_barrier(TS, s)["barrier"]
        means += B.barrier(TS, s.mean(axis=1), s.shape[1])["barrier"]
    return paired / paths, means / paths


if __name__ == "__main__":
    independent = rates(lambda rng: (rng.random((5, 100)) < 0.6).astype(float), seed=0)
    correlated = rates(lambda rng: (rng.random((5, 100)) < 0.3 + 0.6 * rng.random(100)).astype(float), seed=1)
    print("scenario     paired test (z* = %.3f)   2 binomial SE at the largest drop" % B.critical_z(3))
    for name, (p, m) in (("independent", independent), ("correlated", correlated)):
        print(f"{name:12} {p:.3f}                     {m:.3f}")
