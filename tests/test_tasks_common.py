"""Cross-task checks for countdown, math, chemistry, mmlu, boolq: registry, TRL reward adapter, a 10,000-completion
fuzz per task, Hugging Face hub loading (with a fake `datasets` module) and the deterministic data bundle.

Run: pytest tests/test_tasks_common.py -q -s      (-s shows the measured fuzz timings)
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys
import time
import types
from pathlib import Path

import pytest

from esft.tasks import get_task, last_boxed
from esft.tasks.common import load_hub_rows, parse_hf_spec, seeded_sample, seeded_shuffle

TASKS = ("countdown", "math", "chemistry", "mmlu", "boolq")
REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# One right and one wrong completion per task, for an example of that task.
CASES = {
    "countdown": ({"nums": [44, 19, 35], "target": 98}, "\\boxed{44 + 19 + 35}", "\\boxed{44 - 19 + 35}"),
    "math": ({"problem": "1/2 + 1/4?", "answer": "\\frac{3}{4}"}, "so \\boxed{0.75}", "\\boxed{\\frac{1}{2}}"),
    "chemistry": ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "B"}, '{"answer": "B"}',
                  'Hmm.\n{"answer": "C"}'),
    "mmlu": ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "D", "subject": "anatomy"},
             'The answer is D.\n{"answer": "D"}', '{"answer": "A"}'),
    "boolq": ({"question": "q", "passage": "p", "title": "t", "answer": False}, "\\boxed{no}", "\\boxed{yes}"),
}


@pytest.fixture(scope="module")
def tasks():
    return {name: get_task(name) for name in TASKS}


def test_registry_builds_every_task_with_no_arguments(tasks):
    for name, task in tasks.items():
        assert task.name == name
        assert "train" in task.splits and "test" in task.splits
        assert task.system_prompt and task.prompt(CASES[name][0])[0] == {"role": "system", "content": task.system_prompt}
    assert get_task("  BoolQ ").name == "boolq"


@pytest.mark.parametrize("name", TASKS)
def test_every_task_accepts_hf_dataset_option(name):
    assert get_task(name, hf_dataset=None).hf_dataset is None
    assert get_task(name, hf_dataset="owner/data").hf_dataset == "owner/data"  # stored, loaded only on demand


# ---- TRL reward adapter ---------------------------------------------------------------------------------------
def _columns(examples: list[dict]) -> dict[str, list]:
    return {k: [ex[k] for ex in examples] for k in examples[0]}


@pytest.mark.parametrize("name", TASKS)
def test_reward_function_with_trl_column_kwargs(tasks, name):
    ex, right, wrong = CASES[name]
    reward = tasks[name].reward_function()
    # TRL passes prompts, completions, completion_ids and every dataset column as keyword lists, plus trainer_state.
    out = reward(completions=[right, wrong, right], prompts=["p"] * 3, completion_ids=[[1], [2], [3]],
                 trainer_state=object(), **_columns([ex, ex, ex]))
    assert out == [1.0, 0.0, 1.0] and all(type(x) is float for x in out)
    assert reward.__name__ == f"{name}_reward"


@pytest.mark.parametrize("name", TASKS)
def test_reward_function_with_conversational_completions(tasks, name):
    ex, right, wrong = CASES[name]
    reward = tasks[name].reward_function()
    completions = [[{"role": "assistant", "content": right}], [{"role": "assistant", "content": wrong}]]
    assert reward(completions, **_columns([ex, ex])) == [1.0, 0.0]
    assert reward(completions, examples=[ex, ex]) == [1.0, 0.0]


@pytest.mark.parametrize("name", TASKS)
def test_reward_function_format_bonus(tasks, name):
    ex, right, wrong = CASES[name]
    reward = tasks[name].reward_function(format_bonus=0.1)
    assert reward([right, wrong, "no answer here at all"], examples=[ex, ex, ex]) == pytest.approx([1.1, 0.1, 0.0])


# What each CASES completion answers (right, wrong): the box's or the JSON's content, as written there.
EXTRACTED = {"countdown": ("44 + 19 + 35", "44 - 19 + 35"), "math": ("0.75", "\\frac{1}{2}"), "chemistry": ("B", "C"),
             "mmlu": ("D", "A"), "boolq": ("no", "yes")}


@pytest.mark.parametrize("name", TASKS)
def test_details_report_the_extracted_answer(tasks, name):
    ex, right, wrong = CASES[name]
    assert [tasks[name].details(c, ex)["extracted"] for c in (right, wrong)] == list(EXTRACTED[name])
    assert tasks[name].details("", ex)["extracted"] is None


@pytest.mark.parametrize("name", TASKS)
def test_aggregate(tasks, name):
    ex, right, wrong = CASES[name]
    task = tasks[name]
    records = [{"score": task.score(c, ex), "well_formed": task.is_well_formed(c, ex)} for c in (right, wrong, "")]
    summary = task.aggregate(records)
    assert summary["n"] == 3 and summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["format_rate"] == pytest.approx(2 / 3)


# ---- fuzz ---------------------------------------------------------------------------------------------------------
_PIECES = [
    "\\boxed{", "\\fbox{", "{", "}", "(", ")", "*", "**", "/", "//", "+", "-", " ", "\n", ".", ",", ":", '"', "'",
    "answer", "Answer:", '"answer": "', "A", "B", "C", "D", "a", "yes", "no", "True", "0", "1", "44", "19", "35",
    "9" * 12, "\\frac", "\\dfrac{", "\\text{", "\\left(", "\\right)", "^\\circ", "\\$", "%", "\\!", "\\\\", "=",
    "__import__('os')", "é", "😀", "−", "\x00", "\u200b", "٣", "ｙｅｓ", "\\", "x", "A dog",
]


def junk_completions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = rng.choices(_PIECES, k=rng.randint(0, 200))
        if rng.random() < 0.3:  # keep boxes balanced sometimes so the deeper scorer paths run
            parts = ["\\boxed{"] + parts + ["}"]
        out.append("".join(parts))
    return out


def test_fuzz_10000_junk_completions_per_task(tasks):
    completions = junk_completions(10_000, seed=1234)
    timings = {}
    positives = {}
    for name in TASKS:
        ex = CASES[name][0]
        task = tasks[name]
        start = time.perf_counter()
        scores = [task.score(c, ex) for c in completions]
        for c in completions[:1000]:
            task.is_well_formed(c, ex)
            task.details(c, ex)
        timings[name] = time.perf_counter() - start
        assert set(scores) <= {0.0, 1.0}
        positives[name] = sum(scores)
    total = sum(timings.values())
    print("\nfuzz, 10,000 completions per task (score) + 1,000 (is_well_formed, details): "
          + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()) + f"; total {total:.2f}s; "
          + "correct by chance: " + ", ".join(f"{k} {int(v)}" for k, v in positives.items()))
    assert total < 30.0
    # the fuzz reaches the success paths of the letter and yes/no scorers
    assert positives["chemistry"] > 0 and positives["mmlu"] > 0 and positives["boolq"] > 0


# ---- Hugging Face hub loading, with a fake `datasets` module ------------------------------------------------------
class FakeDatasets(types.ModuleType):
    def __init__(self, tables: dict[tuple[str, str | None, str], list[dict]]):
        super().__init__("datasets")
        self.tables = tables
        self.calls: list[tuple[str, str | None, str]] = []

    def load_dataset(self, name, config=None, split=None):
        self.calls.append((name, config, split))
        key = (name, config, split.split("[")[0])
        if key not in self.tables:
            raise ConnectionError("hub unreachable")
        rows = self.tables[key]
        if "[:" in split:
            rows = rows[: int(split.split("[:")[1].rstrip("]"))]
        return rows


@pytest.mark.parametrize("text, expected", [
    ("\\boxed{5}", "5"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\boxed{7}}", "7"),                           # the box that opens last is the inner one
    ("\\boxed{\\boxed{7}", "7"),
    ("\\boxed{5}}", "5"),
    ("{ \\boxed{5}", "5"),
    ("\\boxed{5} ... no, it is \\boxed{7", None),            # cut off: the replaced answer is not the answer
    ("\\boxed{yes}. Wait, actually \\boxed{\\text{no}", None),
    ("\\boxed{", None),
    ("no box", None),
])
def test_last_boxed_reads_the_box_that_opens_last(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("name", TASKS[:2] + ("boolq",))
def test_an_unclosed_last_box_scores_zero_even_after_a_right_one(tasks, name):
    example, right, _ = CASES[name]
    completion = right + " Hmm, let me redo that. \\boxed{" + "\\frac{1}{"
    assert tasks[name].score(right, example) == 1.0
    assert tasks[name].score(completion, example) == 0.0
    assert not tasks[name].is_well_formed(completion, example)


def test_parse_hf_spec():
    assert parse_hf_spec("cais/mmlu") == ("cais/mmlu", None)
    assert parse_hf_spec("cais/mmlu", "all") == ("cais/mmlu", "all")
    assert parse_hf_spec("cais/mmlu:anatomy", "all") == ("cais/mmlu", "anatomy")
    assert parse_hf_spec("cais/mmlu:", "all") == ("cais/mmlu", "all")        # an empty config is no config
    with pytest.raises(ValueError):
        parse_hf_spec(":x")
    assert parse_hf_spec("  cais/mmlu:anatomy \n") == ("cais/mmlu", "anatomy")  # surrounding blanks dropped
    with pytest.raises(ValueError):
        parse_hf_spec("   ")


def test_seeded_sample_and_shuffle_follow_their_seed():
    """A sample asking for more rows than there are is all of them; the `seed` argument picks the draw."""
    rows = list(range(50))
    assert sorted(seeded_sample("abc", 5)) == ["a", "b", "c"]
    assert seeded_sample(rows, 10) == seeded_sample(rows, 10, seed=42) != seeded_sample(rows, 10, seed=1)
    assert seeded_shuffle(rows) == seeded_shuffle(rows, seed=42) != seeded_shuffle(rows, seed=1)
    assert sorted(seeded_shuffle(rows, seed=1)) == rows


def test_missing_datasets_package_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(RuntimeError, match=r"pip install 'esft\[hub\]'"):
        load_hub_rows("google/boolq", "validation")
    with pytest.raises(RuntimeError, match="datasets"):
        get_task("boolq", hf_dataset="google/boolq").load("test")


def test_unreachable_hub_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets({}))
    with pytest.raises(RuntimeError, match=r"could not load Hugging Face dataset 'google/boolq'.*hub unreachable"):
        get_task("boolq", hf_dataset="google/boolq").load("test")


def test_unknown_split_or_config_gives_a_clear_error(monkeypatch):
    """`datasets` raises ValueError for a split or config the dataset lacks: that too becomes the RuntimeError
    that names the dataset, not a bare traceback."""
    fake = FakeDatasets({})

    def load_dataset(name, config=None, split=None):
        raise ValueError(f"Unknown split {split!r}")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(RuntimeError, match=r"'cais/mmlu' \(config 'x', split 'dev'\): ValueError: Unknown split"):
        load_hub_rows("cais/mmlu:x", "dev")


def test_hub_loading_maps_fields_and_cuts_splits(monkeypatch):
    countdown_rows = [{"target": 10 + i % 90, "nums": [i, 2, 3]} for i in range(10_002)]  # all distinct puzzles
    boolq_val = [{"question": f"q{i}", "answer": i % 2 == 0, "passage": "p"} for i in range(3270)]
    boolq_train = [{"question": f"t{i}", "answer": True, "passage": "p"} for i in range(500)]
    mmlu_test = [{"question": f"q{i}", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": i % 4}
                 for i in range(10)]
    chem = [{"question": f"q{i}", "choices": {"text": ["1", "2", "3", "4"], "label": ["A", "B", "C", "D"]},
             "answerKey": "A", "type": "mcq-4-choices" if i % 2 else "true_or_false", "domain": "Chemistry"}
            for i in range(5000)]
    math_test = [{"problem": "p", "answer": "1", "unique_id": "test/x/1.json", "subject": "Algebra", "level": 1}]
    fake = FakeDatasets({
        ("Jiayi-Pan/Countdown-Tasks-3to4", None, "train"): countdown_rows,
        ("google/boolq", None, "validation"): boolq_val,
        ("google/boolq", None, "train"): boolq_train,
        ("cais/mmlu", "all", "test"): mmlu_test,
        ("hicai-zju/SciKnowEval", "v2", "test"): chem,
        ("HuggingFaceH4/MATH-500", None, "test"): math_test,
    })
    monkeypatch.setitem(sys.modules, "datasets", fake)

    cd = get_task("countdown", hf_dataset="Jiayi-Pan/Countdown-Tasks-3to4")
    assert len(cd.load("test")) == 2000 and cd.load("test")[0]["hf_row"] == 8001
    assert len(cd.load("train")) == 200
    assert ("Jiayi-Pan/Countdown-Tasks-3to4", None, "train[:10002]") in fake.calls

    bq = get_task("boolq", hf_dataset="google/boolq")
    assert len(bq.load("test")) == 2000 and len(bq.load("train_pool")) == 500
    assert bq.load("test")[1] == {"id": "hf/1", "question": "q1", "title": "", "passage": "p", "answer": False}

    mm = get_task("mmlu", hf_dataset="cais/mmlu", shuffle=False)
    assert [r["answer"] for r in mm.load("test")[:4]] == ["A", "B", "C", "D"]

    ch = get_task("chemistry", hf_dataset="hicai-zju/SciKnowEval")
    assert len(ch.load("train")) == 200 and len(ch.load("test")) == 2000 and len(ch.load("train_pool")) == 500

    mt = get_task("math", hf_dataset="HuggingFaceH4/MATH-500")
    assert mt.load("test") == [{"id": "test/x/1.json", "problem": "p", "answer": "1", "subject": "Algebra", "level": 1}]


# ---- the data bundle ----------------------------------------------------------------------------------------------
def _load_bundler():
    spec = importlib.util.spec_from_file_location("bundle_data", REPO / "scripts" / "bundle_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared data folder not present")
def test_bundle_is_deterministic_and_matches_the_committed_files(tmp_path, capsys):
    bundler = _load_bundler()
    (tmp_path / "SOURCES.md").write_text("# old\n\n## IFEval (`ifeval.jsonl.gz`)\n\nkept\n", encoding="utf-8")
    assert bundler.main([str(SHARED_DATA), "--out", str(tmp_path)]) == 0
    data_dir = REPO / "src" / "esft" / "data"
    built = sorted(p.name for p in tmp_path.glob("*.jsonl.gz"))
    assert built == ["boolq_dev.jsonl.gz", "chemistry_mcq.jsonl.gz", "countdown_test.jsonl.gz",
                     "countdown_train.jsonl.gz", "math_test.jsonl.gz", "math_train.jsonl.gz",
                     "mmlu_test.jsonl.gz", "mmlu_val.jsonl.gz"]
    for name in built:
        assert (tmp_path / name).read_bytes() == (data_dir / name).read_bytes(), f"{name} is stale: re-run the bundler"
    sources = (tmp_path / "SOURCES.md").read_text(encoding="utf-8")
    assert sources.rstrip().endswith("## IFEval (`ifeval.jsonl.gz`)\n\nkept")  # another script's section survives
    committed = (data_dir / "SOURCES.md").read_text(encoding="utf-8")
    for name in built:
        assert hashlib.sha256((data_dir / name).read_bytes()).hexdigest() in committed
    assert sum((data_dir / n).stat().st_size for n in built) < 8_000_000


def test_bundled_gzip_headers_are_deterministic():
    for path in (REPO / "src" / "esft" / "data").glob("*.jsonl.gz"):
        if path.name.startswith("ifeval"):
            continue
        header = path.read_bytes()[:10]
        assert header[:3] == b"\x1f\x8b\x08" and header[4:8] == b"\0\0\0\0", path.name  # mtime 0
        assert header[3] & 0x08 == 0, path.name  # no file name stored
