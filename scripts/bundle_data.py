#!/usr/bin/env python3
"""Bundle the study's datasets (except IFEval, bundled separately) into `src/esft/data/*.jsonl.gz`.

    python scripts/bundle_data.py DATA_DIR      # the folder of the datasets' verbatim copies, one subfolder per task

Reads the verbatim copies in the shared data folder, checks them against the checksums and counts recorded
in their SOURCE.md files, keeps only the fields the tasks need and writes gzip-compressed JSONL. Output is
byte-for-byte deterministic (fixed row order, gzip mtime 0, no file name in the gzip header), so re-running
gives identical files. Also writes `src/esft/data/SOURCES.md` (provenance, licences, what we derived),
keeping any section it does not own (IFEval's, from `scripts/bundle_ifeval.py`).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "src" / "esft" / "data"

# sha256 of the original files, copied from the SOURCE.md next to each (the bundle refuses other bytes).
EXPECTED_SHA256 = {
    "countdown/train.jsonl": "fc70bffbbbc27cda0428fd236c3fceb1f44253193f92d5510e7505143fb4ce4b",
    "countdown/test.jsonl": "e956cb350ed578a101c3c152092e12ddca191ef4d83421112ad671000a7b03c7",
    "math/math500_test.jsonl": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    "math/math_train.part1of2.jsonl": "da13a9851e0ae6d18e328df3c34a0a44273fcc2d3d333a8b4a075cf2ec8edc9c",
    "math/math_train.part2of2.jsonl": "2146f518bc1af513acfd5cb38c5072a4521ee516e7a092c7d5ec757ca9ab8d44",
    "boolq/dev.jsonl": "ebc29ea3808c5c611672384b3de56e83349fe38fc1fe876fd29b674d81d0a80a",
}
MMLU_TEST_CONCAT_SHA256 = "fa58faff5210aee66e8791f191a56016fa3d33be6b7f484a1463ae5984b834e0"
SCIKNOWEVAL_SHA256 = {
    "L1/chemical_literature_QA.jsonl": "3594148647d15b97ecfced3ef453edea5dcde615ad21c18c707e9832ac92bc25",
    "L2/chemical_detailed_understanding.jsonl": "a24ac56520b0ce45cab2a7b46f5f06609465f58af714e1efd967201ee9d65058",
    "L2/chemical_hypothesis_verification.jsonl": "c29745226d94ec2d50abb2f29b3272b6163c83fca8c2b8f399c69cc54ab9cdef",
    "L2/chemical_text_summary.jsonl": "ce11f11ccf70297086a39aeb696123ca85a1eef08b54bbc652ccaa9cc7d21177",
    "L2/extract_doping.jsonl": "56d9460d392543c3e160f396b730c695dd8533def93f3279b60bff39c0a9a04d",
    "L2/reaction_mechanism_inference.jsonl": "d1f233d0fbfd667a6535e74267b1ff33f88b0607d7a8f6b1df1a2e67e5a56c69",
    "L3/balancing_chemical_equation.jsonl": "e659e9d778feb4a18d508acadf8c17b196430c7832ea93ad9fc69bcc9fad6ac6",
    "L3/molar_weight_calculation.jsonl": "8ee1c16101285bfad4a0d6d00a7f63dda4a1eeb0889a7d60434dd7f52ae16d59",
    "L3/molecular_property_calculation.jsonl": "af3ee403cb0abb7de2539e5da6a769fc46fcde6ec8033d30f1fc781354d70334",
    "L3/molecule_structure_prediction.jsonl": "39f8efeb1215e93b442f1c90769a8e5532b792f63a393805ad9587d669c8dd6f",
    "L3/reaction_prediction.jsonl": "18505e7b260036e5b8ab77b39f2b9ba1deffe323e9c271358384d375aeca9477",
    "L3/retrosynthesis.jsonl": "15ce5f6de432a75dbc65a658b2370ea71bc8a6312df269dcc5ba27e6ddf1e4a8",
    "L4/chemical_harmful_QA.jsonl": "44472ad772b3d6b786551b43bf07a6b70ed3da0d68d2b990eccad6ab08fcd432",
    "L4/chemical_laboratory_safety_test.jsonl": "0308138116629111837601a0ab680642956ccf4cce2503e3336d246f395c531f",
    "L4/mol_toxicity_prediction.jsonl": "1ac6bde3c92b82a94e157d8009fa0f828904177b30031ee460f147a373a044eb",
    "L5/chemical_procedure_generation.jsonl": "0e928c7fc7a9b21019d8433a25236f21dd2eb37646ae986bcab966abb45e3ce2",
    "L5/chemical_reagent_generation.jsonl": "113ccdeae1be6872066dd3ff3b7c413811dee5083aec8a375b3f6268722ce4d2",
}


class BundleError(RuntimeError):
    pass


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_checked(root: Path, rel: str, expected: str | None) -> bytes:
    data = (root / rel).read_bytes()
    if expected is not None and sha256_bytes(data) != expected:
        raise BundleError(f"{rel}: sha256 {sha256_bytes(data)} != expected {expected} (not the documented file)")
    return data


def jsonl_rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise BundleError(message)


def write_jsonl_gz(path: Path, rows: list[dict]) -> bytes:
    """Deterministic gzip JSONL: keys in the order given, mtime 0, no file name in the header."""
    text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    data = buf.getvalue()
    path.write_bytes(data)
    return data


# ---- per dataset ------------------------------------------------------------------------------------------
def bundle_countdown(root: Path) -> dict[str, list[dict]]:
    out = {}
    for split, n in (("train", 8001), ("test", 2001)):
        rows = jsonl_rows(read_checked(root, f"countdown/{split}.jsonl", EXPECTED_SHA256[f"countdown/{split}.jsonl"]))
        expect(len(rows) == n, f"countdown {split}: {len(rows)} rows, expected {n}")
        out[f"countdown_{split}.jsonl.gz"] = [
            {"target": int(r["target"]), "nums": [int(x) for x in r["nums"]], "hf_row": int(r["hf_row"])} for r in rows
        ]
    return out


def _math_row(r: dict) -> dict:
    # `solution` is dropped: the scorer needs only `answer`, and solutions are ~90% of the bytes.
    return {k: r[k] for k in ("problem", "answer", "subject", "level", "unique_id")}


def bundle_math(root: Path) -> dict[str, list[dict]]:
    test = jsonl_rows(read_checked(root, "math/math500_test.jsonl", EXPECTED_SHA256["math/math500_test.jsonl"]))
    train = []
    for part in ("math/math_train.part1of2.jsonl", "math/math_train.part2of2.jsonl"):
        train += jsonl_rows(read_checked(root, part, EXPECTED_SHA256[part]))
    expect(len(test) == 500 and len(train) == 7500, f"math: {len(test)} test / {len(train)} train rows")
    test_problems = {r["problem"] for r in test}
    expect(not any(r["problem"] in test_problems for r in train), "math: train overlaps MATH-500")
    return {"math_test.jsonl.gz": [_math_row(r) for r in test], "math_train.jsonl.gz": [_math_row(r) for r in train]}


def bundle_chemistry(root: Path) -> dict[str, list[dict]]:
    """SciKnowEval V2 Chemistry, `mcq-4-choices` only, in sorted-path order then row order."""
    rows = []
    for rel, expected in sorted(SCIKNOWEVAL_SHA256.items()):
        for i, r in enumerate(jsonl_rows(read_checked(root / "sciknoweval" / "Chemistry", rel, expected))):
            if r.get("type") != "mcq-4-choices":
                continue
            expect(r["choices"]["label"] == ["A", "B", "C", "D"], f"{rel}:{i}: labels {r['choices']['label']}")
            expect(len(r["choices"]["text"]) == 4 and r["answerKey"] in "ABCD" and len(r["answerKey"]) == 1,
                   f"{rel}:{i}: malformed MCQ record")
            details = r.get("details") or {}
            rows.append({
                "id": f"{rel.removesuffix('.jsonl')}/{i}",
                "question": r["question"],
                "choices": list(r["choices"]["text"]),
                "answer": r["answerKey"],
                "level": details.get("level"),
                "task": details.get("task"),
                "subtask": details.get("subtask"),
            })
    expect(len(rows) == 6263, f"chemistry: {len(rows)} MCQ records, expected 6263")
    return {"chemistry_mcq.jsonl.gz": rows}


def bundle_mmlu(root: Path) -> dict[str, list[dict]]:
    """MMLU test and val CSVs (no header; question, A, B, C, D, answer) in filename order then row order."""
    concat = b"".join((p.read_bytes() for p in sorted((root / "mmlu" / "test").glob("*.csv"))))
    expect(sha256_bytes(concat) == MMLU_TEST_CONCAT_SHA256, "mmlu test CSVs: concatenated sha256 mismatch")
    out = {}
    for split, n in (("test", 14042), ("val", 1531)):
        rows = []
        files = sorted((root / "mmlu" / split).glob(f"*_{split}.csv"))
        expect(len(files) == 57, f"mmlu {split}: {len(files)} files, expected 57")
        for path in files:
            subject = path.name.removesuffix(f"_{split}.csv")
            with path.open(newline="", encoding="utf-8") as fh:
                for i, rec in enumerate(csv.reader(fh)):
                    expect(len(rec) == 6 and rec[5] in ("A", "B", "C", "D"), f"{path.name}:{i}: bad row")
                    rows.append({"id": f"{subject}/{i}", "subject": subject, "question": rec[0],
                                 "choices": rec[1:5], "answer": rec[5]})
        expect(len(rows) == n, f"mmlu {split}: {len(rows)} rows, expected {n}")
        out[f"mmlu_{split}.jsonl.gz"] = rows
    return out


def bundle_boolq(root: Path) -> dict[str, list[dict]]:
    rows = jsonl_rows(read_checked(root, "boolq/dev.jsonl", EXPECTED_SHA256["boolq/dev.jsonl"]))
    expect(len(rows) == 3270, f"boolq dev: {len(rows)} rows, expected 3270")
    expect(sum(bool(r["answer"]) for r in rows) == 2033, "boolq dev: label count differs from 2033 true")
    return {"boolq_dev.jsonl.gz": [
        {"id": f"dev/{i}", "question": r["question"], "title": r["title"], "passage": r["passage"],
         "answer": bool(r["answer"])} for i, r in enumerate(rows)
    ]}


# ---- SOURCES.md ---------------------------------------------------------------------------------------------
SOURCES_HEADER = """\
# Bundled datasets: provenance, licences, what we derived

