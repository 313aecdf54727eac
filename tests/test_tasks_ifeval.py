"""IFEval task: the 25 instruction checkers, strict vs loose, aggregation, bundled data, fuzzing.

Run: pytest tests/test_tasks_ifeval.py -q      (about 10 s on 2 cores; fully offline, sockets are blocked)
"""

from __future__ import annotations

import random
import re
import socket
import time

import pytest
import regex
from langdetect.lang_detect_exception import LangDetectException

from esft.tasks import get_task
from esft.tasks.base import wilson_interval
from esft.tasks.ifeval import INSTRUCTIONS, IFEvalTask, SYSTEM_PROMPT, evaluate, loose_variants, missing_params
from esft.tasks.ifeval.instructions import check_instruction
from esft.tasks.ifeval.text import NLTK_RULES, count_capital_words, count_sentences, count_words, detect_language


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Scoring must work with no network: any connection attempt fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("IFEval tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def task() -> IFEvalTask:
    return IFEvalTask()


@pytest.fixture(scope="module")
def rows(task):
    return task.load("test")


# (instruction id, kwargs as they occur in the data, a following response, a failing response)
CASES = [
    ("keywords:existence", {"keywords": ["correlated", "experiencing"]},
     "People experiencing stress often report correlated symptoms.",
     "People experiencing stress often report symptoms."),
    ("keywords:frequency", {"relation": "at least", "keyword": "story", "frequency": 2},
     "A story inside a Story.", "Just one story here."),
    ("keywords:frequency", {"relation": "less than", "keyword": "fake", "frequency": 2},
     "Nothing fake about it.", "Fake news is fake."),
    ("keywords:forbidden_words", {"forbidden_words": ["rock"]},
     "Rocket science is fun.", "I like ROCK music."),
    ("keywords:letter_frequency", {"let_relation": "at least", "letter": "#", "let_frequency": 4},
     "#one #two #three #four", "#one #two"),
    ("keywords:letter_frequency", {"let_relation": "less than", "letter": "t", "let_frequency": 2},
     "Only one T here? No: zero once more.", "That is it."),
    ("language:response_language", {"language": "de"},
     "Das ist ein schöner Tag, und wir gehen heute zusammen in den Park spazieren.",
     "This is a lovely day, and we are going for a walk in the park together."),
    ("language:response_language", {"language": "hi"},
     "आज मौसम बहुत अच्छा है और हम सब पार्क में घूमने जा रहे हैं।",
     "Today the weather is very nice and we are all going to the park."),
    ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 6},
     "Dr. Smith went home. He was tired. He slept.",
     "One. Two. Three. Four. Five. Six."),
    ("length_constraints:number_sentences", {"relation": "at least", "num_sentences": 3},
     "It rained. We stayed in. We read books.", "Dr. Smith went home. He was tired."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3},
     "First paragraph.\n***\nSecond paragraph.\n***\nThird paragraph.",
     "First paragraph.\n***\nSecond paragraph."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3},
     "***\nFirst.\n***\nSecond.\n***\nThird.\n***",  # leading/trailing dividers are tolerated
     "First.\n***\n***\nThird."),  # an empty paragraph in the middle is not
    ("length_constraints:number_words", {"relation": "at least", "num_words": 300},
     "word " * 300, "word " * 299),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 100},
     "word " * 99, "word " * 100),
    ("length_constraints:nth_paragraph_first_word",
     {"first_word": "weekend", "num_paragraphs": 4, "nth_paragraph": 1},
     '"Weekend," she said, "is for rest."\n\nTwo.\n\nThree.\n\nFour.',
     "The weekend is for rest.\n\nTwo.\n\nThree.\n\nFour."),
    # Paragraphs are indexed in the raw "\n\n" split, as in the reference: four line breaks leave an empty chunk
    # at index 2, and that is the paragraph looked at (three line breaks leave none).
    ("length_constraints:nth_paragraph_first_word",
     {"first_word": "weekend", "num_paragraphs": 2, "nth_paragraph": 2},
     "Rest.\n\n\nWeekend plans.", "Rest.\n\n\n\nWeekend plans."),
    ("length_constraints:nth_paragraph_first_word",
     {"first_word": "weekend", "num_paragraphs": 2, "nth_paragraph": 1},
     "Weekend plans.\n\nRest.", "\n\nWeekend plans.\n\nRest."),
    ("length_constraints:nth_paragraph_first_word",
     {"first_word": "president", "num_paragraphs": 6, "nth_paragraph": 2},
     "One.\n\nPresident Lincoln spoke.\n\nThree.\n\nFour.\n\nFive.\n\nSix.",
     "One.\n\nPresident Lincoln spoke.\n\nThree.\n\nFour.\n\nFive."),  # 5 paragraphs, not 6
    ("detectable_content:number_placeholders", {"num_placeholders": 7},
     "Dear [name], at [address] in [city], [state] [zip] on [date] at [time].",
     "Dear [name], at [address] in [city], [state] [zip] on [date]."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"},
     "See you soon.\n\nP.P.S. Bring snacks.", "See you soon.\n\nP.S. Bring snacks."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     "See you soon.\n\np. s. Bring snacks.", "See you soon.\n\nPS Bring snacks."),
    # Case is ignored by lower-casing, as in the reference: a long s "ſ" is no "s" (a case-insensitive regex
    # would take it for one).
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     "See you soon.\n\nP.S. Bring snacks.", "See you soon.\n\nP.ſ. Bring snacks."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     "Reasons:\n* one\n* two\n  - three", "**Reasons**\n* one\n* two"),
    # As in the reference: a "*" needs a character after it, so a lone "*" closing the text is no bullet, and a
    # line that is only "*" runs on into the next line, which then is no "*" bullet of its own.
    ("detectable_format:number_bullet_lists", {"num_bullets": 2},
     "Steps:\n* mix\n* bake\n*", "Steps:\n* mix\n* bake\n- cool\n*"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3},
     "Steps:\n* mix\n*\n* bake\n* serve", "Steps:\n* mix\n* \n* bake\n* serve"),
    ("detectable_format:constrained_response", {},
     "My answer is maybe.", "Maybe, it depends."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3},
     "*Intro* then **Body** and *End*.", "*Intro* then ** ** and **Body**."),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 4},
     "SECTION 1\na\nSECTION 2\nb\nSECTION 3\nc\nSECTION 4\nd",
     "Section 1\na\nSection 2\nb\nSection 3\nc\nSection 4\nd"),  # the splitter is case-sensitive
    ("detectable_format:json_format", {},
     '```json\n{"name": "Ada", "tags": [1, 2]}\n```', 'Here is the JSON: {"name": "Ada"}'),
    # As in the reference: "```json" opens a fence in three spellings only, and a bare "```" is removed after it.
    ("detectable_format:json_format", {},
     '```JSON\n{"name": "Ada"}\n```', '```jSoN\n{"name": "Ada"}\n```'),
    ("detectable_format:json_format", {},
     '```json```{"name": "Ada"}```', '```python\n{"name": "Ada"}\n```'),
    ("detectable_format:title", {},
     "<<Ode to Joy>>\nA poem follows.", "Ode to Joy\nA poem follows. << >>"),
    ("combination:two_responses", {},
     "First answer.\n******\nSecond answer.", "Same answer.\n******\nSame answer."),
    ("combination:repeat_prompt",
     {"prompt_to_repeat": 'Write a funny haiku about moms, containing keywords "mom" and "mother" in your response.'},
     'write a funny haiku about moms, containing keywords "mom" and "mother" in your response.\nMom...',
     "Mom is my mother."),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"},
     "Here is the plan. Is there anything else I can help with?",
     "Is there anything else I can help with? Bye."),
    ("startend:quotation", {}, '"Hello, world."', 'He said "hello".'),
    ("change_case:capital_word_frequency", {"capital_relation": "less than", "capital_frequency": 10},
     "NASA and the USA are TWO names.", " ".join(["WORD"] * 10)),
    ("change_case:capital_word_frequency", {"capital_relation": "at least", "capital_frequency": 1},
     "I CAN'T believe it.", "nothing shouts here."),
    ("change_case:english_capital", {},
     "THIS IS A SHORT ANSWER WRITTEN ENTIRELY IN CAPITAL LETTERS.", "This Is Not All Capitals."),
    ("change_case:english_capital", {},
     "THE WEATHER IS NICE TODAY AND WE ARE GOING TO THE PARK.",
     "DAS IST EIN SCHÖNER TAG UND WIR GEHEN HEUTE ZUSAMMEN IN DEN PARK."),  # capitals, but not English
    ("change_case:english_lowercase", {},
     "this is a short answer in lowercase letters only.", "this has one Capital."),
    ("punctuation:no_comma", {}, "No commas here at all.", "Yes, commas."),
]


