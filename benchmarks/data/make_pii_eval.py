"""Writes ``pii_eval.jsonl``: the labelled set ``benchmarks/pii_scrub.py`` measures the flywheel's scrub on.

Every value is synthetic: identifiers are drawn at random in their format until ``python-stdnum`` (or
``phonenumbers``) accepts them, so checksummed formats carry valid check digits, and names come from small pools of
common names in several scripts. Rows: ``{"id", "lang", "kind": "pii"|"clean", "split": "tune"|"heldout", "text",
"spans": [{"start", "end", "class", "value"}]}`` ("heldout": templates written after the recognizers were tuned on
the "tune" ones); a span's ``class`` is a :data:`flywheel.scrub.CLASSES` key; clean rows have no span (code,
math, version numbers, dates in prose, ISBNs, product names, numbers of every kind). Deterministic (seed 19):

    python benchmarks/data/make_pii_eval.py   # rewrites benchmarks/data/pii_eval.jsonl
"""

from __future__ import annotations

import importlib
import json
import random
import string
from pathlib import Path

import phonenumbers

OUT = Path(__file__).with_name("pii_eval.jsonl")
R = random.Random(19)


def _valid(module: str, make) -> str:
    mod = importlib.import_module(f"stdnum.{module}")
    while True:
        v = make()
        if mod.is_valid(v):
            return v


def digits(n: int, first: str = "123456789") -> str:
    return R.choice(first) + "".join(R.choice(string.digits) for _ in range(n - 1))


def upper(n: int) -> str:
    return "".join(R.choice(string.ascii_uppercase) for _ in range(n))


def alnum(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


def luhn_complete(prefix: str, length: int) -> str:
    from stdnum import luhn

    body = prefix + "".join(R.choice(string.digits) for _ in range(length - len(prefix) - 1))
    return body + luhn.calc_check_digit(body)


# --- value generators: class -> function returning a string ---------------------------------------------------------
def ssn():
    a, b, c = R.randint(101, 665), R.randint(10, 99), R.randint(1000, 9999)
    return R.choice([f"{a}-{b}-{c}", f"{a} {b} {c}", f"{a}.{b}.{c}"])


def nino():
    v = R.choice("ABCEGHJKLMNPRSTWXYZ") + R.choice("ABCEGHJKLMNPRSTWXYZ") + digits(6, string.digits) + R.choice("ABCD")
    return R.choice([v, f"{v[:2]} {v[2:4]} {v[4:6]} {v[6:8]} {v[8]}"])


def nhs():
    v = _valid("gb.nhs", lambda: digits(10, "4"))
    return R.choice([v, f"{v[:3]} {v[3:6]} {v[6:]}"])


def dni():
    v = _valid("es.dni", lambda: digits(8, string.digits) + R.choice(string.ascii_uppercase))
    return R.choice([v, f"{v[:8]}-{v[8]}", f"{v[:2]}.{v[2:5]}.{v[5:8]}-{v[8]}"])


def nie():
    return _valid("es.nie", lambda: R.choice("XYZ") + digits(7, string.digits) + R.choice(string.ascii_uppercase))


def bsn():
    v = _valid("nl.bsn", lambda: digits(9))
    return R.choice([v, f"{v[:4]}.{v[4:6]}.{v[6:]}"])


def de_taxid():
    return _valid("de.idnr", lambda: digits(11))


def nir():
    def make():
        body = R.choice("12") + f"{R.randint(40, 99):02d}{R.randint(1, 12):02d}{R.randint(1, 95):02d}" + digits(6, string.digits)
        key = 97 - int(body) % 97
        return body + f"{key:02d}"

    v = _valid("fr.nir", make)
    return R.choice([v, f"{v[0]} {v[1:3]} {v[3:5]} {v[5:7]} {v[7:10]} {v[10:13]} {v[13:]}"])


def codice_fiscale():
    import stdnum.it.codicefiscale as cf

    body = upper(6) + f"{R.randint(40, 99):02d}" + R.choice("ABCDEHLMPRST") + f"{R.randint(1, 71):02d}" + R.choice("FHLAG") + digits(3, string.digits)
    return body + cf.calc_check_digit(body)


def aadhaar():
    import stdnum.verhoeff as vh

    body = digits(11, "23456789")
    v = body + vh.calc_check_digit(body)
    return R.choice([v, f"{v[:4]} {v[4:8]} {v[8:]}", f"{v[:4]}-{v[4:8]}-{v[8:]}"])


def pan():
    return upper(3) + R.choice("PCHFATBLJG") + upper(1) + digits(4, string.digits) + upper(1)


def cn_ric():
    from stdnum.cn import ric

    area = R.choice(["110101", "310104", "440305", "510107", "330106", "420102"])
    body = area + f"{R.randint(1950, 2005)}{R.randint(1, 12):02d}{R.randint(1, 28):02d}" + digits(3, string.digits)
    v = body + ric.calc_check_digit(body + "0")
    assert ric.calc_check_digit(v) == v[-1], v  # real district codes; stdnum's place list lacks some of them
    return v


def my_number():
    import stdnum.jp.in_ as jp

    body = digits(11)
    v = body + jp.calc_check_digit(body + "0")
    return R.choice([v, f"{v[:4]} {v[4:8]} {v[8:]}", f"{v[:4]}-{v[4:8]}-{v[8:]}"])


def kr_rrn():
    # Korean RRN: YYMMDD-GNNNNNC, check digit by weights 2..9,2..5 (mod 11)
    while True:
        body = f"{R.randint(50, 99):02d}{R.randint(1, 12):02d}{R.randint(1, 28):02d}" + R.choice("12") + digits(5, string.digits)
        w = [2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5]
        c = (11 - sum(int(d) * x for d, x in zip(body, w)) % 11) % 10
        return f"{body[:6]}-{body[6:]}{c}"


def passport():
    return R.choice([upper(1) + digits(8, string.digits), upper(2) + digits(7, string.digits), digits(9),
                     "C" + alnum(8, "CFGHJKLMNPRTVWXYZ0123456789"), upper(1) + digits(7, string.digits)])


def driver_license():
    return R.choice([upper(1) + digits(7, string.digits), upper(1) + digits(12, string.digits),
                     f"{upper(1)}{digits(3, string.digits)}-{digits(4, string.digits)}-{digits(4, string.digits)}",
                     digits(9), upper(2) + digits(6, string.digits) + upper(1)])


def uk_licence():
    return f"{upper(5)}{R.randint(0, 9)}{R.randint(1, 12):02d}{R.randint(1, 28):02d}{R.randint(0, 9)}{upper(2)}{R.randint(0, 9)}{upper(2)}"


def mrn():
    return R.choice([digits(7), f"MRN-{digits(6)}", f"{upper(2)}{digits(6, string.digits)}", f"{digits(3)}-{digits(2, string.digits)}-{digits(3, string.digits)}", f"H{digits(8, string.digits)}"])


def card():
    num = R.choice([luhn_complete("4", 16), luhn_complete("5" + R.choice("12345"), 16), luhn_complete("3" + R.choice("47"), 15)])
    if len(num) == 16:
        return R.choice([num, " ".join(num[i : i + 4] for i in range(0, 16, 4)), "-".join(num[i : i + 4] for i in range(0, 16, 4))])
    return R.choice([num, f"{num[:4]} {num[4:10]} {num[10:]}"])


def iban():

    def make():
        cc, bban = R.choice([("DE", lambda: digits(18, string.digits)), ("GB", lambda: upper(4) + digits(14, string.digits)),
                              ("ES", lambda: digits(20, string.digits)), ("FR", lambda: digits(23, string.digits)),
                              ("NL", lambda: upper(4) + digits(10, string.digits)), ("IT", lambda: upper(1) + digits(22, string.digits))])
        b = bban()
        check = 98 - int("".join(str(int(ch, 36)) for ch in b + cc + "00")) % 97
        return f"{cc}{check:02d}{b}"

    v = _valid("iban", make)
    return R.choice([v, " ".join(v[i : i + 4] for i in range(0, len(v), 4))])


def bank_account():
    return R.choice([digits(8, string.digits), digits(10), digits(12), f"{digits(4)}-{digits(6, string.digits)}", digits(9)])


def sort_code():
    return f"{R.randint(10, 99)}-{R.randint(10, 99)}-{R.randint(10, 99)}"


PHONE_REGIONS = ["US", "GB", "DE", "FR", "ES", "IT", "NL", "IN", "CN", "JP", "KR", "TW", "HK"]


def phone(region=None):
    region = region or R.choice(PHONE_REGIONS)
    ex = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE)
    nat = str(ex.national_number)
    while True:
        cand = nat[:3] + "".join(R.choice(string.digits) for _ in range(len(nat) - 3))
        p = phonenumbers.parse(cand, region)
        if phonenumbers.is_valid_number(p):
            break
    fmt = R.choice([phonenumbers.PhoneNumberFormat.INTERNATIONAL, phonenumbers.PhoneNumberFormat.NATIONAL,
                    phonenumbers.PhoneNumberFormat.E164])
    return phonenumbers.format_number(p, fmt)