Generated by `scripts/bundle_data.py` from the verbatim copies in the shared data folder (each described in its
`SOURCE.md`); the script checks the originals' sha256 before bundling. Files are gzip-compressed JSONL (one
example per line), written deterministically (gzip mtime 0). IFEval is bundled by `scripts/bundle_ifeval.py`,
which writes its own section (kept when this script re-runs) and is not listed in the table below.
How each task cuts these files into train/test splits is documented in `esft/tasks/<task>.py`.

## Bundled files

| file | records | bytes | sha256 |
|---|---|---|---|
"""

SOURCES_BODY = """
## Countdown (`countdown_{train,test}.jsonl.gz`)

- Dataset: HF `Jiayi-Pan/Countdown-Tasks-3to4` (the TinyZero data); its licence is **not stated** (treat as unknown).
- Bytes from `Jiayi-Pan/TinyZero` pull-request ref `refs/pull/93/head`, commit `c5cdbbe253b9db880f3e7ff17a161cbd0d8b42b0`
  (`data/countdown/{train,test}.parquet`, HF rows [0, 8001) and [8001, 10002), no shuffling). TinyZero is Apache-2.0.
- Originals (shared copy): `train.jsonl` 8,001 records sha256 `fc70bffb...4ce4b`, `test.jsonl` 2,001 records sha256
  `e956cb35...3c7` (full hashes in `scripts/bundle_data.py`).
