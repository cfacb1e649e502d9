"""Secrets by reference: API keys and passwords reach the pipeline as the NAME of an environment variable, never as a
value in a flow parameter, a command line, a recipe or a URL.

Every value the pipeline is given is written somewhere: flow parameters go to Prefect's database, stage command
lines to the flow log and to Slurm's ``job.sbatch``, process arguments to W&B, configs to manifests and reports. A
name (``api_key_env: OPENAI_API_KEY``, ``--db-password-env PGPASSWORD``) is safe in all of them; the value is read
from the environment by the one process that uses it (the judge's HTTP client, the database driver) and kept only
in memory. A value given where a name is expected is refused with one line naming the field (the value itself is
never repeated); it is not moved to the environment, because by then it has already passed through the shell's
history and the process table.

Database URLs are recorded through :func:`redact_url` (SQLAlchemy's ``render_as_string(hide_password=True)``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

#: An environment variable's name as the pipeline accepts it: upper case, digits, underscores (POSIX's portable
#: names). Upper case only, so that most API keys (mixed-case base62, or with ``-``) cannot pass for a name.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")

# Keys whose value is a secret (``api_key``, ``hub_token``, ``db_password``, ...); ``*_env`` keys hold names.
# ``pad_token`` / ``eos_token`` (tokenizer fields) are not secrets, hence the explicit list of token keys.
_SECRET_KEY = re.compile(
    r"(?:.*_)?(?:api_?key|password|passwd|secret)|(?:.*_)?(?:hub|access|auth|bearer|api|hf|wandb)_token|token"
    r"|(?:proxy[-_])?authorization|cookie|x[-_]api[-_]key|headers|default_headers|extra_headers",
    re.IGNORECASE,
)
# A credential inside any string: an HTTP authorization value ("Bearer sk-...", "Basic dXNlcjpw...") or a key
# of the common vendor shapes (OpenAI's "sk-...", Hugging Face's "hf_...").
# Token-shaped only (a digit in it, no spaces), so prose such as "basic instructions" is not taken for one.
_SECRET_VALUE = re.compile(r"\b(?:Bearer|Basic)\s+(?=\S*\d)[A-Za-z0-9._~+/=-]{12,}|\bsk-(?=[\w-]*\d)[\w-]{16,}"
                           r"|\bhf_(?=\w*\d)[A-Za-z0-9]{20,}")


# ``password=...`` / ``api_key=...`` inside a string: a libpq keyword string (``host=h password=p``) or a URL's query
# (``?password=p``), which no URL parser reports as the URL's password.
_SECRET_ASSIGNMENT = re.compile(
    r"(?:^|[\s;&?,])(?:[a-z_]*password|passwd|[a-z_]*secret|api_?key|(?:hub|access|auth|bearer|api|hf|wandb)_token)\s*=\s*[^\s&;,]", re.IGNORECASE
)


class SecretValueError(ValueError):
    """A secret value was given where the pipeline takes an environment variable's name (the message names the
    field, never the value)."""


def is_secret_key(key: str) -> bool:
    """True for a setting whose value is a secret (``api_key``, ``judge.api_key``, ``--hub_token``, ``password``)."""
    name = key.lstrip("-").rsplit(".", 1)[-1]
    return not name.endswith("_env") and _SECRET_KEY.fullmatch(name) is not None


def check_env_name(name: str, where: str) -> str:
    """``name`` if it is an environment variable's name (``ENV_NAME``); else SecretValueError (it may be the
    secret itself, so the message does not show it)."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise SecretValueError(
            f"{where}: expected the NAME of an environment variable (upper case letters, digits and _, e.g. "
            f"OPENAI_API_KEY); the value given is not one and is not repeated here (if it is the secret itself, put "
            f"it in the environment and give its name)"
        )
    return name


def refuse_secret(where: str, env_field: str) -> SecretValueError:
    """The error for a secret given as a value at ``where``; ``env_field`` is where its variable's name goes."""
    return SecretValueError(
        f"{where}: a secret is never given as a value (it would be written to the flow log, Prefect's database, W&B "
        f"and job scripts); put it in an environment variable and give that variable's name with {env_field}"
    )


def env_secret(name: str) -> str:
    """The value of the environment variable ``name`` ('' when unset). Call it where the secret is used."""
    return os.environ.get(name, "") if name else ""