def email():
    user = R.choice(["anna.k", "j.smith", "mgarcia", "li.wei", "tanaka.h", "olga_p", "priya.r", "dev.ops.lead", "m.rossi", "jdv"])
    return f"{user}{R.randint(1, 99)}@{R.choice(['gmail.com', 'outlook.de', 'yahoo.co.jp', 'example.org', 'proton.me', 'qq.com', 'web.de', 'libero.it'])}"


def ip():
    return R.choice([f"{R.randint(11, 223)}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
                     f"2001:db8:{R.randint(0, 65535):x}:{R.randint(0, 65535):x}::{R.randint(1, 255):x}"])


def dob():
    y, m, d = R.randint(1940, 2006), R.randint(1, 12), R.randint(1, 28)
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
    return R.choice([f"{d:02d}/{m:02d}/{y}", f"{y}-{m:02d}-{d:02d}", f"{months[m - 1]} {d}, {y}", f"{d} {months[m - 1]} {y}",
                     f"{d:02d}.{m:02d}.{y}"])


def api_key():
    return R.choice([
        "sk-proj-" + alnum(40), "sk-ant-api03-" + alnum(60, string.ascii_letters + string.digits + "-_"),
        "AKIA" + alnum(16, string.ascii_uppercase + string.digits), "ghp_" + alnum(36), "github_pat_" + alnum(50, string.ascii_letters + string.digits + "_"),
        "glpat-" + alnum(20), "xoxb-" + digits(11) + "-" + digits(12) + "-" + alnum(24), "sk_live_" + alnum(24),
        "AIza" + alnum(35, string.ascii_letters + string.digits + "-_"), "hf_" + alnum(34), "SG." + alnum(22) + "." + alnum(43),
        "npm_" + alnum(36), "SK" + alnum(32, "0123456789abcdef"), "dapi" + alnum(32, "0123456789abcdef"),
    ])


def jwt():
    import base64

    def b64(s):
        return base64.urlsafe_b64encode(s.encode()).decode().rstrip("=")

    return b64('{"alg":"HS256","typ":"JWT"}') + "." + b64(json.dumps({"sub": digits(8), "exp": R.randint(1700000000, 1900000000)})) + "." + alnum(43, string.ascii_letters + string.digits + "-_")


def bearer_value():
    return alnum(R.randint(28, 48), string.ascii_letters + string.digits + "-._") + R.choice(string.digits)


def private_key():
    lines = [alnum(64, string.ascii_letters + string.digits + "+/") for _ in range(R.randint(3, 6))]
    kind = R.choice(["RSA PRIVATE KEY", "PRIVATE KEY", "OPENSSH PRIVATE KEY", "EC PRIVATE KEY"])
    return f"-----BEGIN {kind}-----\n" + "\n".join(lines) + f"\n-----END {kind}-----"


def password():
    return R.choice(["hunter2!", "Tr0ub4dor&3", "S3cure#2024", "p@ssw0rd99", "Winter2023!", "qwerty123!", "Ma$ter_Key7",
                     "correcthorse42", "Zx9!kLm2", "Bella2019", "Sunflower#8", "Gr33nTea!"])


POST_UK = ["SW1A 1AA", "EC1A 1BB", "M1 1AE", "B33 8TH", "CR2 6XH", "DN55 1PT", "EH1 2NG", "LS1 4AP"]


def uk_postcode():
    return R.choice(POST_UK)


# name pools
LATIN_FIRST = ["Anna", "James", "María", "José", "Lukas", "Sophie", "Giulia", "Marco", "Emma", "Noah", "Fatima", "Olga",
               "Priya", "Arjun", "Chen", "Aiko", "Sven", "Ingrid", "Pierre", "Chloé", "Mateo", "Lucía", "Daan", "Femke",
               "Oliver", "Amelia", "Kwame", "Amara", "Dmitri", "Zofia", "Henrik", "Aisha", "Ravi", "Elena", "Tomás"]
LATIN_LAST = ["Müller", "Smith", "García", "Rossi", "Dubois", "van der Berg", "Kowalski", "Johansson", "Okafor", "Patel",
              "Nguyen", "Fernández", "Schmidt", "Bianchi", "Martin", "de Vries", "Novak", "Andersen", "Mensah", "Sharma",
              "O'Brien", "Hernández", "Ivanova", "Yilmaz", "Costa", "Jansen", "Wright", "Moreau", "Esposito"]
ZH = ["王小明", "李娜", "张伟", "陈静", "刘洋", "杨丽华", "赵磊", "黄晓燕"]
JA = ["田中太郎", "佐藤花子", "鈴木一郎", "高橋美咲", "伊藤健", "渡辺さくら"]
JA_FAMILY = ["田中", "佐藤", "鈴木", "高橋", "山本", "中村"]
KO = ["김민준", "이서연", "박지훈", "최유진", "정하늘"]
RU = ["Иван Петров", "Анна Смирнова", "Дмитрий Соколов", "Мария Иванова"]
HI = ["राहुल शर्मा", "प्रिया पटेल", "अमित कुमार"]
AR = ["أحمد علي", "فاطمة حسن", "محمد خالد"]
EL = ["Γιώργος Παπαδόπουλος", "Ελένη Νικολάου"]


