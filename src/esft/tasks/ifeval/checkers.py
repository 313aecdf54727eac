"""The 25 IFEval instruction checkers, written from the instruction definitions of Zhou et al. (2023),
"Instruction-Following Evaluation for Large Language Models" (arXiv:2311.07911, Table 1), and from the
behaviour of the published evaluation where the paper leaves a detail open (noted per checker).

Every checker is `check(response, kwargs) -> bool`, where `kwargs` is the instruction's parameter dict
from the data (`None` values already dropped). A checker takes any text without raising; malformed
parameters (a data bug) raise KeyError, TypeError or ValueError.

Each checker is linear in the response, and those that count stop counting once the threshold decides the
comparison, so a 100,000-character response is checked in milliseconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from esft.tasks.ifeval.text import (
    count_capital_words,
    count_sentences,
    count_words,
    detect_language,
)

Kwargs = Mapping[str, Any]


def compare(value: int, relation: str, threshold: int) -> bool:
    """IFEval's two relations: "at least" N means >= N, "less than" N means < N."""
    if relation == "at least":
        return value >= int(threshold)
    if relation == "less than":
        return value < int(threshold)
    raise ValueError(f"unknown relation {relation!r}")


def compare_count(count: Callable[..., int], response: str, relation: str, threshold: Any) -> bool:
    """`compare(count(response), relation, threshold)`, counting no further than the threshold: both relations
    are decided once the count reaches it."""
    n = int(threshold)
    if relation not in RELATIONS:
        raise ValueError(f"unknown relation {relation!r}")
    return compare(count(response, stop=max(n, 0)), relation, n)


# ---- keywords ---------------------------------------------------------------------------------------
# Keywords are matched as literal text. The reference hands them to `re` as patterns; the data's keywords are
# letters and digits only, for which the two are the same.
def keywords_existence(response: str, kw: Kwargs) -> bool:
    """Include every keyword. Case-insensitive substring match (the reference does not require whole
    words, so "cats" contains "cat")."""
    return all(re.search(re.escape(k), response, re.IGNORECASE) for k in kw["keywords"])


def keywords_frequency(response: str, kw: Kwargs) -> bool:
    """The word `keyword` should appear at least / less than N times (case-insensitive substring count)."""
    count = len(re.findall(re.escape(kw["keyword"]), response, re.IGNORECASE))
    return compare(count, kw["relation"], kw["frequency"])


def keywords_forbidden_words(response: str, kw: Kwargs) -> bool:
    """Do not include the forbidden words: whole-word, case-insensitive (so "rock" forbids "Rock" but not
    "rocket")."""
    return not any(
        re.search(r"\b" + re.escape(w) + r"\b", response, re.IGNORECASE) for w in kw["forbidden_words"]
    )


def keywords_letter_frequency(response: str, kw: Kwargs) -> bool:
    """The letter should appear at least / less than N times, counted case-insensitively.

    Two prompts ask for a non-letter ("#" four times, "!" six times); we count that character as asked.
    (The published checker replaces any non-ASCII-letter by a randomly drawn letter, which makes those two
    instructions random; we deliberately do not reproduce that.)"""
    count = response.lower().count(str(kw["letter"]).lower())
    return compare(count, kw["let_relation"], kw["let_frequency"])


# ---- language ---------------------------------------------------------------------------------------
def response_language(response: str, kw: Kwargs) -> bool:
    """The whole response should be in the given language (ISO 639-1). Text with nothing to detect
    (digits, symbols) passes, as in the reference evaluation."""
    language = detect_language(response)
    return language is None or language == kw["language"]


# ---- length constraints -----------------------------------------------------------------------------
def number_sentences(response: str, kw: Kwargs) -> bool:
    return compare_count(count_sentences, response, kw["relation"], kw["num_sentences"])


def number_words(response: str, kw: Kwargs) -> bool:
    return compare_count(count_words, response, kw["relation"], kw["num_words"])


_MARKDOWN_DIVIDER = re.compile(r"\s?\*\*\*\s?")


def number_paragraphs(response: str, kw: Kwargs) -> bool:
    """Exactly N paragraphs separated by the markdown divider `***`. An empty chunk before the first or
    after the last divider is tolerated (a leading/trailing divider); an empty chunk between two dividers
    means an empty paragraph and fails."""
    expected = int(kw["num_paragraphs"])
    chunks = _MARKDOWN_DIVIDER.split(response)
    if not all(map(str.strip, chunks[1:-1])):
        return False
    count = len(chunks) - (not chunks[0].strip()) - (len(chunks) > 1 and not chunks[-1].strip())
    return count == expected


