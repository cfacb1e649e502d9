"""Personal data scrubbed before anything leaves: Presidio's analyzer and anonymizer, offline.

spaCy's English models (``en_core_web_*``) are not on the package registry these machines reach, so the analyzer
runs on a *blank* spaCy English pipeline (tokenizer only, no NER), saved once under the model cache, and only
recognizers that need no NER model are registered:

================  =====================================================================  =================
entity            recognizer                                                             placeholder
================  =====================================================================  =================
EMAIL_ADDRESS     Presidio ``EmailRecognizer`` (TLD check against tldextract's bundled   ``<EMAIL_ADDRESS>``
                  suffix list, never fetched)
PHONE_NUMBER      Presidio ``PhoneRecognizer`` (Google's ``phonenumbers``)               ``<PHONE_NUMBER>``
CREDIT_CARD       Presidio ``CreditCardRecognizer`` (Luhn checksum)                      ``<CREDIT_CARD>``
IBAN_CODE         Presidio ``IbanRecognizer`` (ISO 13616 checksum)                       ``<IBAN_CODE>``
IP_ADDRESS        Presidio ``IpRecognizer`` (IPv4 and IPv6)                              ``<IP_ADDRESS>``
STREET_ADDRESS    ours: a ``PatternRecognizer`` for "<number> <Name> Street/Road/Ave..." ``<STREET_ADDRESS>``
PERSON            ours: a ``PatternRecognizer`` for capitalised names after cues ("my    ``<PERSON>``
                  name is", "call me", "I'm", "signed") plus a configurable deny-list
================  =====================================================================  =================

Person names anywhere else in the text need NER. To add it, install a spaCy English model
(``python -m spacy download en_core_web_lg``, or ``pip install`` its wheel from a mirror) and pass
``spacy_model="en_core_web_lg"``: Presidio's ``SpacyRecognizer`` then adds PERSON (and LOCATION, NRP, ...) from NER.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

__all__ = ["ENTITIES", "Scrubber", "scrub_text"]

ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS", "STREET_ADDRESS", "PERSON")

_NAME = r"[A-Z][a-z'\-]+(?: [A-Z][a-z'\-]+){0,2}"
_CUES = [
    "my name is ",
    "My name is ",
    "call me ",
    "Call me ",
    "I'm ",
    "I am ",
    "signed ",
    "Signed ",
    "Regards, ",
    "regards, ",
    "Thanks, ",
    "This is ",
]
_NOT_NAMES = {"Sorry", "Not", "Just", "Here", "Going", "Looking", "Trying", "Happy", "Glad", "The", "A", "An", "So"}
_STREET = (
    r"\b\d{1,5}[A-Za-z]?\s+(?:[A-Z][a-z]+\s+){1,3}"
    r"(?:Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Boulevard|Blvd|Drive|Dr|Way|Court|Ct|Place|Pl|Terrace|Square|Sq|"
    r"Strasse|Straße|Rue|Via|Calle)\b\.?"
)


def _blank_spacy_dir() -> Path:
    """A blank spaCy English pipeline on disk (tokenizer only), so Presidio needs no downloaded model."""
    import spacy

    from rlhf.models import cache_root

    d = cache_root() / f"spacy-blank-en-{spacy.__version__}"
    if not (d / "config.cfg").exists():
        spacy.blank("en").to_disk(d)
    return d


def _recognizers(deny_list: Iterable[str]):
    import tldextract
    from presidio_analyzer import Pattern, PatternRecognizer
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
    )

    offline_tld = tldextract.TLDExtract(suffix_list_urls=())  # the bundled snapshot; never touches the network

    class OfflineEmailRecognizer(EmailRecognizer):
        def validate_result(self, pattern_text: str):
            result = offline_tld(pattern_text)
            return result.fqdn != ""

    not_a_name = "(?!(?:" + "|".join(sorted(_NOT_NAMES)) + r")\b)"
    cue_pattern = "(?:" + "|".join(f"(?<={re.escape(c)})" for c in _CUES) + ")" + not_a_name + _NAME
    person = PatternRecognizer(
        supported_entity="PERSON",
        name="CuePersonRecognizer",
        patterns=[Pattern("name after a cue", cue_pattern, 0.6)],
        deny_list=sorted(set(deny_list)) or None,
        global_regex_flags=re.MULTILINE,  # case-sensitive: names are capitalised
    )
    street = PatternRecognizer(
        supported_entity="STREET_ADDRESS",
        name="StreetAddressRecognizer",
        patterns=[Pattern("number + street name + street type", _STREET, 0.6)],
        global_regex_flags=re.MULTILINE,
    )
    return [
        OfflineEmailRecognizer(),
        PhoneRecognizer(),
        CreditCardRecognizer(),
        IbanRecognizer(),
        IpRecognizer(),
        street,
        person,
    ]


class Scrubber:
    """Presidio analyzer + anonymizer with typed placeholders (``<EMAIL_ADDRESS>``, ``<PERSON>``, ...).

    Args:
        deny_list: extra person names to always replace (e.g. your customers' support agents).
        spacy_model: a spaCy model name or path with NER, when installed (adds NER person names); default: blank.
        score_threshold: minimum recognizer score kept (Presidio's; 0.3 keeps phone numbers, 0.4).
    """

    def __init__(self, deny_list: Iterable[str] = (), spacy_model: str | None = None, score_threshold: float = 0.3):
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import SpacyNlpEngine
        from presidio_anonymizer import AnonymizerEngine

        nlp = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": spacy_model or str(_blank_spacy_dir())}])
        nlp.load()
        registry = RecognizerRegistry(supported_languages=["en"])
        for r in _recognizers(deny_list):
            registry.add_recognizer(r)
        if spacy_model:
            from presidio_analyzer.predefined_recognizers import SpacyRecognizer

            registry.add_recognizer(SpacyRecognizer(supported_entities=["PERSON"]))
        self.analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=["en"])
        self.anonymizer = AnonymizerEngine()
        self.score_threshold = score_threshold
        self.recognizers = [r.name for r in registry.recognizers]

    def scrub(self, text: str) -> tuple[str, Counter]:
        """``(text with typed placeholders, Counter of entity types replaced)``."""
        if not text:
            return text, Counter()
        found = self.analyzer.analyze(
            text=text, language="en", entities=list(ENTITIES), score_threshold=self.score_threshold
        )
        if not found:
            return text, Counter()
        out = self.anonymizer.anonymize(text=text, analyzer_results=found)
        return out.text, Counter(item.entity_type for item in out.items)


@lru_cache(maxsize=1)
def _default() -> Scrubber:
    return Scrubber()


def scrub_text(text: str) -> tuple[str, Counter]:
    """:meth:`Scrubber.scrub` with a shared default scrubber."""
    return _default().scrub(text)