def latin_name(parts=2):
    return R.choice(LATIN_FIRST) if parts == 1 else f"{R.choice(LATIN_FIRST)} {R.choice(LATIN_LAST)}"


def ner_name():
    # names without a cue: English-style full names the NER model is asked to find
    return f"{R.choice(['Sarah', 'David', 'Michael', 'Jennifer', 'Robert', 'Linda', 'Thomas', 'Emily', 'Daniel', 'Rachel', 'Kevin', 'Laura', 'Brian', 'Megan', 'Jason', 'Nicole', 'Andrew', 'Hannah', 'Steven', 'Olivia'])} {R.choice(['Thompson', 'Okafor', 'Chen', 'Martinez', 'Whitfield', 'Kowalski', 'Anderson', 'Brennan', 'Gallagher', 'Nakamura', 'Fischer', 'Robinson', 'Sullivan', 'Patel', 'Harrison', 'Lindqvist', 'Morales', 'Campbell'])}"


# --- templates: (lang, text with {CLASS:gen} fields) ----------------------------------------------------------------
G = {
    "ssn": ssn, "nino": nino, "nhs": nhs, "dni": dni, "nie": nie, "bsn": bsn, "detax": de_taxid, "nir": nir, "cf": codice_fiscale,
    "aadhaar": aadhaar, "pan": pan, "ric": cn_ric, "mynum": my_number, "rrn": kr_rrn, "passport": passport,
    "dl": driver_license, "ukdl": uk_licence, "mrn": mrn, "card": card, "iban": iban, "acct": bank_account, "sort": sort_code,
    "phone": phone, "phone_jp": lambda: phone("JP"), "phone_cn": lambda: phone("CN"), "phone_kr": lambda: phone("KR"),
    "phone_tw": lambda: phone("TW"), "phone_hk": lambda: phone("HK"), "phone_in": lambda: phone("IN"), "phone_us": lambda: phone("US"),
    "phone_de": lambda: phone("DE"), "phone_gb": lambda: phone("GB"), "phone_fr": lambda: phone("FR"),
    "email": email, "ip": ip, "dob": dob, "key": api_key, "jwt": jwt, "bearer": bearer_value, "pem": private_key,
    "pw": password, "ukpc": uk_postcode, "name": latin_name, "first": lambda: latin_name(1), "ner": ner_name,
    "lower": lambda: latin_name().lower(), "zh": lambda: R.choice(ZH), "ja": lambda: R.choice(JA), "jafam": lambda: R.choice(JA_FAMILY),
    "ko": lambda: R.choice(KO), "ru": lambda: R.choice(RU), "hi": lambda: R.choice(HI), "ar": lambda: R.choice(AR), "el": lambda: R.choice(EL),
    "zip": lambda: f"{R.randint(10000, 99950)}", "plz": lambda: f"{R.randint(10000, 99999)}", "nlpc": lambda: f"{R.randint(1000, 9999)} {R.choice(['AB', 'CD', 'GH', 'KL', 'MN', 'RT', 'XZ'])}",
    "pin": lambda: f"{R.randint(110001, 855999)}", "jppc": lambda: f"{R.randint(100, 999)}-{R.randint(1000, 9999)}",
    "num": lambda: str(R.randint(1, 250)) + R.choice(["", "", "B", "a"]),
    "n": lambda: str(R.randint(1, 120)),
    "pinnum": lambda: digits(R.choice([4, 6]), string.digits),
}
# field spec: {CLASS|gen} ; a literal part of an address can be labelled as a whole with [[CLASS|text with {gen}]]
T: list[tuple[str, str]] = [
    # US SSN
    ("en", "My SSN is {US_SSN|ssn}, do I need it for the W-2 form?"),
    ("en", "For the background check they asked for my social security number: {US_SSN|ssn}."),
    ("en", "Can you check if {US_SSN|ssn} is formatted right for the IRS form? It's my SSN."),
    ("en", "ssn {US_SSN|ssn} dob {DATE_OF_BIRTH|dob}, how do I fill box 3?"),
    ("en", "I typed {US_SSN|ssn} into the application, is that how SSNs are written?"),
    ("en", "My wife's SSN is {US_SSN|ssn} and mine ends differently, can we file jointly?"),
    # UK
    ("en", "My National Insurance number is {UK_NINO|nino}, how do I check my contributions?"),
    ("en", "HMRC letter says NI no. {UK_NINO|nino} — is that a mistake?"),
    ("en", "my NI number {UK_NINO|nino} keeps getting rejected by the payroll portal"),
    ("en", "NHS number {UK_NHS|nhs}, I need to move my GP registration."),
    ("en", "The pharmacy asked for my NHS no: {UK_NHS|nhs}. Where else is it used?"),
    ("en", "Referral letter for patient {PERSON|name}, NHS number {UK_NHS|nhs}, please summarise."),
    # Spain
    ("es", "Mi DNI es {ES_DNI_NIE|dni} y necesito renovarlo, ¿qué documentos llevo?"),
    ("es", "Para el alquiler me piden el NIE {ES_DNI_NIE|nie}, ¿es obligatorio?"),
    ("en", "My Spanish DNI {ES_DNI_NIE|dni} expired, can I still travel within the EU?"),
    ("es", "Hola, soy {PERSON|name}, con DNI {ES_DNI_NIE|dni}, quiero reclamar una factura."),
    ("es", "NIE: {ES_DNI_NIE|nie}. ¿Cómo pido cita en extranjería?"),
    # Netherlands
    ("nl", "Mijn BSN is {NL_BSN|bsn}, moet ik dat aan mijn werkgever geven?"),
    ("en", "The Dutch tax office asked for my BSN ({NL_BSN|bsn}) on the form."),
    ("nl", "burgerservicenummer {NL_BSN|bsn} — klopt dat voor de zorgverzekering?"),
    ("nl", "Ik woon op {STREET_ADDRESS|Kerkstraat {num}}, {POSTCODE|nlpc} Amsterdam. Hoe meld ik een verhuizing?"),
    # Germany
    ("de", "Meine Steuer-ID ist {DE_ID|detax}, wo trage ich sie in ELSTER ein?"),
    ("de", "Steueridentifikationsnummer {DE_ID|detax} — ist die lebenslang gültig?"),
    ("de", "Ich wohne in der {STREET_ADDRESS|Hauptstraße {num}}, {POSTCODE|plz} Berlin und brauche eine Meldebescheinigung."),
    ("de", "Mein Name ist {PERSON|name}, geboren am {DATE_OF_BIRTH|dob}, bitte formuliere eine Kündigung."),
    ("de", "Lieferadresse: {STREET_ADDRESS|Lindenallee {num}}, {POSTCODE|plz} Köln"),
    # France
    ("fr", "Mon numéro de sécurité sociale est {FR_NIR|nir}, comment obtenir ma carte Vitale ?"),
    ("fr", "Je m'appelle {PERSON|name} et j'habite au {STREET_ADDRESS|{num} rue de Rivoli}, {POSTCODE|plz} Paris."),
    ("fr", "NIR {FR_NIR|nir} — est-ce que la clé est correcte ?"),
    ("fr", "Mon mot de passe est {PASSWORD|pw} mais la banque le refuse."),
    # Italy
    ("it", "Il mio codice fiscale è {IT_FISCAL_CODE|cf}, serve per la tessera sanitaria?"),
    ("it", "Mi chiamo {PERSON|name}, codice fiscale {IT_FISCAL_CODE|cf}, vorrei aprire un conto."),
    ("it", "Abito in {STREET_ADDRESS|Via Roma {num}}, {POSTCODE|plz} Milano, quale ufficio postale è il mio?"),
    ("en", "My codice fiscale {IT_FISCAL_CODE|cf} was rejected by the university portal, why?"),
    # India
    ("en", "My Aadhaar number is {IN_AADHAAR|aadhaar}, how do I link it with my PAN {IN_PAN|pan}?"),
    ("en", "aadhaar {IN_AADHAAR|aadhaar} shows the wrong address, how to update?"),
    ("hi", "मेरा आधार नंबर {IN_AADHAAR|aadhaar} है, इसे बैंक से कैसे जोड़ें?"),
    ("en", "PAN card {IN_PAN|pan} — the name on it is misspelt, what now?"),
    ("en", "Send the documents to Flat 4, {STREET_ADDRESS|{num} MG Road}, Bengaluru - {POSTCODE|pin}."),
    # China
    ("zh", "我的身份证号码是{CN_RESIDENT_ID|ric}，请问怎么办理护照？"),
    ("zh", "我叫{PERSON|zh}，身份证{CN_RESIDENT_ID|ric}，手机{PHONE_NUMBER|phone_cn}。"),
    ("en", "My Chinese resident ID {CN_RESIDENT_ID|ric} doesn't validate on the visa site."),
    ("zh", "我住在{STREET_ADDRESS|北京市朝阳区建国路{n}号}，邮编{POSTCODE|pin}。"),
    # Japan
    ("ja", "私のマイナンバーは{JP_MY_NUMBER|mynum}です。確定申告に必要ですか？"),
    ("ja", "{PERSON|jafam}さんの電話番号は{PHONE_NUMBER|phone_jp}です。"),
    ("ja", "住所は〒{POSTCODE|jppc} {STREET_ADDRESS|東京都千代田区丸の内{n}丁目}です。"),
    ("en", "My Japanese My Number {JP_MY_NUMBER|mynum} — do I need it for my bank account?"),
    ("ja", "田中と申します。携帯は{PHONE_NUMBER|phone_jp}、メールは{EMAIL_ADDRESS|email}です。"),
    # Korea
    ("ko", "제 이름은 {PERSON|ko}입니다. 주민등록번호는 {KR_RRN|rrn}이고 전화번호는 {PHONE_NUMBER|phone_kr}입니다."),
    ("ko", "{PERSON|ko}님 연락처 {PHONE_NUMBER|phone_kr} 로 연락 주세요."),
    # passports
    ("en", "My passport number is {PASSPORT|passport} and it expires next year, can I renew online?"),
    ("en", "passport no. {PASSPORT|passport}, nationality German — which visa do I need?"),
    ("de", "Meine Reisepassnummer lautet {PASSPORT|passport}."),
    ("es", "Número de pasaporte: {PASSPORT|passport}. ¿Necesito visado para Canadá?"),
    ("fr", "Mon passeport n° {PASSPORT|passport} a été volé, que faire ?"),
    ("zh", "我的护照号码是{PASSPORT|passport}，签证被拒了。"),
    ("ja", "パスポート番号は{PASSPORT|passport}です。"),
    ("en", "Booking for {PERSON|name}, passport {PASSPORT|passport}, born {DATE_OF_BIRTH|dob}."),
    # driving licences
    ("en", "My driver's license number is {DRIVER_LICENSE|dl}, the DMV says it's suspended?"),
    ("en", "UK driving licence {DRIVER_LICENSE|ukdl} — how many points do I have?"),
    ("de", "Führerscheinnummer {DRIVER_LICENSE|dl}, ist der in Spanien gültig?"),
    ("en", "DL# {DRIVER_LICENSE|dl}, state of Texas, can I use it as ID to fly?"),
    ("fr", "Mon permis de conduire numéro {DRIVER_LICENSE|dl} est expiré."),
    ("en", "my drivers licence {DRIVER_LICENSE|dl} was issued in Ontario"),
    # medical
    ("en", "Patient MRN {MEDICAL_RECORD_NUMBER|mrn}, 54M, chest pain — what tests should be ordered?"),
    ("en", "Medical record number: {MEDICAL_RECORD_NUMBER|mrn}. Summarise the discharge notes below."),
    ("en", "Hospital number {MEDICAL_RECORD_NUMBER|mrn} for {PERSON|name}, allergic to penicillin."),
    ("de", "Patientennummer {MEDICAL_RECORD_NUMBER|mrn}, bitte Arztbrief kürzen."),
    ("en", "patient id {MEDICAL_RECORD_NUMBER|mrn} had an MRI yesterday, explain the report in plain words"),
    # dates of birth
    ("en", "I was born on {DATE_OF_BIRTH|dob}, how old will I be at retirement?"),
    ("en", "DOB: {DATE_OF_BIRTH|dob}. Am I eligible for the senior discount?"),
    ("en", "My date of birth is {DATE_OF_BIRTH|dob} but the form shows another one."),
    ("es", "Fecha de nacimiento: {DATE_OF_BIRTH|dob}. ¿Cuándo puedo jubilarme?"),
    ("it", "Sono nato il {DATE_OF_BIRTH|dob} a Napoli."),
    ("zh", "我的出生日期是{DATE_OF_BIRTH|dob}。"),
    ("ja", "生年月日は{DATE_OF_BIRTH|dob}です。"),
    # credentials
    ("en", "Why does this fail? client = OpenAI(api_key=\"{API_KEY|key}\")"),
    ("en", "Here is my key {API_KEY|key} — is it leaked if I pushed it to GitHub?"),
    ("en", "export AWS_ACCESS_KEY_ID={API_KEY|key}\nexport AWS_DEFAULT_REGION=eu-west-1\nwhy is boto3 still denied?"),
    ("en", "My token {API_KEY|key} stopped working this morning."),
    ("en", "curl -H \"Authorization: Bearer {ACCESS_TOKEN|bearer}\" https://api.example.com/v1/me returns 401"),
    ("en", "Decode this JWT for me: {ACCESS_TOKEN|jwt}"),
    ("en", "The header is Authorization: Bearer {ACCESS_TOKEN|jwt} and the server says expired."),
    ("en", "Is this key format right?\n{PRIVATE_KEY|pem}"),
    ("en", "ssh fails with my key:\n{PRIVATE_KEY|pem}\nwhat permissions should it have?"),
    ("en", "My password is {PASSWORD|pw}, is it strong enough?"),
    ("en", "The wifi password: {PASSWORD|pw} — how do I share it with a QR code?"),
    ("en", "login: admin / password {PASSWORD|pw} does not work on the router"),
    ("de", "Mein Passwort ist {PASSWORD|pw}, wie ändere ich es?"),
    ("es", "Mi contraseña es {PASSWORD|pw} y no puedo entrar al correo."),
    ("zh", "我的密码是{PASSWORD|pw}，安全吗？"),
    ("en", "DATABASE_URL=postgresql://app:{PASSWORD|pw}@db.internal:5432/prod — why is it refused?"),
    ("en", "My bank PIN is {PASSWORD|pinnum}, should I change it?"),
    # money
    ("en", "Pay me at IBAN {IBAN_CODE|iban}, reference invoice 2291."),
    ("de", "Bitte überweisen Sie auf {IBAN_CODE|iban}, Kontoinhaber {PERSON|name}."),
    ("en", "My card {CREDIT_CARD|card} was charged twice, how do I dispute it?"),
    ("en", "card number {CREDIT_CARD|card} exp 09/27, can you check if it's a Visa?"),
    ("en", "Account number {BANK_ACCOUNT|acct}, sort code {BANK_ACCOUNT|sort}, for the deposit."),
    ("en", "my checking account is {BANK_ACCOUNT|acct} at Chase, routing {BANK_ACCOUNT|acct}"),
    ("es", "Mi número de cuenta es {BANK_ACCOUNT|acct}, ¿cuándo llega la transferencia?"),
    ("ja", "口座番号は{BANK_ACCOUNT|acct}です。"),
    ("fr", "Mon IBAN est {IBAN_CODE|iban}, le virement est-il arrivé ?"),
    # contact
    ("en", "Call me on {PHONE_NUMBER|phone_us} after 6, or email {EMAIL_ADDRESS|email}."),
    ("en", "My number is {PHONE_NUMBER|phone_gb}, can the courier text me?"),
    ("de", "Erreichbar unter {PHONE_NUMBER|phone_de}."),
    ("fr", "Mon portable : {PHONE_NUMBER|phone_fr}."),
    ("zh", "请打我的电话{PHONE_NUMBER|phone_cn}。"),
    ("zh", "台湾的号码是{PHONE_NUMBER|phone_tw}，香港的是{PHONE_NUMBER|phone_hk}。"),
    ("en", "WhatsApp me at {PHONE_NUMBER|phone_in}."),
    ("en", "Reach me at {PHONE_NUMBER|phone}, anytime."),
    ("en", "my email is {EMAIL_ADDRESS|email}, can you draft a reply?"),
    ("en", "Our VPN gives me {IP_ADDRESS|ip}, is my home address visible?"),
    ("en", "ssh into {IP_ADDRESS|ip} fails with permission denied"),
    # addresses and postcodes
    ("en", "I live at {STREET_ADDRESS|{num} Baker Street}, London {POSTCODE|ukpc}. Which council tax band?"),
    ("en", "Ship it to {STREET_ADDRESS|{num} Maple Avenue}, Springfield, IL {POSTCODE|zip}."),
    ("en", "Our office is at {STREET_ADDRESS|{num} Pennsylvania Avenue NW}, Washington, DC {POSTCODE|zip}."),
    ("es", "Vivo en {STREET_ADDRESS|Calle Mayor {num}}, {POSTCODE|plz} Madrid."),
    ("es", "Envíalo a {STREET_ADDRESS|Avenida de la Constitución {num}}, Sevilla."),
    ("en", "Postcode {POSTCODE|ukpc} — which bin day is it?"),
    ("en", "My zip code is {POSTCODE|zip}, which polling station?"),
    ("de", "PLZ {POSTCODE|plz}, welches Finanzamt ist zuständig?"),
    ("nl", "Postcode {POSTCODE|nlpc}, welke gemeente is dat?"),
    ("it", "Il mio CAP è {POSTCODE|plz}."),
    ("en", "Deliver to {STREET_ADDRESS|{num} High Street}, Oxford {POSTCODE|ukpc}, ring twice."),
    ("en", "My new flat is on {STREET_ADDRESS|Drottninggatan {num}} in Stockholm."),
    # names after cues, many scripts
    ("en", "Hi, my name is {PERSON|name} and I need help with my visa."),
    ("en", "my name is {PERSON|lower}, can you write me a cover letter?"),
    ("en", "call me {PERSON|lower} please, not sir"),
    ("en", "I'm {PERSON|name}, the new hire in accounting — draft my intro email."),
    ("en", "Regards, {PERSON|name}"),
    ("en", "Please forward this to Mr. {PERSON|name} in legal."),
    ("en", "Dr. {PERSON|name} prescribed it, is the dose normal?"),
    ("es", "Me llamo {PERSON|name} y busco trabajo de enfermera."),
    ("fr", "Je m'appelle {PERSON|lower}, aidez-moi à écrire une lettre."),
    ("it", "Mi chiamo {PERSON|name}, ho bisogno di un curriculum."),
    ("nl", "Mijn naam is {PERSON|name} en ik zoek een huurwoning."),
    ("ru", "Меня зовут {PERSON|ru}, помогите написать резюме."),
    ("hi", "मेरा नाम {PERSON|hi} है, मुझे नौकरी के लिए आवेदन लिखना है।"),
    ("ar", "اسمي {PERSON|ar} وأحتاج مساعدة في كتابة رسالة."),
    ("el", "My name is {PERSON|el}, I moved from Athens."),
    ("zh", "你好，我叫{PERSON|zh}，想写一封求职信。"),
    ("ja", "私の名前は{PERSON|ja}です。履歴書を書きたいです。"),
    ("ja", "{PERSON|ja}と申します。よろしくお願いします。"),
    ("ko", "제 이름은 {PERSON|ko}입니다."),
    ("zh", "{PERSON|zh}女士明天来面试。"),
    ("en", "This is {PERSON|name} from the billing team."),
    ("en", "Thanks, {PERSON|first}"),
    ("en", "my friend {PERSON|first} says I should ask you"),
    # names without a cue: NER
    ("en", "Write a birthday message for {PERSON|ner}, she turns forty next week."),
    ("en", "Yesterday {PERSON|ner} told me the project was cancelled. How should I respond?"),
    ("en", "Can you summarise the email {PERSON|ner} sent about the budget?"),
    ("en", "Draft a reference letter for {PERSON|ner}, who worked with me for three years."),
    ("en", "{PERSON|ner} and {PERSON|ner} are fighting over the shared drive again."),
    ("en", "Remind me to call {PERSON|ner} about the lease on Monday."),
    ("en", "I think {PERSON|ner} is stealing my lunch from the office fridge."),
    ("en", "Is it rude that {PERSON|ner} didn't invite me to the wedding?"),
    ("en", "Translate this note for {PERSON|ner}: the keys are under the mat."),
    ("en", "My landlord {PERSON|ner} refuses to return the deposit."),
    ("en", "Plan a surprise party for {PERSON|ner} on Saturday."),
    ("en", "How do I tell {PERSON|ner} that her presentation was too long?"),
]

