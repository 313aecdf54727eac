"""esft.analysis.report_cache against its definition: the file-name form of a label."""

from __future__ import annotations

import hashlib

from esft.analysis.report_cache import slug


def test_slug_spells_out_and_appends_six_hex_digits_of_the_texts_hash():
    text = "countdown:ops=+"
    assert slug(text) == "countdown_ops_plus-" + hashlib.sha1(text.encode()).hexdigest()[:6]
    assert slug("countdown:ops=*").startswith("countdown_ops_times-") and len(slug("countdown:ops=*")) == 26
    assert slug("plain-name_1") == "plain-name_1"


def test_fingerprint_is_each_path_with_its_weight_files_times_to_the_millisecond(tmp_path):
    import os

    from esft.analysis.report_cache import fingerprint

    run = tmp_path / "run"
    run.mkdir()
    for name, t in (("b.safetensors", 2000.98765), ("a.safetensors", 1000.12345), ("notes.txt", 5.0)):
        (run / name).write_text("x")
        os.utime(run / name, (t, t))
    single = tmp_path / "one.safetensors"
    single.write_text("x")
    os.utime(single, (7.0004, 7.0004))
    assert fingerprint([run, None, single]) == [[str(run), [1000.123, 2000.988]], None, [str(single), [7.0]]]


def test_a_cached_result_comes_back_as_json_and_an_entry_without_seconds_counts_none(tmp_path):
    """Arrays and paths are stored as lists and text, and returned as the cache will return them later; a cached
    file that has no `seconds` (an older esft's) is reported as reused in 0 s, not as a computation's time."""
    import json
    from pathlib import Path

    import numpy as np

    from esft.analysis.report_cache import Cache

    cache = Cache(tmp_path, recompute=False)
    result, reused = cache.get("r", {"k": 1}, lambda: {"values": np.array([1.5, 2.0]), "where": Path("/a/b")})
    assert (result, reused) == ({"values": [1.5, 2.0], "where": "/a/b"}, False)
    data = json.loads((tmp_path / "data" / "r.json").read_text())
    assert data["result"] == result and data["params"] == {"k": 1}
    del data["seconds"]
    (tmp_path / "data" / "r.json").write_text(json.dumps(data))
    again = Cache(tmp_path, recompute=False)
    assert again.get("r", {"k": 1}, lambda: 1 / 0) == (result, True)
    assert again.entries == [("r", True, 0.0)]
