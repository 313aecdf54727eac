"""The CPU-load sample behind OMP_WAIT_POLICY and `esft env`'s exit, from their definitions (esft.environment).
Run: `pytest tests/test_environment_mutmutcli.py -q`."""

from __future__ import annotations

import io
import json
import sys
import time

from esft import __version__, cli, environment


def _proc_stat(monkeypatch, *lines: str) -> None:
    """/proc/stat whose first line is each of `lines` in turn, one per open."""
    texts = iter(lines)
    monkeypatch.setattr(environment, "open", lambda path, *a, **k: io.StringIO(next(texts) + "\n"), raising=False)


def test_cpu_times_count_idle_and_iowait_as_not_busy(monkeypatch):
    # user nice system idle iowait irq softirq steal: busy = all but idle (40) and iowait (50)
    _proc_stat(monkeypatch, "cpu  10 20 30 40 50 60 70 80")
    assert environment._cpu_times() == (360 - 90, 360)
    _proc_stat(monkeypatch, "cpu  10 20 30 40 50")  # five fields: the fifth is iowait
    assert environment._cpu_times() == (60, 150)
    _proc_stat(monkeypatch, "cpu  10 20 30 40")  # an old kernel's four fields: no iowait column
    assert environment._cpu_times() == (60, 100)


def test_busy_cores_is_the_busy_share_of_the_interval_times_the_cores(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 4)
    # between the samples: 300 of 1200 jiffies busy, a quarter of 4 cores
    _proc_stat(monkeypatch, "cpu  100 0 100 800 0", "cpu  250 0 250 1700 0")
    assert environment.busy_cores() == 1.0
    # the sample every compute command pays at start-up (esft.cli._main): 0.15 s, no more
    assert slept == [0.15]
    monkeypatch.setattr(environment.os, "cpu_count", lambda: None)  # unknown: counted as one core
    _proc_stat(monkeypatch, "cpu  100 0 100 800 0", "cpu  250 0 250 1700 0")
    assert environment.busy_cores() == 0.25
    _proc_stat(monkeypatch, "cpu  100 0 100 800 0", "cpu  100 0 100 800 0")  # no tick between them: unknown
    assert environment.busy_cores() is None


def test_esft_env_prints_one_json_object_and_exits_0(capsys):
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["esft"] == __version__ and report["python"] == sys.version.split()[0]