# a second, mixed layer: several classes in one turn
MIX: list[tuple[str, str]] = [
    ("en", "Name: {PERSON|name}\nDOB: {DATE_OF_BIRTH|dob}\nSSN: {US_SSN|ssn}\nPhone: {PHONE_NUMBER|phone_us}\nFill the insurance form for me."),
    ("en", "Hi, {PERSON|name} here. Card {CREDIT_CARD|card}, billing address {STREET_ADDRESS|{num} Oak Road}, Leeds {POSTCODE|ukpc}."),
    ("de", "Ich bin {PERSON|name}, Tel. {PHONE_NUMBER|phone_de}, IBAN {IBAN_CODE|iban}. Bitte Rechnung schreiben."),
    ("en", "Contact {PERSON|ner} at {EMAIL_ADDRESS|email} or {PHONE_NUMBER|phone_gb}."),
    ("es", "Soy {PERSON|name}, mi NIE es {ES_DNI_NIE|nie} y mi teléfono {PHONE_NUMBER|phone}."),
    ("en", "config.yaml:\n  db_password: {PASSWORD|pw}\n  api_key: {API_KEY|key}\nwhat's wrong with the indentation?"),
    ("en", "My MRN is {MEDICAL_RECORD_NUMBER|mrn} and my NHS number {UK_NHS|nhs}; which one does the clinic need?"),
    ("en", "Aadhaar {IN_AADHAAR|aadhaar}, mobile {PHONE_NUMBER|phone_in}, I want to update KYC."),
]


