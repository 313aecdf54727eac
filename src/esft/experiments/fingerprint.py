"""What a stage of an experiment was trained with, as its status.json records it (`fingerprint`), and how two
fingerprints compare: only what can change a stage's result counts (esft.experiments.runner.check_existing)."""

from __future__ import annotations

from typing import Any

from esft.experiments.algorithms import ALGORITHMS, get_algorithm


def comparable(fingerprint: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stage fingerprint without what cannot change a stage's result, applied alike to a recorded fingerprint
    and today's, so that fingerprints written by earlier versions (before a field existed) still match:
    fields a trainer lets a resume change (executor layout, eval cadence and set, ...; the budget does count),
    noise_stream 0, and rollout_dtype "auto" / "float32" (runs recorded before the option ran fp32, and a resume
    adopts the dtype its run directory recorded)."""
    from esft.es.es_config import RESUMABLE_CHANGES as ES_FREE
    from esft.grpo.grpo_config import RESUMABLE_CHANGES as GRPO_FREE

    free = {"es": ES_FREE, "grpo": GRPO_FREE}
    out = []
    for step in fingerprint:
        algorithm = step.get("algorithm")
        skip = set(free.get(algorithm, ()))
        if algorithm in ALGORITHMS:
            skip -= {get_algorithm(algorithm).budget_field}
        data = {k: v for k, v in (step.get("config") or {}).items() if k not in skip}
        if data.get("noise_stream") == 0:
            del data["noise_stream"]
        if data.get("rollout_dtype") in ("auto", "float32"):
            del data["rollout_dtype"]
        out.append({"algorithm": algorithm, "config": data})
    return out


def binding_steps(old: list[dict[str, Any]], new: list[dict[str, Any]],
                  trained: list[bool]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steps of a stage's recorded fingerprint `old` and of today's `new` that a re-run is held to: those whose
    run trained something (`trained`, one flag per step of today's plan). A step that trained nothing (the stage
    failed or was stopped before it logged a step) runs with today's options; a changed number of steps binds all."""
    if len(old) != len(new) or len(trained) != len(new):
        return old, new
    return [s for s, t in zip(old, trained) if t], [s for s, t in zip(new, trained) if t]


def fingerprint_diff(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    """The changes from `old` to `new`, as "field: old -> new; ..."."""
    if len(old) != len(new):
        return f"{len(old)} steps before, {len(new)} now"
    parts = []
    for a, b in zip(old, new):
        if a.get("algorithm") != b.get("algorithm"):
            parts.append(f"algorithm {a.get('algorithm')} -> {b.get('algorithm')}")
            continue
        ca, cb = a.get("config", {}), b.get("config", {})
        for k in sorted(set(ca) | set(cb)):
            if ca.get(k) != cb.get(k):
                parts.append(f"{k}: {ca.get(k)!r} -> {cb.get(k)!r}")
    return "; ".join(parts)
