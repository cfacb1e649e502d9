"""Intents for prompts that carry none: an embedding-based classifier (for the per-intent matrix).

Prompts from the data's own categories (AlpacaEval ``dataset``, MT-bench ``category``, PandaLM
``motivation_app``) keep their labels. Unlabelled prompts (production traffic, your own eval set) get the intent
of a classifier fitted on labelled ones: sentence embeddings = mean-pooled last hidden states of a local causal
LM (the round's own SFT checkpoint works, so nothing is downloaded), then scikit-learn's multinomial logistic
regression. Its held-out accuracy is reported next to the labels it produced, so a weak classifier is visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split


@torch.no_grad()
def embed(model, tokenizer, texts: Sequence[str], *, batch_size: int = 16, max_length: int = 256) -> np.ndarray:
    """Mean-pooled last hidden state over real (non-pad) tokens.

    Returns:
        float32 array of shape ``(len(texts), hidden_size)``, rows L2-normalised.
    """
    model.eval()
    tokenizer.padding_side = "right"
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            list(texts[start : start + batch_size]),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        ).to(model.device)
        hidden = model(**enc, output_hidden_states=True).hidden_states[-1]
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size), dtype=np.float32)


@dataclass
class IntentClassifier:
    """A fitted classifier and its held-out accuracy (fraction) on ``n_test`` labelled prompts."""

    model: LogisticRegression
    held_out_accuracy: float
    n_train: int
    n_test: int
    labels: list[str]

    def predict(self, embeddings: np.ndarray) -> list[str]:
        return [str(x) for x in self.model.predict(embeddings)]


def fit_intent_classifier(
    embeddings: np.ndarray, intents: Sequence[str], *, test_size: float = 0.25, seed: int = 0, C: float = 10.0
) -> IntentClassifier:
    """Fit on labelled prompts, report accuracy on a stratified held-out split, then refit on all of them.

    Raises:
        ValueError: fewer than two intents, or an intent with fewer than 2 prompts (no stratified split).
    """
    y = np.asarray(intents, dtype=object)
    labels, counts = np.unique(y, return_counts=True)
    if len(labels) < 2:
        raise ValueError(f"need prompts of at least two intents, got {list(labels)}")
    if counts.min() < 2:
        raise ValueError(f"intent {labels[counts.argmin()]!r} has {counts.min()} prompt(s); need at least 2 each")
    x_tr, x_te, y_tr, y_te = train_test_split(embeddings, y, test_size=test_size, random_state=seed, stratify=y)
    held_out = LogisticRegression(C=C, max_iter=2000).fit(x_tr, y_tr)
    accuracy = float((held_out.predict(x_te) == y_te).mean())
    final = LogisticRegression(C=C, max_iter=2000).fit(embeddings, y)
    return IntentClassifier(final, accuracy, len(y_tr), len(y_te), [str(label) for label in labels])