# held out: written after the recognizers were tuned on the templates above, and measured apart from them
HELD: list[tuple[str, str]] = [
    ("en", "Quick q — the clinic form wants my social security no. ({US_SSN|ssn}); is it safe to email it?"),
    ("en", "Employer typed my NI as {UK_NINO|nino} on the payslip, should I get it corrected?"),
    ("en", "GP surgery asked me to confirm NHS No {UK_NHS|nhs} over the phone, is that normal?"),
    ("es", "Te paso mis datos: {PERSON|name}, DNI {ES_DNI_NIE|dni}, móvil {PHONE_NUMBER|phone}."),
    ("nl", "Kun je mijn BSN {NL_BSN|bsn} invullen op het formulier van de gemeente?"),
    ("de", "Für die Steuererklärung: Steuer-ID {DE_ID|detax}, Adresse {STREET_ADDRESS|Bahnhofstraße {num}}, {POSTCODE|plz} München."),
    ("fr", "Voici mon NIR {FR_NIR|nir}, la CPAM dit qu'il est faux."),
    ("it", "Codice fiscale {IT_FISCAL_CODE|cf}: me lo controlli prima che lo mandi al commercialista?"),
    ("en", "KYC is stuck: Aadhaar no. {IN_AADHAAR|aadhaar} and PAN {IN_PAN|pan} both uploaded."),
    ("zh", "帮我填表：姓名{PERSON|zh}，身份证号{CN_RESIDENT_ID|ric}，电话{PHONE_NUMBER|phone_cn}"),
    ("ja", "マイナンバー {JP_MY_NUMBER|mynum} を会社に提出しても大丈夫ですか？"),
    ("ko", "{PERSON|ko}씨 전화번호가 {PHONE_NUMBER|phone_kr} 맞나요?"),
    ("en", "Travelling Friday. Passport #{PASSPORT|passport}, can I check in online?"),
    ("en", "The rental company wants my driving license no {DRIVER_LICENSE|dl} before pickup."),
    ("en", "Notes for MRN: {MEDICAL_RECORD_NUMBER|mrn} — BP 150/95, started lisinopril. Make it patient friendly."),
    ("en", "For the insurance quote: born {DATE_OF_BIRTH|dob}, non-smoker, 180 cm."),
    ("de", "Geburtsdatum {DATE_OF_BIRTH|dob}, wann bekomme ich Rente?"),
    ("fr", "Je suis née le {DATE_OF_BIRTH|dob}, à quel âge puis-je partir à la retraite ?"),
    ("en", "openai.api_key = '{API_KEY|key}'  # this is in my notebook, is that bad?"),
    ("en", "GitHub says my token {API_KEY|key} was revoked, why?"),
    ("en", "curl -u me:x -H 'Authorization: Bearer {ACCESS_TOKEN|jwt}' localhost:8000/api"),
    ("en", "I pasted this into the config, is it valid?\n{PRIVATE_KEY|pem}"),
    ("en", "Router admin pw is {PASSWORD|pw} — how do I make it stronger?"),
    ("it", "La mia password è {PASSWORD|pw}, va bene?"),
    ("en", "mongodb://root:{PASSWORD|pw}@mongo.local:27017/admin connection keeps timing out"),
    ("en", "Refund should go to {IBAN_CODE|iban}, account holder {PERSON|name}."),
    ("en", "Visa ending weird: {CREDIT_CARD|card}, can you tell me the issuer?"),
    ("en", "Wire details — acct no. {BANK_ACCOUNT|acct}, sort code {BANK_ACCOUNT|sort}."),
    ("en", "Text me on {PHONE_NUMBER|phone} when the parcel arrives."),
    ("ja", "連絡先：{PHONE_NUMBER|phone_jp}（携帯）"),
    ("zh", "香港办公室电话：{PHONE_NUMBER|phone_hk}"),
    ("en", "Send the invoice to {EMAIL_ADDRESS|email} please."),
    ("en", "Forward port 22 to {IP_ADDRESS|ip} on my home router?"),
    ("en", "New address: {STREET_ADDRESS|{num} Queen's Road}, Bristol {POSTCODE|ukpc}."),
    ("en", "We moved to {STREET_ADDRESS|{num} Elm Street}, Austin, TX {POSTCODE|zip}."),
    ("es", "La dirección es {STREET_ADDRESS|Calle de Alcalá {num}}, {POSTCODE|plz} Madrid."),
    ("it", "Consegna in {STREET_ADDRESS|Corso Vittorio Emanuele {num}}, Torino."),
    ("nl", "Ons adres: {STREET_ADDRESS|Prinsengracht {num}}, {POSTCODE|nlpc} Amsterdam."),
    ("en", "hey, it's {PERSON|first} again — did you finish my essay?"),
    ("en", "my name's {PERSON|lower}, write me a poem about my cat"),
    ("ru", "Здравствуйте, меня зовут {PERSON|ru}, у меня вопрос по визе."),
    ("hi", "मेरा नाम {PERSON|hi} है और मैं दिल्ली से हूँ।"),
    ("ja", "{PERSON|jafam}さんに明日の会議のことを伝えてください。"),
    ("en", "Cheers, {PERSON|name}"),
    ("en", "Please help me write an apology to {PERSON|ner} for missing the meeting."),
    ("en", "Should I lend money to {PERSON|ner}? We've been friends since school."),
    ("en", "{PERSON|ner} keeps interrupting me in meetings, what do I say?"),
    ("en", "Write a eulogy for my grandfather {PERSON|ner}, a carpenter who loved fishing."),
]
HELD_CLEAN: list[str] = [
    "Bump pydantic from 2.7.1 to 2.8.2 in requirements.txt and explain the breaking changes.",
    "Our release 4.10.2.3 has a regression compared to 4.10.2.2.",
    "What is the ISBN 978-1-4028-9462-6 book about?",
    "Solve for x: 12x - 7 = 5x + 21.",
    "What is 98765 / 123 to four decimal places?",
    "Is 1000000007 a prime number?",
    "The Treaty of Versailles was signed on 28 June 1919.",
    "Our offsite is on 2025-06-12; list three agenda ideas.",
    "Compare the Pixel 8 Pro and the OnePlus 12.",
    "Is the Dell XPS 13 9340 good for programming?",
    "The GPU is an A100 80GB SXM4; how many fit in a DGX?",
    "Set max_tokens=4096 and temperature=0.7 in the request.",
    "What does HTTP status 503 mean?",
    "Convert 72 degrees Fahrenheit to Celsius.",
    "Population of Canada in 2021 was 36,991,981; growth since 2016?",
    "def area(r):\n    return 3.14159 * r ** 2",
    "SELECT COUNT(*) FROM events WHERE ts BETWEEN '2024-01-01' AND '2024-06-30';",
    "npm install react@18.3.1 react-dom@18.3.1",
    "print(sum(i * i for i in range(1, 101)))  # 338350",
    "export PATH=$HOME/.local/bin:$PATH",
    "password_hash = bcrypt.hashpw(password.encode(), bcrypt.gensalt())",
    "api_key = os.environ.get('OPENAI_API_KEY')",
    "Ein Kilo Äpfel kostet 2,49 Euro; was kosten 3,5 Kilo?",
    "La tour Eiffel mesure 330 mètres.",
    "¿Cuántos días hay entre el 1 de marzo y el 15 de abril?",
    "Quanto fa 17 al quadrato?",
    "请把这段代码改成Python 3.12兼容的写法。",
    "東京タワーの高さは333メートルです。",
    "Write a limerick about a cat who learns Rust.",
    "Explain gradient descent with momentum in two paragraphs.",
]


