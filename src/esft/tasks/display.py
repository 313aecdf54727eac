"""A task string as tables, figures and headings show it: a data file by its file name.

config.yaml records a data task's file by its absolute path (esft.tasks.custom.absolute_data_task), so that a
resume or a report finds it from any folder; a reader wants `sums.jsonl`, not `/home/me/data/sums.jsonl`.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from esft.tasks.custom import external_kind, split_options

_TEST_FILE = re.compile(r"((?:^|,)\s*test_file\s*=\s*)([^,]+)", re.IGNORECASE)


def shown_task(spec: Any) -> str:
    """`spec` with its data file, and a `test_file` option's, by file name (options otherwise as given: a value may
    hold a "/" or a ":"); any other task string as it is."""
    text = str(spec)
    if external_kind(text) != "data":
        return text
    source, options = split_options(text)
    options = _TEST_FILE.sub(lambda m: m.group(1) + PurePath(m.group(2).strip()).name, options)
    return PurePath(source).name + (f":{options}" if options else "")
