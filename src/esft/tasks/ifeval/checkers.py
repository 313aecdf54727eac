"""The 25 IFEval instruction checkers, written from the instruction definitions of Zhou et al. (2023),
"Instruction-Following Evaluation for Large Language Models" (arXiv:2311.07911, Table 1), and from the
behaviour of the published evaluation where the paper leaves a detail open (noted per checker).

Every checker is `check(response, kwargs) -> bool`, where `kwargs` is the instruction's parameter dict
from the data (`None` values already dropped). Checkers may raise on malformed parameters; the caller
(`evaluate.py`) turns any exception into a failed instruction.
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
    nonempty_paragraphs,
)

Kwargs = Mapping[str, Any]


def compare(value: int, relation: str, threshold: int) -> bool:
    """IFEval's two relations: "at least" N means >= N, "less than" N means < N."""
    if relation == "at least":
        return value >= int(threshold)
    if relation == "less than":
        return value < int(threshold)
    raise ValueError(f"unknown relation {relation!r}")


# ---- keywords ---------------------------------------------------------------------------------------
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
    return compare(count_sentences(response), kw["relation"], kw["num_sentences"])


def number_words(response: str, kw: Kwargs) -> bool:
    return compare(count_words(response), kw["relation"], kw["num_words"])


_MARKDOWN_DIVIDER = re.compile(r"\s?\*\*\*\s?")


def number_paragraphs(response: str, kw: Kwargs) -> bool:
    """Exactly N paragraphs separated by the markdown divider `***`. An empty chunk before the first or
    after the last divider is tolerated (a leading/trailing divider); an empty chunk between two dividers
    means an empty paragraph and fails."""
    chunks = _MARKDOWN_DIVIDER.split(response)
    count = len(chunks)
    for i, chunk in enumerate(chunks):
        if not chunk.strip():
            if i in (0, len(chunks) - 1):
                count -= 1
            else:
                return False
    return count == int(kw["num_paragraphs"])


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
    punctuation ignored). Paragraphs are counted and indexed among the non-empty ones, so extra blank
    lines between paragraphs do not shift the index (the reference indexes the raw split and can pick an
    empty chunk)."""
    paragraphs = nonempty_paragraphs(response)
    n, nth = int(kw["num_paragraphs"]), int(kw["nth_paragraph"])
    if len(paragraphs) != n or not 1 <= nth <= n:
        return False
    return first_word(paragraphs[nth - 1]) == str(kw["first_word"]).lower()


# ---- detectable content -----------------------------------------------------------------------------
def count_placeholders(text: str) -> int:
    """Square-bracket placeholders like [address]: an opening "[" closed by the next "]" on the same line.

    A linear scan rather than a lazy regex (`\\[.*?\\]` is quadratic on a line full of "[" with no "]").
    """
    count, open_ = 0, False
    for ch in text:
        if ch == "\n":
            open_ = False
        elif ch == "[":
            open_ = True
        elif ch == "]" and open_:
            count, open_ = count + 1, False
    return count


def number_placeholders(response: str, kw: Kwargs) -> bool:
    """At least N placeholders in square brackets."""
    return count_placeholders(response) >= int(kw["num_placeholders"])


def postscript_pattern(marker: str) -> re.Pattern[str]:
    """ "P.S." -> `p\\.\\s?s\\.`: the marker's letters, case-insensitive, one optional space after each
    inner period (so "P. S." and "p.s." count); a trailing period is required only if the marker has one."""
    parts = [re.escape(p) for p in marker.strip().split(".")]
    # "P.S." splits to ["P", "S", ""]: the empty last part stands for the trailing period.
    if len(parts) > 1 and parts[-1] == "":
        return re.compile(r"\.\s?".join(parts[:-1]) + r"\.", re.IGNORECASE)
    return re.compile(r"\.\s?".join(parts), re.IGNORECASE)


def postscript(response: str, kw: Kwargs) -> bool:
    """The response contains a postscript starting with the marker ("P.S." or "P.P.S"). Like the
    reference, the marker is looked for anywhere, not only in the last paragraph."""
    return postscript_pattern(str(kw["postscript_marker"])).search(response) is not None


# ---- detectable format ------------------------------------------------------------------------------
def count_bullets(text: str) -> int:
    """Markdown bullet lines: first non-blank character "-" or a single "*" (a "**bold**" line is not a
    bullet)."""
    count = 0
    for line in text.split("\n"):
        s = line.lstrip()
        if s.startswith("-") or (s.startswith("*") and not s.startswith("**")):
            count += 1
    return count


def number_bullet_lists(response: str, kw: Kwargs) -> bool:
    """Exactly N markdown bullet points."""
    return count_bullets(response) == int(kw["num_bullets"])


CONSTRAINED_ANSWERS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def constrained_response(response: str, kw: Kwargs) -> bool:
    """Answer with one of the fixed options; the reference accepts the option anywhere in the text."""
    return any(option in response for option in CONSTRAINED_ANSWERS)


_ITALIC = re.compile(r"\*[^\n*]*\*")
_BOLD = re.compile(r"\*\*[^\n*]*\*\*")


def count_highlights(text: str) -> int:
    """Markdown highlights *like this* or **like this** with some non-blank text inside. The two scans
    are counted together as in the reference; "**x**" is found only by the bold scan (the italic scan
    sees two empty "**" pairs)."""
    italic = sum(1 for m in _ITALIC.findall(text) if m.strip("*").strip())
    bold = sum(1 for m in _BOLD.findall(text) if m[2:-2].strip())
    return italic + bold


def number_highlighted_sections(response: str, kw: Kwargs) -> bool:
    """At least N highlighted sections."""
    return count_highlights(response) >= int(kw["num_highlights"])


def multiple_sections(response: str, kw: Kwargs) -> bool:
    """At least N sections, each starting with the (case-sensitive) splitter and a number, e.g.
    "SECTION 1". The data spells the parameter `section_spliter`."""
    splitter = re.compile(r"\s?" + re.escape(str(kw["section_spliter"])) + r"\s?\d+\s?")
    return len(splitter.split(response)) - 1 >= int(kw["num_sections"])


_CODE_FENCE_OPEN = re.compile(r"^```(?:json)?", re.IGNORECASE)


def json_format(response: str, kw: Kwargs) -> bool:
    """The entire output is JSON; an enclosing ``` or ```json code fence is allowed."""
    text = _CODE_FENCE_OPEN.sub("", response.strip(), count=1)
    if text.endswith("```"):
        text = text[:-3]
    try:
        json.loads(text.strip())
    except (ValueError, RecursionError):
        return False
    return True


def title(response: str, kw: Kwargs) -> bool:
    """A title in double angular brackets, <<like this>>, on one line and not blank."""
    for line in response.split("\n"):
        start, end = line.find("<<"), line.rfind(">>")
        # Like a greedy `<<[^\n]+>>`: from the first "<<" to the last ">>" of the line, >= 1 char between.
        if start != -1 and end >= start + 3:
            if line[start:end + 2].lstrip("<").rstrip(">").strip():
                return True
    return False


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
    return compare(count_capital_words(response), kw["capital_relation"], kw["capital_frequency"])


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


def missing_params(instruction_id: str, kwargs: Kwargs | None) -> list[str]:
    """Names of the parameters an instruction needs but `kwargs` lacks (unknown id -> ["<unknown id>"])."""
    ins = INSTRUCTIONS.get(instruction_id)
    if ins is None:
        return ["<unknown id>"]
    given = {k for k, v in (kwargs or {}).items() if v is not None}
    return [p for p in ins.params if p not in given]
