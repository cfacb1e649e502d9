"""Judging below the stages: score (prompt, response) pairs with a Bradley-Terry reward model, in batches, and
the one parser that turns a judge's verdict or two scores into an expert-convention label (``data.labels``).

Used by the reward-model stage (held-out agreement), the gate stage (the judge) and PPO (the reward), so the
three score exactly alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from data.labels import FIRST, SECOND, TIE, UNPARSED, scores_to_label

_VERDICTS = {"1": FIRST, "2": SECOND, "0": TIE, "tie": TIE}


def parse_judge_verdict(raw: Any) -> int:
    """Map one judge output to a label: '1' -> 1, '2' -> 2, '0' / 'Tie' -> 0, anything else -> -1 (``UNPARSED``).

    PandaLM's gpt-3.5-turbo file holds '1', '2', 'Tie' and unparsed strings such as 'garbage'.
    """
    return _VERDICTS.get(str(raw).strip().lower(), UNPARSED)


def verdicts_from_scores(score_first: Any, score_second: Any) -> np.ndarray:
    """A scoring judge's verdicts: the side with the higher score wins, equal scores are a tie.

    Args:
        score_first, score_second: float arrays, shape (n,), e.g. reward-model scores of each pair's two responses.

    Returns:
        int64 array, shape (n,), values in {0 tie, 1 first better, 2 second better}.

    Raises:
        ValueError: the shapes differ.
    """
    return scores_to_label(score_first, score_second)


def render(tokenizer, prompt: list[dict] | str, response: str) -> str:
    """Chat-template render of a prompt (messages or a user string) followed by one assistant response."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return tokenizer.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)


def score(
    model,
    tokenizer,
    prompts: list,
    responses: list[str],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    desc: str = "scoring",
    shard: bool = False,
    planned: bool = False,
) -> np.ndarray:
    """Reward of each (prompt, response).

    Args:
        model: an ``AutoModelForSequenceClassification`` with ``num_labels=1`` (put in eval mode here).
        prompts: chat messages or user strings, one per response.
        responses: assistant responses, same length as ``prompts``.
        shard: in a multi-process launch, each process scores a contiguous share of the (length-sorted) texts and
            every process gets all scores in input order (``rlhf.distributed.map_sharded``); every process must call
            with the same inputs. False: this process scores everything (PPO, where each rank has its own).
        planned: batches of at most ``batch_size`` texts sorted by token count, split where padding would cost
            more than another forward pass (``rlhf.batching.plan_batches``, one forward a batch): a single batch of
            texts from 62 to 256 tokens pads a third of its tokens. The plan reads token counts only, so the same
            texts always share the same batches. False: every ``batch_size`` texts, sorted by characters.

    Returns:
        float64 array of shape ``(len(responses),)``: the score head's output at the last non-pad token.

    Raises:
        ValueError: the two lists differ in length.
    """
    import torch
    from tqdm.auto import tqdm

    from rlhf.batching import forward_overhead_tokens, plan_batches
    from rlhf.distributed import map_sharded

    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    model.eval()
    texts = [render(tokenizer, p, r) for p, r in zip(prompts, responses)]
    tokenizer.padding_side = "right"
    # Truncate from the left so the response end (where the score is read) is always kept. Tokenized once: the plan
    # reads these counts and each batch pads these ids.
    tokenizer.truncation_side = "left"
    ids = (tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=False)["input_ids"]
           if texts else [])
    # Longest first keeps padding small; the original order is restored below.
    order = np.argsort([-len(i) for i in ids] if planned else [-len(t) for t in texts], kind="stable")

    def run(idx_all: list[int]) -> list[float]:
        done: list[float] = []
        if planned:
            spans = plan_batches([len(ids[i]) for i in idx_all], batch_size, 1, forward_overhead_tokens(model.device))
        else:
            spans = [(s, min(s + batch_size, len(idx_all))) for s in range(0, len(idx_all), batch_size)]
        for start, end in tqdm(spans, desc=desc, disable=len(spans) <= 1):
            enc = tokenizer.pad({"input_ids": [ids[i] for i in idx_all[start:end]]}, return_tensors="pt")
            enc = enc.to(model.device)
            with torch.no_grad():
                done.extend(model(**enc).logits[:, 0].float().cpu().tolist())
        return done

    # Data parallel when ``shard`` : each process scores a contiguous share of the sorted order.
    out = np.empty(len(texts), dtype=np.float64)
    out[order] = np.asarray(map_sharded(run, [int(i) for i in order], shard=shard), dtype=np.float64)
    return out