def test_every_instruction_type_has_cases():
    assert {c[0] for c in CASES} == set(INSTRUCTIONS)
    assert len(INSTRUCTIONS) == 25


@pytest.mark.parametrize("instruction_id,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_checker_pass_and_fail(instruction_id, kwargs, good, bad):
    assert not missing_params(instruction_id, kwargs)
    assert check_instruction(instruction_id, kwargs, good) is True
    assert check_instruction(instruction_id, kwargs, bad) is False


def test_text_primitives():
    assert count_words("Hello, world! It's 2024.") == 5  # Hello world It s 2024
    assert count_words("हिन्दी भाषा") == 2  # vowel signs stay inside their word
    assert count_sentences("Dr. Smith went home. He was tired.") == 2  # Punkt knows "Dr."
    assert count_sentences("a line\nwith a break but one sentence.") == 1
    assert count_sentences("") == 0
    assert count_capital_words("The U.S. and NASA, OK?") == 3
    assert detect_language("1234 !!! ...") is None
    text = "Ceci est une phrase en français, écrite pour le test."
    assert detect_language(text) == detect_language(text) == "fr"  # seeded: repeatable


def test_loose_variants_are_the_standard_eight():
    variants = loose_variants("Sure:\n*body*\nBye")
    assert variants == ["Sure:\n*body*\nBye", "*body*\nBye", "Sure:\n*body*", "*body*",
                        "Sure:\nbody\nBye", "body\nBye", "Sure:\nbody", "body"]


LOOSE_ONLY = [
    # markdown-bold closing: the end phrase is followed by "**" as written
    ({"instruction_id_list": ["startend:end_checker"],
      "kwargs": [{"end_phrase": "Is there anything else I can help with?"}]},
     "Here is the plan.\n**Is there anything else I can help with?**"),
    # a chatty first line breaks the quotation and brings a comma
    ({"instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]},
     'Sure, here it is:\n"A quoted answer without any commas."'),
    # a markdown-wrapped JSON object (bold markers around it)
    ({"instruction_id_list": ["detectable_format:json_format"], "kwargs": [{}]},
     '**{"answer": 42}**'),
    # a sign-off line after the requested ending
    ({"instruction_id_list": ["startend:end_checker"], "kwargs": [{"end_phrase": "Peace!"}]},
     "We stand together. Peace!\nLet me know if you need more."),
]


@pytest.mark.parametrize("example,response", LOOSE_ONLY)
def test_loose_accepts_what_strict_rejects(task, example, response):
    result = evaluate(response, example)
    assert not result.prompt_strict and result.prompt_loose
    assert task.score(response, example) == 0.0
    details = task.details(response, example)
    assert details["prompt_strict"] is False and details["prompt_loose"] is True
    assert all(details["loose"]) and not all(details["strict"])


def test_blank_and_hopeless_responses_fail_both(task):
    example = {"instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]}
    for response in ("", "   \n\t"):  # blank: no instruction is followed, even "no comma"
        result = evaluate(response, example)
        assert result.strict == result.loose == (False, False)
    result = evaluate("Nope, not quoted.", example)
    assert result.strict == result.loose == (False, False)
    assert task.score("   ", {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}) == 0.0


def test_aggregate_on_a_hand_made_set(task):
    both = {"instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]}
    title = {"instruction_id_list": ["detectable_format:title", "punctuation:no_comma"], "kwargs": [{}, {}]}
    pairs = [
        (both, '"Hello world"'),  # strict 2/2
        (both, 'Sure, here you go:\n"Hello world"'),  # strict 0/2, loose 2/2
        (title, "No title, sorry."),  # 0/2 both
        ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}, "Fine."),  # strict 1/1
    ]
    records = [{"score": task.score(c, ex), **task.details(c, ex)} for ex, c in pairs]
    assert [r["score"] for r in records] == [1.0, 0.0, 0.0, 1.0]
    agg = task.aggregate(records)
    assert agg["n"] == 4 and agg["n_instructions"] == 7
    assert agg["accuracy"] == agg["prompt_strict"] == pytest.approx(2 / 4)
    assert agg["prompt_loose"] == pytest.approx(3 / 4)
    assert agg["instruction_strict"] == pytest.approx(3 / 7)
    assert agg["instruction_loose"] == pytest.approx(5 / 7)
    assert agg["ci95"] == list(wilson_interval(2, 4))
    assert task.aggregate([])["n"] == 0


def test_bundled_data_loads_and_every_instruction_is_supported(task, rows):
    assert len(rows) == 541
    assert len({r["key"] for r in rows}) == 541
    n_instructions = 0
    for r in rows:
        assert set(r) == {"key", "prompt", "instruction_id_list", "kwargs"}
        assert len(r["instruction_id_list"]) == len(r["kwargs"])
        for instruction_id, kwargs in zip(r["instruction_id_list"], r["kwargs"]):
            assert missing_params(instruction_id, kwargs) == [], (r["key"], instruction_id)
            n_instructions += 1
    assert n_instructions == 834
    assert {i for r in rows for i in r["instruction_id_list"]} == set(INSTRUCTIONS)
    assert task.load("test", limit=3) == rows[:3]
    with pytest.raises(ValueError):
        task.load("train")


def test_registry_and_prompt(task, rows):
    assert isinstance(get_task("ifeval"), IFEvalTask)
    assert task.splits == ("test",)
    messages = task.prompt(rows[0])
    assert messages == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": rows[0]["prompt"]}]


def test_reward_function_uses_the_score(task, rows):
    ex = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}], "prompt": "p"}
    reward = task.reward_function()
    out = reward(["no comma here", [{"role": "assistant", "content": "a, b"}]],
                 prompt=["p", "p"], instruction_id_list=[ex["instruction_id_list"]] * 2, kwargs=[ex["kwargs"]] * 2)
    assert out == [1.0, 0.0]


