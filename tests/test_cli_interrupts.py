"""Ctrl-C and SIGTERM sent to a real `esft` process at moments the in-process tests cannot reach."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def ctrl_c_acts():
    """Python's Ctrl-C handler in this process, and so the default action in the processes it starts (a caught
    signal is reset at exec): pytest started in the background by a shell ignores SIGINT, and an ignored signal
    stays ignored in every child, so no Ctrl-C sent here would reach esft."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (the `SigCgt` mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "esft", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_start_up_prints_one_line(tmp_path, signum):
    """Ctrl-C or `kill` in the second or more before a command starts (`esft eval` builds its options by importing
    torch) ends it as one later does: the line `interrupted` and exit 130, not a KeyboardInterrupt traceback and a
    death by SIGINT. The signal is sent as soon as esft's SIGTERM handler is in place, which is before that import."""
    proc = _start(["eval", "--tasks", "boolq", "--limit", "1", "--output-dir", str(tmp_path / "out")], tmp_path)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "Traceback" not in err, err
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", (proc.returncode, err)
    assert not (tmp_path / "out").exists()


#: a sitecustomize that sends its process SIGINT when numpy.linalg is first imported: Ctrl-C at that moment
_CTRL_C_AT_NUMPY = '''
import os, signal, sys

class CtrlCAtNumpy:
    sent = False

    def find_spec(self, name, path=None, target=None):
        if name == "numpy.linalg" and not CtrlCAtNumpy.sent:
            CtrlCAtNumpy.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCAtNumpy())
'''


def _with_hook(tmp_path: Path, source: str) -> dict[str, str]:
    """The environment of an `esft` process that runs `source` as its sitecustomize first."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(source)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), SRC, os.environ.get("PYTHONPATH", "")]),
                HF_HUB_OFFLINE="1")


def test_ctrl_c_while_numpy_imports_stops_a_run(tmp_path):
    """torch's start-up imports numpy in C and drops whatever that import raised: a Ctrl-C there was lost, and
    the run went on with a half-imported numpy (`esft train es` then failed with an unrelated ModuleNotFoundError
    traceback, `esft train grpo` with a RecursionError, `esft export` finished as if never interrupted)."""
    env = _with_hook(tmp_path, _CTRL_C_AT_NUMPY)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "esft", "train", "es", "--task", "countdown", "--iterations", "1",
                           "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "4", "--eval-every",
                           "0", "--output-dir", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 130 and proc.stderr.strip().splitlines()[-1] == "interrupted", proc.stderr
    assert not out.exists()


#: a sitecustomize that sends its process SIGTERM once an export has copied config.json: `kill` mid-export
_KILL_MID_EXPORT = '''
import os, shutil, signal

copyfile = shutil.copyfile

def copy_then_kill(src, dst, *args, **kwargs):
    done = copyfile(src, dst, *args, **kwargs)
    if os.path.basename(dst) == "config.json":
        os.kill(os.getpid(), signal.SIGTERM)
    return done

shutil.copyfile = copy_then_kill
'''


def _model_folder(tmp_path: Path, tokenizer) -> Path:
    from conftest import make_tiny_model

    folder = tmp_path / "model"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("hook", [_KILL_MID_EXPORT, _CTRL_C_AT_NUMPY], ids=["sigterm-mid-copy", "ctrl-c-at-numpy"])
def test_an_interrupted_export_leaves_nothing_behind(tmp_path, tokenizer, hook):
    """`kill` during `esft export` ends it as Ctrl-C does: one line, exit 130, and neither the target nor the
    staging folder beside it (a hidden `.NAME.*` holding a torn copy of the weights, which SIGTERM's default
    death left); a Ctrl-C while torch imports numpy stops it too, instead of being lost."""
    model = _model_folder(tmp_path, tokenizer)
    exports = tmp_path / "exports"
    exports.mkdir()
    proc = subprocess.run([sys.executable, "-m", "esft", "export", str(model), "--to", str(exports / "out")],
                          cwd=tmp_path, env=_with_hook(tmp_path, hook), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130 and proc.stderr.strip().splitlines()[-1] == "interrupted", proc
    assert "Traceback" not in proc.stderr and list(exports.iterdir()) == []


class _CtrlCWhenWritten:
    """A value whose text form sends this process SIGINT: Ctrl-C while a file holding it is being written."""

    def __str__(self) -> str:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # Python's handler raises KeyboardInterrupt here
        return "never"


def test_ctrl_c_while_an_eval_writes_its_completions_keeps_the_earlier_file(tmp_path):
    """`esft eval --output-dir` into the folder of an earlier evaluation (allowed for the same evaluation again)
    stopped while it writes a task's JSONL leaves the earlier file whole, which its summary.json describes, not a
    file cut after the records written so far."""
    from esft.evaluation import write_jsonl

    path = tmp_path / "boolq.jsonl"
    write_jsonl(path, [{"i": i, "completion": "yes"} for i in range(3)])
    before = path.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, [{"i": 0, "completion": "no"}, {"i": 1, "completion": _CtrlCWhenWritten()}])
    assert path.read_bytes() == before


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_the_numpy_import_is_delivered_after_it(signum):
    """Ctrl-C landing while CPython built numpy's optional-import ImportError in C surfaced once as a TypeError
    traceback ("expected a message argument", checks-2026-12-06v): the start-up import now holds Ctrl-C and SIGTERM
    and takes them as it ends, where they raise KeyboardInterrupt as anywhere else."""
    from esft.sigterm import signals_deferred, sigterm_interrupts

    import threading

    reached = []
    with sigterm_interrupts(), pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            # to this thread: at the command's start no other thread exists to take a signal sent to the process
            signal.pthread_kill(threading.main_thread().ident, signum)
            time.sleep(0.05)  # a signal not held would have raised here, inside the block
            reached.append(True)
    assert reached == [True]
    assert signum not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the mask is as it was
