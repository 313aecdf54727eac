"""Ray runs: what is refused before the model loads, and the driver's SIGTERM handler surviving ray.init.

Run: . .venv/bin/activate && pytest -q tests/test_ray_options.py   (~15 s on 2 cores: one Ray start)
"""

from __future__ import annotations

import signal

import pytest

from esft.api import es_trainer
from esft.es.es_config import ESConfig


def test_unknown_executor_options_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    import esft.models

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the executor options were checked")

    monkeypatch.setattr(esft.models, "load_model", load_model)
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", num_workers=1, device="cpu",
                   executor_options={"threads_per_worker": 1, "bogus": 1}, output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"unknown executor_options \['bogus'\]"):
        es_trainer(cfg, progress=False)


def test_ray_init_keeps_the_drivers_sigterm_handler(monkeypatch):
    """ray.init installs `sys.exit(15)` for SIGTERM; esft's CLI handler (SIGTERM = Ctrl-C: weights restored,
    resume command printed, exit 130) must stay in place once the executor has started Ray."""
    ray = pytest.importorskip("ray")
    from esft.es.distributed.ray_executor import RayExecutor

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    executor = RayExecutor(spec=None, weights=None)
    try:
        executor._connect()
        assert ray.is_initialized() and executor._owns_ray
        assert signal.getsignal(signal.SIGTERM) is interrupt
    finally:
        executor.close()
        signal.signal(signal.SIGTERM, before)