- Fields: `target` (int 10-100), `nums` (3 or 4 ints in 1-99), `hf_row` (row in the HF dataset). All 10,002 tasks are
  solvable (checked by an exact solver upstream); no (target, nums) list is in both files, but 5 coincide once
  the numbers are sorted (the task drops those 5 from its train pool).
- Derived by us: nothing beyond re-serialisation (TinyZero's prompt/reward columns had already been dropped upstream).

## MATH (`math_test.jsonl.gz` = MATH-500, `math_train.jsonl.gz` = MATH train)

- MATH (Hendrycks et al. 2021): **MIT** (Copyright (c) 2021 Dan Hendrycks). MATH-500 / PRM800K split: **MIT** (OpenAI 2023).
- MATH-500 bytes from `hkust-nlp/simpleRL-reason` commit `cf1c7858bfc145a27aa733e75d930d34f0d318a6`, byte-identical to
  `openai/prm800k` `prm800k/math_splits/test.jsonl` (commit `7ecc794703b2877f63226f2477a49b34f9b25163`), sha256
  `35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132`, 500 records.
- Train: the 7,500 original MATH train problems (`MATH.tar` layout) from `wulei20/AML_HW4_Infer` commit
  `1460fcce590211503876311be7fdb1103117afd4`, merged upstream into two JSONL parts (sha256 `da13a985...dc9c`, `2146f518...d44`).
  Upstream derivation: `answer` = contents of the last balanced `\\boxed{}`/`\\fbox{}` of `solution` (this rule reproduces
  all 500 official MATH-500 answers); `level` parsed from "Level N" (2 problems have `null`). No train problem equals a
  MATH-500 problem (re-checked by the bundler).
- Derived by us: kept `problem`, `answer`, `subject`, `level`, `unique_id`; **dropped `solution`** (not used by the
  scorer; ~90% of the bytes). Parts 1 and 2 concatenated in that order.

## SciKnowEval Chemistry (`chemistry_mcq.jsonl.gz`)

- SciKnowEval V2 (`HICAI-ZJU/SciKnowEval` commit `53addee640092d667439e9a8901bf55f2d92c9ed`, `raw_data/Chemistry/L1-L5`;
  same data as HF `hicai-zju/SciKnowEval` v2 test). Licence: the GitHub repository has no LICENSE file; the HF dataset
  card declares **MIT**.
- Originals: 17 files, 8,994 Chemistry records (per-file sha256 in `scripts/bundle_data.py`, all checked).
- Derived by us: only the **6,263 `mcq-4-choices` records** (A 1,585 / B 1,501 / C 1,551 / D 1,626), in sorted file-path
  order then row order. Fields: `id` (`<level>/<file stem>/<row>`), `question`, `choices` (the 4 option texts, labels
  A-D), `answer` (= `answerKey`), `level`, `task`, `subtask` (from `details`). Dropped: the per-record instruction
  `prompt.default`, the empty `answer`, `type`, `domain`, `details.source`.
- SciKnowEval has no train split; train and test are carved from this pool by the task (seeded shuffle). The HF row
  order may differ from these files, so Bhoy1/ESvsGRPO's exact split is not reproduced.

## MMLU (`mmlu_test.jsonl.gz`, `mmlu_val.jsonl.gz`)

- Hendrycks et al. (ICLR 2021), `hendrycks/test`: **MIT** (Copyright (c) 2020 Dan Hendrycks).
- Bytes: original `data/{test,val}/*.csv` from `hiyouga/LLaMA-Factory` commit `465ee8119aa489a41bee0b01b3c105a2f3dd137f`,
  `evaluation/mmlu/mmlu.zip` (extracted unchanged; LLaMA-Factory is Apache-2.0). sha256 of all test CSVs concatenated in
  filename order: `fa58faff5210aee66e8791f191a56016fa3d33be6b7f484a1463ae5984b834e0` (checked).
- Derived by us: the header-less CSV rows (`question, A, B, C, D, answer`) parsed with `csv` into `question`,
  `choices` [A, B, C, D], `answer` (letter), `subject` (from the file name) and `id` (`<subject>/<row>`), in filename
  order then row order. Test 14,042 rows (A 3,222 / B 3,462 / C 3,582 / D 3,776), val 1,531. The few-shot `dev` split
  and auxiliary_train are not bundled (MMLU is a zero-shot holdout here).

## BoolQ (`boolq_dev.jsonl.gz`)

- Clark et al. (NAACL 2019), `google-research-datasets/boolean-questions`: **CC BY-SA 3.0** (share-alike: this bundled
  file must keep that licence). HF equivalent: `google/boolq` `validation`.
- Bytes from `dwzhu-pku/boolqQA` commit `a88d374e9d0b9fa6712e33a80aefdc916ba6718a`, `datafile/dev.jsonl`, sha256
  `ebc29ea3808c5c611672384b3de56e83349fe38fc1fe876fd29b674d81d0a80a`: 3,270 records, 2,033 true / 1,237 false
  (the documented release; no official checksum exists).
- Derived by us: added `id` (`dev/<row>`), kept `question`, `title`, `passage`, `answer` (bool), original order.
- The official train split (9,427) could not be obtained; the task carves train and test from dev (see
  `esft/tasks/boolq.py`), or uses `google/boolq` `train` when loaded from the hub.
"""


def split_sections(text: str) -> tuple[str, list[str]]:
    """(preamble, ["## heading...", ...]): the file cut before every level-2 heading."""
    parts, current = [], []
    preamble = None
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            if preamble is None:
                preamble = "".join(current)
            else:
                parts.append("".join(current))
            current = []
        current.append(line)
    if preamble is None:
        return "".join(current), []
    parts.append("".join(current))
    return preamble, parts


def foreign_sections(text: str) -> list[str]:
    """Sections of an existing SOURCES.md that this script does not write (e.g. IFEval's, written by
    `scripts/bundle_ifeval.py`); they are kept, so the two scripts can run in either order."""
    _, ours = split_sections(SOURCES_HEADER + SOURCES_BODY)
    our_headings = {s.splitlines()[0] for s in ours}
    _, theirs = split_sections(text)
    return [s for s in theirs if s.splitlines()[0] not in our_headings]


def write_sources(out_dir: Path, written: dict[str, tuple[int, bytes]]) -> str:
    table = "".join(
        f"| `{name}` | {n:,} | {len(data):,} | `{sha256_bytes(data)}` |\n" for name, (n, data) in sorted(written.items())
    )
    path = out_dir / "SOURCES.md"
    kept = foreign_sections(path.read_text(encoding="utf-8")) if path.exists() else []
    text = SOURCES_HEADER + table + SOURCES_BODY
    for section in kept:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="folder of the datasets' verbatim copies (one subfolder per task, each "
                        "with its SOURCE.md)")
    parser.add_argument("--out", default=str(OUT_DIR), help="output folder (default: src/esft/data)")
    args = parser.parse_args(argv)
    root, out_dir = Path(args.data_dir), Path(args.out)
    if not root.is_dir():
        print(f"error: data folder {root} does not exist", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, tuple[int, bytes]] = {}
    try:
        for bundle in (bundle_countdown, bundle_math, bundle_chemistry, bundle_mmlu, bundle_boolq):
            for name, rows in bundle(root).items():
                written[name] = (len(rows), write_jsonl_gz(out_dir / name, rows))
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_sources(out_dir, written)
    total = sum(len(data) for _, data in written.values())
    for name, (n, data) in sorted(written.items()):
        print(f"{name:28s} {n:7,d} records {len(data):11,d} bytes")
    print(f"{'total':28s} {'':15s} {total:11,d} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
