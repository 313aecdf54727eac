"""check_layout's warning about parallel_members, which the mutation audit of 2026-12-05 (mutexp) found untested:
the option is named as ignored exactly where the executor does not read it."""

from __future__ import annotations

import warnings

import pytest

from esft.es import build
from esft.es.es_config import ESConfig


@pytest.mark.parametrize("executor, noise, members, ignored", [
    ("local", "table", 2, None), ("local", "table", 1, None), ("local", "lowrank", 1, None),
    ("ray", "table", 1, None), ("local", "lowrank", 2, "a low-rank population is one batched pass"),
    ("ray", "table", 2, "the Ray executor spreads members over workers")])
def test_parallel_members_is_named_as_ignored_only_where_the_executor_does_not_read_it(executor, noise, members,
                                                                                      ignored):
    config = ESConfig()
    config.executor, config.noise, config.parallel_members = executor, noise, members
    if ignored is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            build.check_layout(config)
    else:
        with pytest.warns(UserWarning, match=rf"parallel_members={members} ignored: {ignored}"):
            build.check_layout(config)