NO_COMMA = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
TWO_WORDS_HF = {"instruction_id_list": ["length_constraints:number_words"],  # HF style: None for unused params
                "kwargs": [{"num_words": 2, "relation": "at least", "keyword": None, "end_phrase": None}]}


@pytest.mark.parametrize("completion, example, expected", [
    (None, NO_COMMA, 0.0),                                               # nothing: blank, follows nothing
    ("", NO_COMMA, 0.0),
    ("   \n", NO_COMMA, 0.0),
    (42, NO_COMMA, 1.0),                                                 # written out: "42" has no comma
    ([{"role": "assistant", "content": "hi there"}], NO_COMMA, 1.0),    # a conversation: its last message
    ([{"role": "assistant", "content": "hi, there"}], NO_COMMA, 0.0),
    ("hi there", TWO_WORDS_HF, 1.0),                                     # None-valued parameters are ignored
    ("hi", TWO_WORDS_HF, 0.0),
    ("[" * 50_000, NO_COMMA, 1.0),
    ("[" * 50_000, TWO_WORDS_HF, 0.0),
])
def test_odd_completions_are_scored(task, completion, example, expected):
    assert task.score(completion, example) == expected
    details = task.details(completion, example)
    assert details["prompt_strict"] is (expected == 1.0)
    assert details["instruction_ids"] == example["instruction_id_list"]


