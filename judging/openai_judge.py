"""A pairwise judge behind any OpenAI-compatible chat endpoint (``vllm serve``, ``transformers serve``, a hosted
API), asked in both orders to cancel position bias, every judgment cached on disk.

The template
------------
The built-in template follows AlpacaEval 2's pairwise annotator prompt (``weighted_alpaca_eval_gpt4_turbo``,
tatsu-lab/alpaca_eval, Apache-2.0): a system message casting the judge as a leaderboard annotator, and a user
message holding the instruction and the two outputs under the identifiers ``m`` (output 1) and ``M`` (output 2);
the judge answers with one identifier and nothing else. Override it with ``judge.template: <file>``: the file is
the user message, with the placeholders ``{instruction}``, ``{output_1}`` and ``{output_2}`` (filled by plain
replacement, so braces elsewhere are kept), and answers ``m`` / ``M``; ``judge.system_prompt`` replaces the system
message. The template's text is part of the judge's identity.

Both orders
-----------
Each item is asked twice: (A as output 1, B as output 2) and swapped. An answer is parsed by
:func:`parse_answer` (the identifier alone, whitespace and one pair of quotes stripped; anything else is
unparsable). Both orders parsed: the preference is the mean of the two orders' preferences (AlpacaEval
convention: 2.0 both picked B, 1.0 both picked A, 1.5 the orders disagree, i.e. position bias), and the item
counts toward the position-consistency rate (share of items whose two orders agree). Either order unparsable:
preference NaN, counted apart (``judging.judges.n_unparsed``), never a tie.

I/O
---
Requests go through ``judging.openai_client.ChatClient`` (the ``openai`` client library): ``max_retries`` retries
on I/O errors only (connection errors, timeouts, HTTP 408/409/429/5xx; exponential backoff with jitter, the
client's own), at most ``max_concurrency`` in flight. An answer that does not parse is not retried: it is the
judge's answer. Each answer is cached under the sha256 of (the judge's identity, the messages: system message,
template filled with the prompt and both responses) as soon as it arrives, so an unchanged rerun sends zero
judging requests (``requests_sent`` counts every HTTP attempt, retries included).

Identity
--------
Who answers is measured, not named (``judging.identity``): when the judge is first used, the server's model listing
is read and the fixed probe pairs (``judging/probe_pairs.json``) are asked fresh in both orders with this template
at temperature 0 (9 requests, ``probe_requests_sent``). The identity (backend, endpoint without credentials, model
name and listing, decoding, template hash, probe answers and reported fingerprints) keys the cached answers and the
cached agreement, so other weights served under the same name are a new judge: asked afresh and re-qualified.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from data.labels import BASELINE_WINS, CANDIDATE_WINS
from rlhf.lineage import json_hash

from .identity import load_probe_pairs
from .judges import Judge, JudgeConfig, Judgment, check_lengths, prompt_text
from .openai_client import ChatClient

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a highly efficient assistant, who evaluates and selects the best large language model (LLMs) based "
    "on the quality of their responses to a given instruction. This process will be used to create a leaderboard "
    "reflecting the most accurate and human-preferred answers."
)

TEMPLATE = '''I require a leaderboard for various large language models. I'll provide you with prompts given to these models and their corresponding outputs. Your task is to assess these responses, and select the model that produces the best output from a human perspective.

## Instruction

{
    "instruction": """{instruction}""",
}

## Model Outputs

Here are the unordered outputs from the models. Each output is associated with a specific model, identified by a unique model identifier.

{
    {
        "model_identifier": "m",
        "output": """{output_1}"""
    },
    {
        "model_identifier": "M",
        "output": """{output_2}"""
    }
}

## Task

Evaluate the models based on the quality and relevance of their outputs, and select the model that generated the best output. Answer by providing the model identifier of the best model. We will use your output as the name of the best model, so make sure your output only contains one of the following model identifiers and nothing else (no quotes, no spaces, no new lines, ...): m or M.

## Best Model Identifier
'''

PLACEHOLDERS = ("{instruction}", "{output_1}", "{output_2}")
#: The identifiers of output 1 and output 2 in the template.
FIRST_ID, SECOND_ID = "m", "M"


def load_template(path: str) -> str:
    """The user-message template: the built-in ``TEMPLATE`` when ``path`` is empty, else the file's text.

    Raises:
        FileNotFoundError: no such file. ValueError: a placeholder of ``PLACEHOLDERS`` is missing (named).
    """
    if not path:
        return TEMPLATE
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"judge.template {path}: no such file")
    text = p.read_text(encoding="utf-8")
    missing = [ph for ph in PLACEHOLDERS if ph not in text]
    if missing:
        raise ValueError(f"judge.template {path}: missing placeholder(s) {missing} (needs {list(PLACEHOLDERS)})")
    return text


def fill(template: str, instruction: str, output_1: str, output_2: str) -> str:
    """The user message: placeholders replaced literally (responses may hold braces)."""
    return (template.replace("{instruction}", instruction).replace("{output_1}", output_1)
            .replace("{output_2}", output_2))


def parse_answer(text: str | None) -> int | None:
    """The judge's answer -> 1 (output 1 better), 2 (output 2 better) or None (unparsable).

    Accepted: exactly ``m`` or ``M`` after stripping whitespace and one pair of matching quotes or backticks.
    """
    if text is None:
        return None
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'`":
        t = t[1:-1].strip()
    return {FIRST_ID: 1, SECOND_ID: 2}.get(t)


def combine(answer_ab: str | None, answer_ba: str | None) -> Judgment:
    """Both orders' answers -> one Judgment (module docstring, "Both orders").

    ``answer_ab``: A shown as output 1; ``answer_ba``: B shown as output 1.
    """
    raw = {"ab": answer_ab, "ba": answer_ba}
    ab, ba = parse_answer(answer_ab), parse_answer(answer_ba)
    if ab is None or ba is None:
        return Judgment(math.nan, raw, None)
    pref_ab = BASELINE_WINS if ab == 1 else CANDIDATE_WINS  # output 1 is A
    pref_ba = CANDIDATE_WINS if ba == 1 else BASELINE_WINS  # output 1 is B
    return Judgment((pref_ab + pref_ba) / 2, raw, pref_ab == pref_ba)


class OpenAIJudge(Judge):
    """Pairwise judge over an OpenAI-compatible ``/chat/completions`` endpoint (see the module docstring).

    Args:
        config: ``base_url`` (or ``$OPENAI_BASE_URL``), ``model`` (or ``$OPENAI_MODEL``), the key from
            ``$<api_key_env>`` (local servers accept any), ``template``, ``system_prompt``, ``max_tokens``,
            ``temperature``, ``max_concurrency``, ``max_retries``, ``timeout_s``, ``cache_dir``.
        record_identity: ``ChatClient``'s (False: measure the identity without recording it as seen).

    Raises:
        ValueError: no base URL or no model (names the config key and the environment variable).
        FileNotFoundError, ValueError: a template file that is missing or lacks a placeholder.
    """

    backend = "openai"

    def __init__(self, config: JudgeConfig, *, record_identity: bool = True):
        self.config = config
        self.template = load_template(config.template)
        self.system_prompt = SYSTEM_PROMPT if config.system_prompt is None else config.system_prompt
        probe = [m for p in load_probe_pairs() for m in (self.messages(p["prompt"], p["response_a"], p["response_b"]),
                                                         self.messages(p["prompt"], p["response_b"], p["response_a"]))]
        self.chat = ChatClient(config, namespace="pairwise", probe=probe, extra_identity={
            "backend": "openai", "template_sha256": json_hash({"system": self.system_prompt, "user": self.template})},
            record_identity=record_identity)
        self.base_url, self.model = self.chat.base_url, self.chat.model

    @property
    def requests_sent(self) -> int:  # type: ignore[override]
        return self.chat.requests_sent

    @property
    def max_in_flight(self) -> int:
        """The most requests this judge had in flight at once (at most ``max_concurrency``)."""
        return self.chat.max_in_flight

    def identity(self) -> dict[str, Any]:
        """``ChatClient.identity``: backend, endpoint, model and listing, decoding, template hash, probe (resolved
        from the server on first use; see the module docstring)."""
        return self.chat.identity()

    def identity_report(self) -> dict[str, Any]:
        self.identity()
        return {"identity_check": self.chat.identity_check, "probe_requests_sent": self.chat.probe_requests_sent,
                "probe_answers": self.chat.probe_answers}

    def messages(self, prompt: Any, output_1: str, output_2: str) -> list[dict]:
        """The chat messages asking which of ``output_1`` / ``output_2`` answers ``prompt`` better."""
        msgs = [{"role": "user", "content": fill(self.template, prompt_text(prompt), output_1, output_2)}]
        if self.system_prompt:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def judge(self, prompts, responses_a, responses_b, ids=None) -> list[Judgment]:
        """Both orders per item (A first, then B first), cached answers reused; n Judgments (see ``combine``)."""
        check_lengths(prompts, responses_a, responses_b, ids)
        asks = []
        for p, a, b in zip(prompts, responses_a, responses_b):
            asks += [self.messages(p, a, b), self.messages(p, b, a)]
        answers = self.chat.complete_many(asks)
        return [combine(answers[2 * i], answers[2 * i + 1]) for i in range(len(prompts))]