# Punctuation that ends the "first word" of a paragraph, as in the reference ("Weekend," -> "weekend").
_FIRST_WORD_STOP = re.compile(r"[.,?!'\"]")


def first_word(paragraph: str) -> str:
    tokens = paragraph.split()
    if not tokens:
        return ""
    word = tokens[0].lstrip("'").lstrip('"')
    return _FIRST_WORD_STOP.split(word, maxsplit=1)[0].lower()


def nth_paragraph_first_word(response: str, kw: Kwargs) -> bool:
    """Exactly `num_paragraphs` paragraphs separated by blank lines ("\\n\\n"), and paragraph number
    `nth_paragraph` (1-based) starts with `first_word` (case-insensitive, leading quotes and trailing
    punctuation ignored).

    As in the reference, paragraphs are counted among the non-empty chunks of the "\\n\\n" split but indexed in
    the raw split: when extra blank lines leave an empty chunk before paragraph n (four line breaks in a row, or
    a response that starts with a blank line), the chunk looked at is that empty one, and the check fails."""
    chunks = response.split("\n\n")
    n, nth = int(kw["num_paragraphs"]), int(kw["nth_paragraph"])
    count = sum(1 for chunk in chunks if chunk.strip())
    if count != n or not 1 <= nth <= count or not chunks[nth - 1].strip():
        return False
    return first_word(chunks[nth - 1]) == str(kw["first_word"]).lower()


# ---- detectable content -----------------------------------------------------------------------------
# A "]" closes a placeholder when the last "[", "]" or line break before it is a "[". Excluding "[" from the
# content keeps the scan linear (`\[.*?\]` is quadratic on a line full of "[" with no "]").
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]*\]")


def count_placeholders(text: str) -> int:
    """Square-bracket placeholders like [address]: an opening "[" closed by the next "]" on the same line."""
    return len(_PLACEHOLDER.findall(text))


def number_placeholders(response: str, kw: Kwargs) -> bool:
    """At least N placeholders in square brackets."""
    return count_placeholders(response) >= int(kw["num_placeholders"])


def postscript_pattern(marker: str) -> re.Pattern[str]:
    """ "P.S." -> `p\\.\\s?s\\.`: the marker's letters in lower case, one optional space after each inner period
    (so "P. S." and "p.s." count once the text is in lower case); a trailing period is required only if the
    marker has one. Match it against `text.lower()`."""
    parts = [re.escape(p) for p in marker.strip().lower().split(".")]
    # "P.S." splits to ["p", "s", ""]: the empty last part stands for the trailing period.
    if len(parts) > 1 and parts[-1] == "":
        return re.compile(r"\.\s?".join(parts[:-1]) + r"\.")
    return re.compile(r"\.\s?".join(parts))


def postscript(response: str, kw: Kwargs) -> bool:
    """The response contains a postscript starting with the marker ("P.S." or "P.P.S"). Like the
    reference, the marker is looked for anywhere, not only in the last paragraph, and case is ignored by
    lower-casing the text (a case-insensitive match would also take the long s "ſ" for an "s")."""
    return postscript_pattern(str(kw["postscript_marker"])).search(response.lower()) is not None


# ---- detectable format ------------------------------------------------------------------------------
# Bullets are counted as the reference counts them: each "*" bullet and each "-" bullet is a line whose first
# non-blank character is the mark. A "*" must be followed by some character other than "*" ("**bold**" is no
# bullet, nor is a lone "*" at the very end); when that character is the line break, the next line belongs to the
# same bullet and cannot be one itself. The two marks are counted separately, so a "-" line taken in that way
# still counts as a "-" bullet.
_STAR_BULLET = re.compile(r"^[^\S\n]*\*(?:[^*\n]|\n[^\n]*)", re.MULTILINE)
_DASH_BULLET = re.compile(r"^[^\S\n]*-", re.MULTILINE)


def count_bullets(text: str) -> int:
    """Markdown bullet lines ("* item" or "- item"); lines are split at "\\n" only, as `str.split("\\n")` would."""
    return sum(1 for _ in _STAR_BULLET.finditer(text)) + sum(1 for _ in _DASH_BULLET.finditer(text))


def number_bullet_lists(response: str, kw: Kwargs) -> bool:
    """Exactly N markdown bullet points."""
    return count_bullets(response) == int(kw["num_bullets"])