def render(lang: str, template: str) -> dict:
    import re

    text, spans, pos = "", [], 0
    for m in re.finditer(r"\{([A-Z_]+)\|((?:[^{}]|\{[a-z_]+\})+)\}", template):
        text += template[pos : m.start()]
        cls, spec = m.group(1), m.group(2)
        if "{" in spec or " " in spec or not spec.isidentifier() or spec not in G:
            value = re.sub(r"\{([a-z_]+)\}", lambda g: G[g.group(1)](), spec)
        else:
            value = G[spec]()
        spans.append({"start": len(text), "end": len(text) + len(value), "class": cls, "value": value})
        text += value
        pos = m.end()
    text += template[pos:]
    return {"lang": lang, "kind": "pii", "text": text, "spans": spans}


CLEAN: list[tuple[str, str]] = [
    ("en", "Upgrade from Python 3.11.7 to 3.12.1 broke my venv, how do I rebuild it?"),
    ("en", "We are on version 10.2.0.1 of the firmware; is 10.2.1.0 newer?"),
    ("en", "pip install numpy==1.26.4 torch==2.3.1 fails on Ubuntu 22.04.3 LTS"),
    ("en", "The changelog for v2.4.1.0 mentions a fix in 2.4.0.9, which one should I pin?"),
    ("en", "Chrome 120.0.6099.109 crashes on startup after the update."),
    ("en", "Node 18.19.0 vs 20.11.1: which LTS should a new project use?"),
    ("en", "Is ISBN 978-0-306-40615-7 the first edition?"),
    ("en", "Cite the book with ISBN 978-3-16-148410-0 in APA style."),
    ("en", "ISBN-10 0-306-40615-2 converts to which ISBN-13?"),
    ("en", "The paper is arXiv:2305.18290, summarise its method."),
    ("en", "DOI 10.1038/s41586-021-03819-2 — is that the AlphaFold paper?"),
    ("en", "Solve 3x + 7 = 22 and explain each step."),
    ("en", "What is 123456789 * 987654321?"),
    ("en", "Prove that the square root of 2 is irrational."),
    ("en", "Compute the integral of x^2 from 0 to 3."),
    ("en", "Is 2147483647 prime? And 4294967297?"),
    ("en", "Find the derivative of sin(x) * e^(2x)."),
    ("en", "The sequence 1, 1, 2, 3, 5, 8, 13, 21 — what's the 50th term?"),
    ("en", "Convert 0.000123456 to scientific notation."),
    ("en", "A train leaves at 14:35 and travels 312 km at 96 km/h; when does it arrive?"),
    ("en", "What's 15% of 48250?"),
    ("en", "Matrix [[1, 2], [3, 4]] — what is its determinant and inverse?"),
    ("en", "The Fibonacci number F(30) is 832040, right?"),
    ("en", "Explain the Euler identity e^(i*pi) + 1 = 0."),
    ("en", "The meeting moved from 2024-03-15 to 2024-03-22, update the calendar invite text."),
    ("en", "World War II ended in 1945; the Berlin Wall fell on 9 November 1989."),
    ("en", "The US declared independence on July 4, 1776. Summarise why."),
    ("en", "Our sprint runs from 03/04/2025 to 17/04/2025, how many working days is that?"),
    ("en", "The deadline is 31.12.2024, what weekday is that?"),
    ("en", "Schedule a reminder for 1 January 2026 at 09:00."),
    ("en", "Compare the iPhone 15 Pro Max with the Galaxy S24 Ultra for photography."),
    ("en", "Is the ThinkPad X1 Carbon Gen 11 good for Linux?"),
    ("en", "RTX 4090 vs RTX 4080 Super for training a 7B model?"),
    ("en", "Should I buy a Tesla Model 3 or a Toyota Prius?"),
    ("en", "My Kindle Paperwhite won't charge after the 5.16.2.1.1 update."),
    ("en", "Which is better for coffee, the Breville Barista Express or the De'Longhi Dedica EC685?"),
    ("en", "The Sony WH-1000XM5 keeps disconnecting from my MacBook Pro M3."),
    ("en", "HTTP 404 on /api/v1/users/42 but 200 on /api/v1/users/41, why?"),
    ("en", "The server listens on port 8080 and the health check on 9090."),
    ("en", "Use colour #1a2b3c for the header and #ffffff for text."),
    ("en", "The order total was $1,234.56 including 8.875% tax; what was the pre-tax price?"),
    ("en", "Tokyo has about 37,400,000 people in its metro area; how does that compare with Delhi?"),
    ("en", "The commit a3f5c9e2b1d4 introduced the bug; how do I revert it?"),
    ("en", "UUID 123e4567-e89b-12d3-a456-426614174000 — is that version 1 or 4?"),
    ("en", "Mount Everest is 8,848.86 m tall; convert to feet."),
    ("en", "Set the learning rate to 3e-4 and batch size 256 for 10000 steps."),
    ("en", "My CPU is an Intel Core i7-13700K at 5.4 GHz; is 85 C normal under load?"),
    ("en", "Flight LH 400 departs at 10:50 from gate B44."),
    ("en", "The password field should be at least 12 characters; write the validation rule."),
    ("en", "How do I reset a forgotten password on Windows 11?"),
    ("en", "Write a haiku about autumn leaves."),
    ("en", "What is the capital of Australia?"),
    ("en", "Explain the difference between TCP and UDP."),
    ("en", "Summarise the plot of Hamlet in three sentences."),
    ("en", "Give me a recipe for lentil soup for 4 people."),
    ("en", "Why is the sky blue?"),
    ("en", "Translate 'good morning' into Japanese and Korean."),
    ("en", "The API key should come from an environment variable; show the pattern."),
    ("en", "What does the error 'Address already in use' mean?"),
    ("en", "Apache License 2.0 vs MIT License for a library?"),
    ("en", "Version 1.2.3.4 of our app added dark mode; write release notes."),
    ("en", "Our build 2024.11.5.1 failed the smoke tests."),
    ("en", "The Boeing 737 MAX 8 and the Airbus A320neo: which is quieter?"),
    ("en", "Is 4111 a valid CVV length for Amex? Just asking about the format rules."),
    ("en", "In 2023 we shipped 12500 units; in 2024, 15800. What's the growth rate?"),
    ("en", "Ranked #3 out of 150 teams with 98765 points."),
    ("code", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(fib(30))  # 832040"),
    ("code", "import os\npassword = os.environ[\"DB_PASSWORD\"]\ntoken = os.getenv(\"API_TOKEN\")\nclient = Client(token=token)"),
    ("code", "SELECT user_id, COUNT(*) FROM orders WHERE created_at >= '2024-01-01' GROUP BY user_id HAVING COUNT(*) > 5;"),
    ("code", "for i in $(seq 1 10); do curl -s http://localhost:8080/health; sleep 1; done"),
    ("code", "const server = app.listen(3000, () => console.log('listening on 3000'));"),
    ("code", "x = np.linspace(0, 2 * np.pi, 1000)\ny = np.sin(x) * np.exp(-0.1 * x)\nplt.plot(x, y)"),
    ("code", "docker run -p 5432:5432 -e POSTGRES_PASSWORD=$POSTGRES_PASSWORD postgres:16.2"),
    ("code", "git log --oneline v1.4.2..v1.5.0 | wc -l"),
    ("code", "model = AutoModelForCausalLM.from_pretrained(\"HuggingFaceTB/SmolLM2-135M\", torch_dtype=torch.bfloat16)"),
    ("code", "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)"),
    ("code", "tokens = tokenizer.encode(text, max_length=512, truncation=True)"),
    ("code", "assert checksum(\"4111111111111112\") is False  # off by one"),
    ("code", "kubectl scale deployment web --replicas=3 -n prod-eu-west-1"),
    ("code", "CREATE INDEX idx_orders_created ON orders (created_at DESC);"),
    ("code", "ssh -i ~/.ssh/id_ed25519 deploy@localhost -p 2222"),
    ("code", "requests.get(url, headers={\"Authorization\": f\"Bearer {token}\"}, timeout=30)"),
    ("code", "awk -F, '{sum += $3} END {print sum / NR}' data.csv"),
    ("code", "fn main() {\n    let v: Vec<u64> = (1..=20).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}"),
    ("code", "regex = r\"^\\d{3}-\\d{2}-\\d{4}$\"  # how to validate the shape of an id field"),
    ("code", "DATABASE_URL=postgresql://app:${DB_PASSWORD}@db:5432/app"),
    ("code", "if version >= (3, 12, 1):\n    use_new_parser()"),
    ("code", "seed = 1234567890\nrng = np.random.default_rng(seed)"),
    ("code", "dates = pd.date_range('2024-01-01', '2024-12-31', freq='W-MON')"),
    ("code", "printf '%s\\n' \"scale=20; 4*a(1)\" | bc -l"),
    ("de", "Wie installiere ich Python 3.12.2 unter Windows 11?"),
    ("de", "Die Gleichung 2x + 5 = 17 lösen, bitte mit Zwischenschritten."),
    ("de", "Ist das Samsung Galaxy A54 5G gut für Fotos?"),
    ("de", "Der Zug ICE 1537 fährt um 14:12 ab Gleis 7."),
    ("fr", "Quelle est la différence entre la version 4.2.1 et 4.3.0 de Django ?"),
    ("fr", "Résous l'équation x^2 - 5x + 6 = 0."),
    ("fr", "La Révolution française a commencé le 14 juillet 1789."),
    ("es", "¿Cómo actualizo Android 13 a Android 14 en un Pixel 7?"),
    ("es", "Calcula el 21% de IVA sobre 1.250 euros."),
    ("it", "Qual è la differenza tra Java 17 e Java 21?"),
    ("it", "Il libro ha ISBN 978-88-04-66812-5, è ancora in stampa?"),
    ("nl", "Hoeveel is 17 procent van 2.340?"),
    ("zh", "请解释一下Python 3.12的新特性。"),
    ("zh", "计算 365 × 24 × 60 等于多少？"),
    ("zh", "2024年3月15日是星期几？"),
    ("ja", "iPhone 15の電池持ちはどうですか？"),
    ("ja", "2の平方根は無理数であることを証明してください。"),
    ("ko", "파이썬 3.11과 3.12의 차이점은 무엇인가요?"),
    ("ru", "Как обновить Ubuntu 22.04 до 24.04?"),
    ("hi", "2 + 2 का उत्तर क्या है?"),
]


def main() -> None:
    rows = []
    # every template rendered a few times with fresh values (more renders for the short template lists)
    for reps, pool in ((3, T), (3, MIX)):
        for lang, tmpl in pool:
            for _ in range(reps):
                rows.append(render(lang, tmpl))
    for lang, text in CLEAN:
        rows.append({"lang": lang, "kind": "clean", "text": text, "spans": []})
    for row in rows:
        row["split"] = "tune"
    held = [render(lang, tmpl) for _ in range(3) for lang, tmpl in HELD]
    held += [{"lang": "mixed", "kind": "clean", "text": text, "spans": []} for text in HELD_CLEAN]
    for row in held:
        row["split"] = "heldout"
    rows += held
    with OUT.open("w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            f.write(json.dumps({"id": f"pii-{i:04d}", **row}, ensure_ascii=False) + "\n")
    n_pii = sum(r["kind"] == "pii" for r in rows)
    print(f"wrote {OUT}: {n_pii} turns with personal data ({sum(len(r['spans']) for r in rows)} spans), "
          f"{len(rows) - n_pii} clean")


if __name__ == "__main__":
    main()