@pytest.mark.parametrize("example, error, message", [
    ({}, KeyError, "instruction_id_list"),
    ({"instruction_id_list": ["punctuation:no_comma"]}, KeyError, "kwargs"),
    ({"instruction_id_list": ["no:such_instruction"], "kwargs": [{}]}, ValueError, "unknown instruction"),
    ({"instruction_id_list": ["keywords:frequency"], "kwargs": [{"keyword": "x"}]}, ValueError,
     "lacks frequency, relation"),
    ({"instruction_id_list": ["keywords:frequency"], "kwargs": [{"keyword": "x", "frequency": 1, "relation": "about"}]},
     ValueError, "unknown relation 'about'"),
    ({"instruction_id_list": ["keywords:frequency"], "kwargs": [{"keyword": "x", "frequency": "often",
                                                                   "relation": "at least"}]},
     ValueError, "invalid literal"),
    ({"instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}]}, ValueError,
     "one entry per instruction"),
    ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": ["not a dict"]}, TypeError, "not a dict"),
    ({"instruction_id_list": "punctuation:no_comma", "kwargs": None}, TypeError, "must be a list"),
    ({"instruction_id_list": [3], "kwargs": [{}]}, TypeError, "must be a list of ids"),
])
def test_malformed_example_raises(task, example, error, message):
    # A data bug must surface, not read as an instruction the model did not follow.
    for completion in ("hi there", "", None):
        with pytest.raises(error, match=re.escape(message)):
            task.score(completion, example)
        with pytest.raises(error, match=re.escape(message)):
            task.details(completion, example)


_JUNK_TOKENS = [
    "the", "CAT", "word", "é", "日本語", "हिन्दी", "Привет", "🙂", " ", "  ", "\n", "\n\n", "\t", "*", "**", "***",
    "******", "-", "[", "]", "<<", ">>", '"', "'", ",", ".", "!", "?", "P.S.", "P.P.S", "SECTION 1", "Section",
    "{", "}", ":", "```json", "```", "My answer is yes.", "#", "U.S.", "can't", "0", "42", "\\", "\x00", "\u200b",
]


def test_fuzz_10000_junk_completions(task, rows):
    rng = random.Random(1234)
    completions = ["".join(rng.choice(_JUNK_TOKENS) for _ in range(rng.randint(0, 300))) for _ in range(10_000)]
    examples = [rng.choice(rows) for _ in completions]
    start = time.perf_counter()
    scores = [task.score(c, ex) for c, ex in zip(completions, examples)]  # no exception on any junk
    elapsed = time.perf_counter() - start
    print(f"\nIFEval fuzz: scored 10,000 junk completions in {elapsed:.2f} s")
    assert elapsed < 30.0  # "well under a minute"; about 4 s on the 2-core dev machine
    assert 50 < scores.count(1.0) < 9_950  # junk follows some instruction lists and fails others
    # the loose path (8 variants per instruction) on a tenth of them, consistent with the strict score
    for c, ex, s in list(zip(completions, examples, scores))[:1000]:
        d = task.details(c, ex)
        assert d["prompt_strict"] == (s == 1.0)
        assert all(lo or not st for st, lo in zip(d["strict"], d["loose"]))  # strict pass => loose pass


# ---- the fast counters and checkers equal the plain definitions --------------------------------------------------
def _plain_placeholders(text):
    count, open_ = 0, False
    for ch in text:
        if ch == "\n":
            open_ = False
        elif ch == "[":
            open_ = True
        elif ch == "]" and open_:
            count, open_ = count + 1, False
    return count


def _plain_bullets(text):
    """The reference's count, line by line: a line whose first non-blank character is "-" is a bullet; so is one
    whose first non-blank character is a "*" followed by something other than "*", and when that is the line
    break the next line is part of the same bullet (it may still be a "-" bullet, counted on its own)."""
    lines = text.split("\n")
    dashes = sum(1 for line in lines if line.lstrip().startswith("-"))
    stars, i = 0, 0
    while i < len(lines):
        s = lines[i].lstrip()
        if s.startswith("*") and len(s) > 1 and s[1] != "*":
            stars += 1
        elif s == "*" and i + 1 < len(lines):
            stars += 1
            i += 1
        i += 1
    return dashes + stars


def _plain_title(text):
    for line in text.split("\n"):
        start, end = line.find("<<"), line.rfind(">>")
        if start != -1 and end >= start + 3 and line[start:end + 2].lstrip("<").rstrip(">").strip():
            return True
    return False


def _plain_paragraphs(text, n):
    chunks = re.split(r"\s?\*\*\*\s?", text)
    count = len(chunks)
    for i, chunk in enumerate(chunks):
        if not chunk.strip():
            if i in (0, len(chunks) - 1):
                count -= 1
            else:
                return False
    return count == n


def _plain_highlights(text):
    italic = sum(1 for m in re.findall(r"\*[^\n*]*\*", text) if m.strip("*").strip())
    bold = sum(1 for m in re.findall(r"\*\*[^\n*]*\*\*", text) if m[2:-2].strip())
    return italic + bold


_LINE_PIECES = ["[", "]", "<<", ">>", "<", ">", "*", "**", "***", "-", " ", "\t", "\n", "\n\n", "\r", "\u00a0", "a",
                "Word", "x"]


def test_line_checkers_equal_their_plain_definitions():
    from esft.tasks.ifeval import checkers
    rng = random.Random(7)
    for _ in range(10_000):
        text = "".join(rng.choices(_LINE_PIECES, k=rng.randint(0, 24)))
        assert checkers.count_placeholders(text) == _plain_placeholders(text), text
        assert checkers.count_bullets(text) == _plain_bullets(text), text
        assert checkers.title(text, {}) == _plain_title(text), text
        assert checkers.count_highlights(text) == _plain_highlights(text), text
        for n in (1, 2, 3):
            assert checkers.number_paragraphs(text, {"num_paragraphs": n}) == _plain_paragraphs(text, n), text


_SENTENCE_PIECES = ["Dr.", "Mr.", "He", "he", "went", "home", ".", "!", "?", " ", "  ", "\n", "\n\n", '"', "'", ")",
                    "(", "...", ". . .", "1.", "5", "J.", "etc.", "U.S.", "A", "B.", "—", "--", "e.g.", "THE",
                    "NASA's", "CAN'T", "»", "”", "!!", "?!", ".)", '."', "\t", "-", "..", ". .", "No.", "\r",
                    "\u00a0", "𝐀𝐁", "“", "‘", "’"]


def _nltk_like_punkt(monkeypatch):
    """`punkt`'s sentence tokenizer with its three departures from NLTK switched off (NLTK's Punkt is what the
    reference counts sentences with): it leaves the inner marks of a spaced ellipsis ". . ." candidates, it
    keeps a span of sentence-ending marks only ("!" after "Wow!") as a sentence of its own, and it moves opening
    curly quotes back onto the sentence before as NLTK 3.10 does (`NLTK_RULES`). Checked against NLTK
    itself, with the same model, on random text like the one below (NLTK and its data are not installed here)."""
    import punkt
    import punkt.inference.tokenizer
    import punkt.rules.boundaries

    monkeypatch.setattr(punkt.rules.boundaries, "_multi_char_interior", lambda text, rules: frozenset())
    monkeypatch.setattr(punkt.inference.tokenizer.PunktSentenceTokenizer, "_absorb_punctuation_only",
                        lambda self, text, spans: (span for span in spans if span[0] < span[1]))
    return punkt.PunktSentenceTokenizer(punkt.load_model("english"), rules=NLTK_RULES)


@pytest.mark.parametrize("text,sentences", [
    ("What a day!!", 2),  # NLTK: "What a day!", "!"
    ("Really?!", 2),
    ("We won!!! Great game.", 2),  # a run followed by more text breaks after its last mark only
    ("He paused. . . Then he spoke.", 4),  # NLTK: "He paused.", ".", ".", "Then he spoke."
    ("He paused... Then he spoke.", 1),  # an unspaced ellipsis before a capital is no break for this model
    ("I went home. \u201c", 1),  # NLTK 3.10 moves a lone opening curly quote back onto the sentence before
    ("Go home. \u2018", 1),
])
def test_sentences_are_counted_as_nltk_counts_them(text, sentences, monkeypatch):
    assert count_sentences(text) == sentences
    assert len(_nltk_like_punkt(monkeypatch).tokenize(text)) == sentences


def test_counters_equal_punkt_and_stop_where_asked(monkeypatch):
    import punkt

    from esft.tasks.ifeval.text import _word_chunks

    tokenizer = _nltk_like_punkt(monkeypatch)
    rng = random.Random(11)
    for _ in range(5_000):
        text = "".join(rng.choices(_SENTENCE_PIECES, k=rng.randint(0, 40)))
        sentences = len(tokenizer.tokenize(text))
        capitals = sum(1 for token in punkt.word_tokenize(text) if token.isupper())
        words = len(regex.findall(r"\w+", text))
        assert count_sentences(text) == sentences, text
        assert count_capital_words(text) == capitals, text
        for stop in (0, 1, 2, 5):
            assert count_sentences(text, stop) == min(sentences, stop)
            assert count_capital_words(text, stop) == min(capitals, stop)
            assert count_words(text, stop) == min(words, stop)
        for size in (1, 3, 8):  # capital words are counted piece by piece: the pieces keep every token whole
            pieces = list(_word_chunks(text, size))
            assert "".join(pieces) == text
            assert [t for p in pieces for t in punkt.word_tokenize(p)] == punkt.word_tokenize(text), (text, size)


def test_language_detection_equals_langdetect():
    from langdetect.detector import Detector

    from esft.tasks.ifeval import text as text_module

    factory = text_module._language_factory()
    rng = random.Random(3)
    pieces = ["the", "cat", "ABC", "He", "NASA", "é", "日本語", "हिन्दी", "Привет", " ", "  ", "\n", ".", "A", "b", "ß",
              "ǅ", "ς", "ﬁ", "İ", "1", "'", "ș", "ی", "ㄅ", "가", "ア", "あ", "Ạ", "ō", "http://x.org/a", "a@b.cd"]
    for i in range(1_000):
        text = "".join(rng.choices(pieces, k=rng.randint(0, 60)))
        plain, fast = Detector(factory), text_module._Detector(factory)
        plain.append(text)
        fast.append(text)
        plain.cleaning_text()
        fast.cleaning_text()
        assert fast._extract_ngrams() == plain._extract_ngrams(), text  # same n-grams, same order
        if i % 10 == 0:
            text_module.clear_caches()
            reference = Detector(factory)
            reference.append(text)
            try:
                expected = reference.detect()
            except LangDetectException:
                expected = None
            assert detect_language(text) == expected, text


def test_aggregate_of_nothing_is_zero_and_a_bare_record_is_a_loose_fail(task):
    """No records: every rate 0 (not 1); a record with neither details nor a score passes nothing."""
    empty = task.aggregate([])
    assert empty == {"n": 0, "accuracy": 0.0, "ci95": list(wilson_interval(0, 0)), "prompt_strict": 0.0,
                     "prompt_loose": 0.0, "instruction_strict": 0.0, "instruction_loose": 0.0, "n_instructions": 0}
    bare = task.aggregate([{}, {"score": 1.0}])
    assert bare["prompt_loose"] == bare["prompt_strict"] == 0.5
