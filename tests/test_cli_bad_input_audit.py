"""Bad input met by a new user at the command line: refused as one `esft: error:` line naming the value and what is
accepted, with exit code 2, before any model loads."""

from __future__ import annotations

import pytest

from esft.cli import main


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("esft.models.load_model", refuse)


@pytest.mark.parametrize("seed", ["4294967296", "-1"])
def test_a_grpo_seed_numpy_cannot_take_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load, seed):
    """--seed 4294967296 loaded the model, then ended in "Seed must be between 0 and 2**32 - 1" from inside TRL's
    set_seed, naming neither the option nor the value."""
    assert main(["train", "grpo", "--preset", "cpu", "--seed", seed, "--output-dir", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert f"command line (--seed): seed = {seed} is not accepted; expected an integer from 0 to 2^32 - 1" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g").exists()


def test_the_largest_seed_numpy_takes_is_accepted_for_grpo():
    from esft.grpo.grpo_config import GRPOConfig

    assert GRPOConfig(seed=2**32 - 1).seed == 2**32 - 1
