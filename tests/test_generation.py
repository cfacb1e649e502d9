"""rlhf/generation.py: prompts over the budget lose content, never the chat template (TRL #3644)."""

from __future__ import annotations

import pytest

from rlhf.generation import TRUNCATION_MARKER, chat_prompt, fit_prompt, generate, generate_report

INSTRUCTION_END = "Now answer in one sentence: which city is named in the last line?"


def _n(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt_of(tokenizer, n_tokens: int) -> str:
    """A user prompt whose rendered chat prompt is exactly ``n_tokens`` tokens (1,253: over the 512 default)."""
    words = 10
    while True:
        content = "Context: " + " ".join(f"item{i}" for i in range(words)) + " Paris. " + INSTRUCTION_END
        n = _n(tokenizer, chat_prompt(tokenizer, content))
        if n >= n_tokens:
            break
        words += max(1, (n_tokens - n) // 3)
    while n > n_tokens:  # trim single characters off the first word until it is exact
        content = content.replace("Context: ", "Context:", 1) if "Context: " in content else content[:9] + content[10:]
        n = _n(tokenizer, chat_prompt(tokenizer, content))
    assert n == n_tokens, n
    return content


def test_a_1253_token_prompt_keeps_its_template_and_the_end_of_the_instruction(tokenizer):
    content = _prompt_of(tokenizer, 1253)
    rendered = chat_prompt(tokenizer, content)
    # the old behaviour: the last 512 tokens of the render, which start inside the content
    left_cut = tokenizer.decode(tokenizer(rendered, add_special_tokens=False)["input_ids"][-512:])
    assert "<|im_start|>user" not in left_cut and "<|im_start|>system" not in left_cut

    fitted, cut = fit_prompt(tokenizer, content, 512)
    assert cut is True
    assert _n(tokenizer, fitted) <= 512
    assert fitted.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nContext:" in fitted  # the user header and the start of the content
    assert fitted.endswith(INSTRUCTION_END + "<|im_end|>\n<|im_start|>assistant\n")
    assert fitted.count(TRUNCATION_MARKER.strip()) == 1
    # nothing longer than the budget is touched
    short, cut = fit_prompt(tokenizer, "What is 2 + 2?", 512)
    assert (short, cut) == (chat_prompt(tokenizer, "What is 2 + 2?"), False)


def test_multi_turn_prompts_cut_the_longest_message(tokenizer):
    long = "Background: " + " ".join(f"x{i}" for i in range(900)) + " END-OF-FIRST"
    msgs = [{"role": "user", "content": long}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": INSTRUCTION_END}]
    fitted, cut = fit_prompt(tokenizer, msgs, 300)
    assert cut and _n(tokenizer, fitted) <= 300
    assert fitted.count("<|im_start|>user") == 2 and "<|im_start|>assistant\nNoted.<|im_end|>" in fitted
    assert "END-OF-FIRST" in fitted and fitted.endswith(INSTRUCTION_END + "<|im_end|>\n<|im_start|>assistant\n")


def test_a_budget_below_the_template_is_an_error(tokenizer):
    template = _n(tokenizer, chat_prompt(tokenizer, ""))
    with pytest.raises(ValueError, match=f"chat template \\({template} tokens"):
        fit_prompt(tokenizer, "word " * 100, template + 2)


def test_generate_reports_which_prompts_were_cut(tiny_model_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = [_prompt_of(tokenizer, 1253), "What is 2 + 2?"]
    texts, n, cut = generate_report(model, tokenizer, prompts, max_new_tokens=3, batch_size=2, max_prompt_length=512)
    assert cut == [True, False] and len(texts) == 2 and all(1 <= k <= 3 for k in n)
    # the plain wrapper gives the same answers; one at a time equals batched (left padding)
    assert generate(model, tokenizer, prompts, max_new_tokens=3, batch_size=2) == (texts, n)
    alone = generate(model, tokenizer, prompts[1:], max_new_tokens=3, batch_size=1)
    assert alone == ([texts[1]], [n[1]])
