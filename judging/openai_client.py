"""One client for OpenAI-compatible chat endpoints, shared by every judge that asks an LLM (the pairwise
``openai`` judge, and an LLM refusal grader such as XSTest's 3-class prompt in ``gates.refusal``).

``ChatClient(config).complete_many(list_of_messages)`` -> one answer text per message list, with:

* the endpoint, model and key from the config or the environment (``OPENAI_BASE_URL``, ``OPENAI_MODEL``,
  ``OPENAI_API_KEY`` or the variable ``config.api_key_env`` names; local servers take any key);
* retries on I/O errors only, through the ``openai`` client library (connection errors, timeouts, HTTP
  408/409/429/5xx; exponential backoff with jitter, the client's own), ``config.max_retries`` times; an answer is
  never retried for its content;
* at most ``config.max_concurrency`` requests in flight (a thread pool);
* the judge's identity resolved from the server on first use (``judging.identity``: endpoint without credentials,
  what ``GET /models`` reports, decoding, the owner's extra fields such as a template hash, and the answers to a
  fixed probe asked fresh at temperature 0), compared with the last identity seen under that endpoint and name
  (``identity_check``);
* every answer cached on disk under the sha256 of (that identity, the messages) (``judging.cache``), written as
  soon as it arrives: an unchanged judge's rerun sends zero judging requests, a crashed run resumes, and a judge
  that answers the probe differently (other weights under the same name) finds none of the other judge's answers;
* ``requests_sent``: every HTTP attempt to judge, retries included, counted at the transport; ``max_in_flight``;
  ``probe_requests_sent``: the identity's requests (the listing and the probe), counted apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from rlhf.credentials import env_secret

from .cache import JudgmentCache
from .identity import check_identity, probe_record, public_endpoint, served_model
from .judges import JudgeConfig, env_default

logger = logging.getLogger(__name__)


class _CountingTransport(httpx.BaseTransport):
    """An httpx transport that counts the requests it sends (every attempt, retries included) and the most it had
    in flight at once (``max_in_flight``)."""

    def __init__(self, inner: httpx.BaseTransport):
        self.inner, self.count, self._lock = inner, 0, threading.Lock()
        self.in_flight = self.max_in_flight = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.count += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            response = self.inner.handle_request(request)
            response.read()  # the body is in before the request stops counting as in flight
            return response
        finally:
            with self._lock:
                self.in_flight -= 1

    def close(self) -> None:
        self.inner.close()


class ChatClient:
    """Cached, retried, concurrency-limited chat completions (see the module docstring).

    Args:
        config: ``base_url``, ``model``, ``api_key_env``, ``max_tokens``, ``temperature``,
            ``max_concurrency``, ``max_retries``, ``timeout_s``, ``cache_dir``.
        namespace: sub-directory of the cache (e.g. ``pairwise``, ``refusal``).
        probe: the probe's message lists (``judging.identity``), asked fresh whenever the identity is resolved;
            empty: the identity rests on the endpoint, the listing and the settings alone.
        extra_identity: JSON-able fields the owner adds to the identity (e.g. ``backend``, ``template_sha256``).
        record_identity: compare the identity with the last one seen and record it (``identity_check``); False for
            a look that must not change what the next run reports (the flow's cache key).

    Raises:
        ValueError: no base URL or no model (names the config key and the environment variable).
    """

    def __init__(self, config: JudgeConfig, *, namespace: str = "chat", probe: Sequence[list[dict]] = (),
                 extra_identity: dict[str, Any] | None = None, record_identity: bool = True):
        import openai

        self.config, self.namespace = config, namespace
        self.probe_messages = [list(m) for m in probe]
        self.extra_identity, self.record_identity = dict(extra_identity or {}), record_identity
        self._identity: dict[str, Any] | None = None
        self._identity_lock = threading.Lock()
        #: after the identity is resolved: the probe's answers (in order) and ``judging.identity.check_identity``'s
        #: comparison with the last identity seen under this endpoint and name.
        self.probe_answers: list[str] | None = None
        self.identity_check: dict[str, Any] | None = None
        self.base_url = env_default(config.base_url, "OPENAI_BASE_URL")
        self.model = env_default(config.model, "OPENAI_MODEL")
        if not self.base_url:
            raise ValueError("judge.base_url: the openai backend needs an endpoint (or set OPENAI_BASE_URL)")
        if not self.model:
            raise ValueError("judge.model: the openai backend needs a model name (or set OPENAI_MODEL)")
        # read here and kept only in the client: the config holds the variable's name (rlhf/credentials.py)
        key = env_secret(config.api_key_env) or "EMPTY"  # local servers take any key
        self.cache = JudgmentCache(config.resolved_cache_dir() / namespace)
        self._transport = _CountingTransport(httpx.HTTPTransport())
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=key, max_retries=config.max_retries, timeout=config.timeout_s,
            http_client=httpx.Client(transport=self._transport, timeout=config.timeout_s),
        )
        # the identity's requests go through a client of their own, so requests_sent counts judging alone
        self._probe_transport = _CountingTransport(httpx.HTTPTransport())
        self._probe_client = openai.OpenAI(
            base_url=self.base_url, api_key=key, max_retries=config.max_retries, timeout=config.timeout_s,
            http_client=httpx.Client(transport=self._probe_transport, timeout=config.timeout_s),
        )

    @property
    def requests_sent(self) -> int:
        """HTTP requests sent so far (every attempt, retries included)."""
        return self._transport.count

    @property
    def max_in_flight(self) -> int:
        """The most requests in flight at once so far (at most ``max_concurrency``)."""
        return self._transport.max_in_flight

    @property
    def probe_requests_sent(self) -> int:
        """HTTP requests the identity sent (the model listing and the probe, retries included)."""
        return self._probe_transport.count

    def identity(self) -> dict[str, Any]:
        """Who answers (``judging.identity``): the owner's extra fields, ``endpoint`` (no credentials), ``model``,
        ``served`` (the listing), ``max_tokens``, ``temperature`` and ``probe`` (None without a probe). Resolved
        from the server once per client, on first use, and checked against the last identity seen
        (``identity_check``).

        Raises:
            RuntimeError: the server could not be reached, or a probe request failed after the retries.
        """
        with self._identity_lock:
            if self._identity is None:
                ident = {
                    **self.extra_identity, "endpoint": public_endpoint(self.base_url), "model": self.model,
                    "served": served_model(self._list_models(), self.model),
                    "max_tokens": self.config.max_tokens, "temperature": self.config.temperature,
                    "probe": self._probe() if self.probe_messages else None,
                }
                if self.record_identity:
                    self.identity_check = check_identity(self.config.resolved_cache_dir() / self.namespace, ident)
                self._identity = ident
            return self._identity

    def _list_models(self) -> list[dict[str, Any]] | None:
        """``GET /models`` as dicts (extra fields kept); None when the server has no such route (404/405)."""
        import openai

        try:
            return [m.model_dump() for m in self._probe_client.models.list()]
        except openai.APIStatusError as err:
            if err.status_code in (404, 405):
                return None
            raise RuntimeError(f"judge {public_endpoint(self.base_url)}: GET /models failed: {err}") from err
        except openai.APIError as err:
            raise RuntimeError(f"judge {public_endpoint(self.base_url)}: GET /models failed: {err}") from err

    def _probe(self) -> dict[str, Any]:
        """Ask the probe fresh (never cached) at temperature 0; ``judging.identity.probe_record`` of the answers."""
        import openai

        def ask(messages: list[dict]):
            try:
                return self._probe_client.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=self.config.max_tokens, temperature=0.0)
            except openai.APIError as err:
                raise RuntimeError(f"judge {public_endpoint(self.base_url)} model {self.model}: identity probe "
                                   f"failed after {self.config.max_retries} retries: {err}") from err

        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            responses = list(pool.map(ask, self.probe_messages))
        self.probe_answers = [r.choices[0].message.content or "" for r in responses]
        return probe_record(self.probe_messages, self.probe_answers, [getattr(r, "model", None) for r in responses],
                            [getattr(r, "system_fingerprint", None) for r in responses])

    def key(self, messages: list[dict]) -> str:
        return JudgmentCache.key({"identity": self.identity(), "messages": messages})

    def complete(self, messages: list[dict]) -> str:
        """One chat completion, uncached; the answer text ('' when the server sends no content).

        Raises:
            RuntimeError: the request failed after the retries (names the endpoint and model).
        """
        import openai

        try:
            resp = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
        except openai.APIError as err:
            raise RuntimeError(
                f"judge {public_endpoint(self.base_url)} model {self.model}: request failed after {self.config.max_retries} "
                f"retries: {err}"
            ) from err
        return resp.choices[0].message.content or ""

    def complete_many(self, messages_list: Sequence[list[dict]]) -> list[str]:
        """The answer to each message list, in order: cached ones read, the others asked (``max_concurrency`` at a
        time) and cached as each arrives.

        Raises:
            RuntimeError: a request failed after the retries (the answers that did arrive stay cached).
        """
        keys = [self.key(m) for m in messages_list]
        out: list[str | None] = [self.cache.get(k) for k in keys]
        todo = [i for i, v in enumerate(out) if v is None]
        if todo:
            logger.info("%s: %d of %d answers not cached; asking (%d at a time)", self.model, len(todo), len(keys),
                        self.config.max_concurrency)

            def run(i: int) -> tuple[int, str]:
                text = self.complete(messages_list[i])
                self.cache.put(keys[i], text)
                return i, text

            with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
                for i, text in pool.map(run, todo):
                    out[i] = text
        return out  # type: ignore[return-value]
