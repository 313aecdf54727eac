"""What the CLI shows around an error (esft.cli_process): files named as typed, and under --debug every exception a
one-line error replaced. Run: `pytest tests/test_cli_process_mutmutcli.py -q`."""

from __future__ import annotations

import json

from esft.cli_process import as_typed, show_context

ROWS = "".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(4))


def test_a_file_whose_absolute_path_starts_another_files_leaves_that_one_as_typed(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "one.json").write_text(json.dumps([{"question": "1+1?", "answer": "2"}]))
    (tmp_path / "data" / "one.jsonl").write_text(ROWS)
    monkeypatch.chdir(tmp_path)
    root = tmp_path.resolve()  # as the config records a typed path (a symlinked temp folder resolved)
    longer = str(root / "data" / "one.jsonl")  # /.../data/one.json + "l"
    # the longer absolute path is replaced first (here the shorter of the two as typed): whole, not its first part
    # replaced by the other file as typed and an "l" left over
    typed = ["./data/../data/one.json", "data/one.jsonl"]
    assert as_typed(f"{longer}: bad row; {root / 'data' / 'one.json'}: fine", typed) == (
        "data/one.jsonl: bad row; ./data/../data/one.json: fine")


def test_debug_shows_every_exception_of_a_chain_of_one_line_errors():
    try:
        try:
            try:
                raise OSError("the file read")
            except OSError:
                raise ValueError("the task import") from None
        except ValueError:
            raise RuntimeError("the one-line error") from None
    except RuntimeError as exc:
        top = exc
    middle = top.__context__
    assert top.__suppress_context__ and middle.__suppress_context__
    show_context(top)
    # the traceback prints each __context__ once its own exception no longer suppresses it: all the way down
    assert not top.__suppress_context__ and not middle.__suppress_context__
    assert isinstance(middle.__context__, OSError)