CONSTRAINED_ANSWERS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def constrained_response(response: str, kw: Kwargs) -> bool:
    """Answer with one of the fixed options; the reference accepts the option anywhere in the text."""
    return any(option in response for option in CONSTRAINED_ANSWERS)


_ITALIC = re.compile(r"\*([^\n*]*)\*")
_BOLD = re.compile(r"\*\*([^\n*]*)\*\*")


def count_highlights(text: str) -> int:
    """Markdown highlights *like this* or **like this** with some non-blank text inside. The two scans
    are counted together as in the reference; "**x**" is found only by the bold scan (the italic scan
    sees two empty "**" pairs)."""
    def filled(pattern: re.Pattern[str]) -> int:
        return sum(1 for _ in filter(None, map(str.strip, pattern.findall(text))))

    return filled(_ITALIC) + filled(_BOLD)


def number_highlighted_sections(response: str, kw: Kwargs) -> bool:
    """At least N highlighted sections."""
    return count_highlights(response) >= int(kw["num_highlights"])


def multiple_sections(response: str, kw: Kwargs) -> bool:
    """At least N sections, each starting with the (case-sensitive) splitter and a number, e.g.
    "SECTION 1". The data spells the parameter `section_spliter`."""
    splitter = re.compile(r"\s?" + re.escape(str(kw["section_spliter"])) + r"\s?\d+\s?")
    return len(splitter.split(response)) - 1 >= int(kw["num_sections"])


# Opening fences removed, each at most once and in this order, as in the reference: "```json" in three spellings
# only (a "```jSoN" fence leaves "jSoN" in front of the JSON), then a bare "```" (which also takes the second
# of a doubled fence).
_FENCE_OPENINGS = ("```json", "```Json", "```JSON", "```")


def json_format(response: str, kw: Kwargs) -> bool:
    """The entire output is JSON; an enclosing ``` or ```json code fence is allowed."""
    text = response.strip()
    for fence in _FENCE_OPENINGS:
        text = text.removeprefix(fence)
    try:
        json.loads(text.removesuffix("```").strip())
    except (ValueError, RecursionError):  # the reference crashes on JSON nested too deep; that is no JSON here
        return False
    return True


# A title: on one line, from the first "<<" to the last ">>", something is left once the "<" after the first and
# the ">" before the last are stripped. That holds when, after the first "<<" and the "<" that follow it, the line
# has a non-blank character, and from there a character other than ">" is followed by a ">>". The atomic groups
# commit to the first such positions (a later one would only do worse), which keeps the scan linear.
_TITLE = re.compile(r"^(?>[^\n]*?<<)<*+[^\S\n]*+(?=\S)(?>[^\n]*?[^>\n])[^\n]*>>", re.MULTILINE)


def title(response: str, kw: Kwargs) -> bool:
    """A title in double angular brackets, <<like this>>, on one line and not blank: like the reference's
    greedy `<<[^\\n]+>>`, from the first "<<" to the last ">>" of a line."""
    return _TITLE.search(response) is not None


# ---- combination ------------------------------------------------------------------------------------
def two_responses(response: str, kw: Kwargs) -> bool:
    """Two different responses separated by six asterisks "******". Empty text before the first or after
    the last separator is tolerated; an empty response in between fails."""
    chunks = response.split("******")
    answers = []
    for i, chunk in enumerate(chunks):
        if not chunk.strip():
            if i not in (0, len(chunks) - 1):
                return False
        else:
            answers.append(chunk.strip())
    return len(answers) == 2 and answers[0] != answers[1]


def repeat_prompt(response: str, kw: Kwargs) -> bool:
    """First repeat the request word for word (case-insensitive), then answer."""
    return response.strip().lower().startswith(str(kw["prompt_to_repeat"]).strip().lower())


# ---- start / end ------------------------------------------------------------------------------------
def end_checker(response: str, kw: Kwargs) -> bool:
    """End with the exact phrase, nothing after it (case-insensitive; an enclosing quote is ignored)."""
    return response.strip().strip('"').lower().endswith(str(kw["end_phrase"]).strip().lower())


def quotation(response: str, kw: Kwargs) -> bool:
    """Wrap the entire response in double quotation marks."""
    text = response.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


# ---- change case ------------------------------------------------------------------------------------
def capital_word_frequency(response: str, kw: Kwargs) -> bool:
    """Words in all capital letters should appear at least / less than N times."""
    return compare_count(count_capital_words, response, kw["capital_relation"], kw["capital_frequency"])


