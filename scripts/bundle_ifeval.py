"""Bundle IFEval into `src/esft/data/ifeval.jsonl.gz` and (re)write its section of `src/esft/data/SOURCES.md`.

Usage: python scripts/bundle_ifeval.py DATA_DIR   (the folder of the datasets' verbatim copies, with ifeval/)

The 541 records are copied byte for byte (only gzip-compressed, mtime 0, no file name in the header), so
running it twice gives identical files. The original's sha256 is checked first. The IFEval section of
SOURCES.md is replaced in place if present, otherwise appended; the rest of the file is left alone
(`scripts/bundle_data.py` writes the other datasets' sections; run this script after it).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "src" / "esft" / "data"
OUT_NAME = "ifeval.jsonl.gz"
SOURCE_SHA256 = "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49"
SOURCE_RECORDS = 541
SECTION_HEADING = "## IFEval (`ifeval.jsonl.gz`)"

SECTION = """\
## IFEval (`ifeval.jsonl.gz`)

- Zhou et al. (2023), "Instruction-Following Evaluation for Large Language Models": **Apache-2.0**
  (`google-research/google-research`, `instruction_following_eval/data/input_data.jsonl`; also HF `google/IFEval`).
- Bytes from `microsoft/llm-steer-instruct` commit `ebfde1bd81d6b5f66cf3f212b2f926b6a21b281d`,
  `ifeval_experiments/data/input_data.jsonl` (a verbatim copy; that repository is MIT). Its size, first 16,000 and
  last 15,111 characters match the google-research file (stored copy at commit `19638399cc9e03623c5b9087a1d6fa8813974ce9`).
  Not `Podtech-AI/IFEval`, which drops key 2785 (540 records).
- Original: {records} records, {src_bytes:,} bytes, sha256 `{src_sha}` (checked by `scripts/bundle_ifeval.py`).
- Bundled: `ifeval.jsonl.gz`, {gz_bytes:,} bytes, sha256 `{gz_sha}`; the original bytes gzip-compressed
  (mtime 0), nothing changed. Fields: `key`, `prompt`, `instruction_id_list`, `kwargs` (unused parameters omitted).
- Derived by us: nothing. Split: `test` only (541 prompts, 834 instructions); a held-out task, never trained on.
  Checkers: `esft/tasks/ifeval/` (written from the paper's instruction definitions; no code copied).
"""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gzip_deterministic(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return buf.getvalue()


def replace_section(text: str, section: str) -> str:
    """Put `section` in place of the existing IFEval section (up to the next "## " heading), or append it."""
    start = text.find(SECTION_HEADING)
    if start == -1:
        return text.rstrip("\n") + "\n\n" + section if text.strip() else section
    end = text.find("\n## ", start + len(SECTION_HEADING))
    tail = "" if end == -1 else text[end:]
    return text[:start] + section + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="folder of the datasets' verbatim copies (with ifeval/ and its SOURCE.md)")
    args = parser.parse_args(argv)
    src = Path(args.data_dir) / "ifeval" / "input_data.jsonl"
    if not src.is_file():
        print(f"error: {src} does not exist", file=sys.stderr)
        return 2
    raw = src.read_bytes()
    if sha256_bytes(raw) != SOURCE_SHA256:
        print(f"error: {src} sha256 {sha256_bytes(raw)} != expected {SOURCE_SHA256}", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    assert len(rows) == SOURCE_RECORDS, len(rows)
    packed = gzip_deterministic(raw)
    (OUT_DIR / OUT_NAME).write_bytes(packed)
    section = SECTION.format(records=len(rows), src_bytes=len(raw), src_sha=SOURCE_SHA256,
                             gz_bytes=len(packed), gz_sha=sha256_bytes(packed))
    sources = OUT_DIR / "SOURCES.md"
    old = sources.read_text(encoding="utf-8") if sources.exists() else ""
    sources.write_text(replace_section(old, section), encoding="utf-8")
    print(f"wrote {OUT_NAME}: {len(rows)} records, {len(packed):,} bytes, sha256 {sha256_bytes(packed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
