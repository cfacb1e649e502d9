"""Shared fixtures: the tiny model (2 layers, SmolLM2 tokenizer) built once per machine and cached."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from rlhf.models import resolve_base_model

    return resolve_base_model("tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