def _is_english_or_unknown(response: str) -> bool:
    return detect_language(response) in ("en", None)


def english_capital(response: str, kw: Kwargs) -> bool:
    """The entire response in English and in capital letters."""
    return response.isupper() and _is_english_or_unknown(response)


def english_lowercase(response: str, kw: Kwargs) -> bool:
    """The entire response in English and in lowercase letters."""
    return response.islower() and _is_english_or_unknown(response)


# ---- punctuation ------------------------------------------------------------------------------------
def no_comma(response: str, kw: Kwargs) -> bool:
    """No commas at all (the ASCII comma, as in the reference)."""
    return "," not in response


# ---- registry ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    id: str
    check: Callable[[str, Kwargs], bool]
    #: parameters the checker reads; every example must provide them (checked by `missing_params`)
    params: tuple[str, ...] = ()


INSTRUCTIONS: dict[str, Instruction] = {
    ins.id: ins
    for ins in (
        Instruction("keywords:existence", keywords_existence, ("keywords",)),
        Instruction("keywords:frequency", keywords_frequency, ("keyword", "frequency", "relation")),
        Instruction("keywords:forbidden_words", keywords_forbidden_words, ("forbidden_words",)),
        Instruction("keywords:letter_frequency", keywords_letter_frequency,
                    ("letter", "let_frequency", "let_relation")),
        Instruction("language:response_language", response_language, ("language",)),
        Instruction("length_constraints:number_sentences", number_sentences, ("num_sentences", "relation")),
        Instruction("length_constraints:number_paragraphs", number_paragraphs, ("num_paragraphs",)),
        Instruction("length_constraints:number_words", number_words, ("num_words", "relation")),
        Instruction("length_constraints:nth_paragraph_first_word", nth_paragraph_first_word,
                    ("num_paragraphs", "nth_paragraph", "first_word")),
        Instruction("detectable_content:number_placeholders", number_placeholders, ("num_placeholders",)),
        Instruction("detectable_content:postscript", postscript, ("postscript_marker",)),
        Instruction("detectable_format:number_bullet_lists", number_bullet_lists, ("num_bullets",)),
        Instruction("detectable_format:constrained_response", constrained_response),
        Instruction("detectable_format:number_highlighted_sections", number_highlighted_sections,
                    ("num_highlights",)),
        Instruction("detectable_format:multiple_sections", multiple_sections,
                    ("section_spliter", "num_sections")),
        Instruction("detectable_format:json_format", json_format),
        Instruction("detectable_format:title", title),
        Instruction("combination:two_responses", two_responses),
        Instruction("combination:repeat_prompt", repeat_prompt, ("prompt_to_repeat",)),
        Instruction("startend:end_checker", end_checker, ("end_phrase",)),
        Instruction("startend:quotation", quotation),
        Instruction("change_case:capital_word_frequency", capital_word_frequency,
                    ("capital_frequency", "capital_relation")),
        Instruction("change_case:english_capital", english_capital),
        Instruction("change_case:english_lowercase", english_lowercase),
        Instruction("punctuation:no_comma", no_comma),
    )
}


RELATIONS = ("at least", "less than")
_RELATION_PARAMS = frozenset({"relation", "let_relation", "capital_relation"})
_COUNT_PARAMS = frozenset({"frequency", "let_frequency", "capital_frequency", "num_sentences", "num_paragraphs",
                           "num_words", "nth_paragraph", "num_placeholders", "num_bullets", "num_highlights",
                           "num_sections"})


def check_params(instruction_id: str, params: Kwargs) -> None:
    """Raise ValueError (or TypeError) when a relation or a count the instruction reads is not one: a data bug
    caught before any response is looked at."""
    for name in INSTRUCTIONS[instruction_id].params:
        value = params[name]
        if name in _RELATION_PARAMS and value not in RELATIONS:
            raise ValueError(f"unknown relation {value!r} in {instruction_id!r}")
        if name in _COUNT_PARAMS:
            if isinstance(value, bool):
                raise TypeError(f"{name} of {instruction_id!r} must be a count, got {value!r}")
            int(value)


def missing_params(instruction_id: str, kwargs: Kwargs | None) -> list[str]:
    """Names of the parameters an instruction needs but `kwargs` lacks (unknown id -> ["<unknown id>"])."""
    ins = INSTRUCTIONS.get(instruction_id)
    if ins is None:
        return ["<unknown id>"]
    given = {k for k, v in (kwargs or {}).items() if v is not None}
    return [p for p in ins.params if p not in given]