def check_mapping(data: Any, where: str) -> None:
    """Refuse a mapping (recursively) that holds a secret-like key with a non-empty value (``refuse_secret``), a
    ``*_env`` value that is not a variable's name (``check_env_name``: it may be the secret itself), or a string
    value holding a secret (``check_value``: a URL with a password, ``password=...``)."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}"
            if is_secret_key(str(key)) and value not in (None, ""):
                raise refuse_secret(here, f"{where}.api_key_env" if str(key) == "api_key" else "its *_env setting")
            if str(key).endswith("_env") and value not in (None, ""):
                check_env_name(value, here)
            elif isinstance(value, str):
                check_value(value, here)
                continue
            check_mapping(value, here)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_mapping(value, f"{where}[{i}]")


def check_value(value: Any, where: str) -> None:
    """Refuse a value that carries a secret: a URL with a password in it, or JSON (or a mapping) holding a
    secret-like key (``check_mapping``)."""
    if isinstance(value, (dict, list)):
        check_mapping(value, where)
        return
    if not isinstance(value, str):
        return
    text = value.strip()
    if text[:1] in "{[":
        parsed = _parse_mapping_text(text)
        if parsed is not None:
            check_mapping(parsed, where)
            return
    if _SECRET_VALUE.search(text):
        raise refuse_secret(where, "its *_env setting")
    if "://" in text or _SECRET_ASSIGNMENT.search(text):
        check_url(text, where, "an environment variable (e.g. PGPASSWORD)")


def parse_mapping(data: Any, *, where: str, example: str = "{backend: openai, model: ...}") -> dict[str, Any]:
    """A settings mapping given as a mapping or as its JSON text (a recipe's YAML mapping, or JSON on the command
    line); None or "" -> {}. The one parser of that form, for ``--judge``, ``--refusal_judge``, ``--reward_judge`` and
    ``--tripwire_gold_judge`` alike (it does not check for secrets: ``check_mapping`` does).

    Raises:
        ValueError: text that is not JSON, or anything but a mapping (names ``where``).
    """
    if data is None or data == "":
        return {}
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not a JSON object ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping like {example}, got {type(data).__name__}")
    return dict(data)


def _parse_mapping_text(text: str) -> Any:
    """``text`` read as JSON, else as YAML (``--set`` takes both: ``{backend: openai, api_key: ...}``); None when it
    is neither."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def check_args(args: Iterable[str], where: str) -> None:
    """Refuse command-line style overrides (``["--key", "value", ...]``) that carry a secret: a secret-like key
    (``--api_key``, ``--hub_token``) or a value holding one (``check_value``)."""
    args = list(args)
    for key, value in zip(args[::2], args[1::2]):
        name = key.lstrip("-")
        if is_secret_key(name) and value not in (None, ""):
            raise refuse_secret(f"{where}.{name}", "its *_env setting (or the variable the library reads itself)")
        check_value(value, f"{where}.{name}")


def url_password(url: str) -> str | None:
    """The password inside a database URL (None when there is none or ``url`` is not a URL)."""
    if "://" not in str(url):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(str(url))
        if parsed.password:
            return parsed.password
        for key, value in parsed.query.items():  # ?password=... reaches the driver as the password too
            if is_secret_key(key) and value:
                return value if isinstance(value, str) else ",".join(value)
        return None
    except (ArgumentError, ValueError):
        # not parseable by SQLAlchemy: fall back to the generic user:password@ form
        m = re.match(r"[^:/]+://[^/@:]*:([^@/]*)@", str(url))
        return m.group(1) if m else None


def check_url(url: str, where: str, env_field: str) -> str:
    """``url`` unchanged when it holds no password (in its user part, its query, or as ``password=...`` in a libpq
    keyword string); else SecretValueError naming ``env_field``."""
    if url_password(url) or _SECRET_ASSIGNMENT.search(str(url)):
        raise refuse_secret(f"{where} (the URL holds a password)", env_field)
    return url


def redact_url(url: str) -> str:
    """A database URL as it may be recorded: the password hidden (``***``); other strings unchanged."""
    if "://" not in str(url):
        return str(url)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(str(url)).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", str(url))


def url_with_env_password(url: str, password_env: str | None, where: str = "--db"):
    """A SQLAlchemy ``URL`` for ``url`` (which must hold no password) with the password read from the environment
    variable ``password_env``; ``url`` unchanged when ``password_env`` is None (PostgreSQL's driver then reads
    ``PGPASSWORD`` or ``~/.pgpass`` itself).

    Raises:
        SecretValueError: a password inside ``url``, or ``password_env`` not a variable name.
        ValueError: ``password_env`` is not set in the environment.
    """
    check_url(url, where, f"{where}-password-env NAME (or PGPASSWORD)")
    if not password_env:
        return url
    from sqlalchemy.engine import make_url

    check_env_name(password_env, f"{where}-password-env")
    if password_env not in os.environ:
        raise ValueError(f"{where}-password-env {password_env}: that environment variable is not set")
    return make_url(url).set(password=os.environ[password_env])