def load_reward_model(path: str, new_head: bool = False, dtype=None, trained: bool = False):
    """Load a reward model (sequence classifier, 1 label) with its pad token set (pad == eos on SmolLM2).

    ``new_head``: the checkpoint is a causal LM and the ``score`` head is created here (seed it first); any other
    missing weight is refused (``rlhf.weights.load_checked``), and so is a missing head when ``new_head`` is off.
    ``dtype``: the weights' dtype; default ``torch.float32`` whatever the checkpoint was saved in (scores decide
    ties and agreement; the training stage passes its master-weight dtype). ``trained``: the caller trains it
    (``rlhf.weights.load_checked``'s ``trained``).

    Returns:
        (model, tokenizer).

    Raises:
        rlhf.weights.IncompleteCheckpoint: weights missing from the checkpoint, named.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhf.weights import load_checked

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_checked(
        AutoModelForSequenceClassification,
        path,
        what="reward model start" if new_head else "reward model",
        new_heads=["score"] if new_head else [],
        num_labels=1,
        dtype=torch.float32 if dtype is None else dtype,
        trained=trained,
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def score_pairs(model, tokenizer, pairs, batch_size: int, max_length: int,
                planned: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Scores of (first, second) responses of each pair: two float arrays of shape ``(len(pairs),)``.

    ``pairs``: ``data.schemas.PreferencePair``-like objects (``prompt`` messages, ``chosen`` first, ``rejected``
    second). ``planned``: :func:`score`'s padding-aware batches.
    """
    prompts = [[m.model_dump() for m in p.prompt] for p in pairs]
    # Both sides in one call: one length sort over all 2n texts, so every batch is full and evenly padded.
    both = score(model, tokenizer, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                 batch_size=batch_size, max_length=max_length, desc="scoring pairs", planned=planned)
    return both[: len(pairs)], both[len(pairs):]


def check_reload_scores(
    checkpoint: str,
    tokenizer,
    first: np.ndarray,
    second: np.ndarray,
    pairs,
    batch_size: int,
    max_length: int,
    *,
    n: int = 8,
    tolerance: float = 1e-3,
    planned: bool = False,
) -> float:
    """Reload ``checkpoint`` and check that it reproduces the live model's scores on the first ``n`` pairs (the
    "random score head after a LoRA reload" pitfall).

    Args:
        checkpoint: saved reward-model directory.
        tokenizer: the live model's tokenizer (the reload is scored with it).
        first, second: the live model's scores of ``pairs`` (``score_pairs``), shape (len(pairs),).
        tolerance: largest allowed absolute score difference (batches other than the live scoring's move a
            score in its last float32 bits only).
        planned: :func:`score`'s padding-aware batches.

    Returns:
        the largest absolute difference (score units).

    Raises:
        RuntimeError: the difference exceeds ``tolerance`` (names the checkpoint).
    """
    reloaded, _ = load_reward_model(str(checkpoint))
    r_first, r_second = score_pairs(reloaded, tokenizer, pairs[:n], batch_size, max_length, planned=planned)
    dev = float(np.max(np.abs(np.concatenate([r_first - first[: len(r_first)], r_second - second[: len(r_second)]]))))
    if dev > tolerance:
        raise RuntimeError(
            f"{checkpoint}: reloaded reward model gives different scores (max |diff| {dev:.4g}); "
            "was the score head saved?"
        )
    return dev


def check_score_head(path: str) -> None:
    """Refuse a reward-model checkpoint without a trained score head (it would load with a random one).

    Raises:
        ValueError: no ``score.weight`` tensor in the checkpoint's safetensors files.
    """
    from pathlib import Path

    from safetensors import safe_open

    for f in Path(path).glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            if any(k.endswith("score.weight") for k in st.keys()):
                return
    raise ValueError(
        f"{path}: no score head (score.weight) in the checkpoint; the judge must be a trained reward "
        "model (a reward_model stage directory), not a causal LM that would get a random head"
    )
