"""SFT row checks: every example ends in a labelled EOS; prefix, double-BOS and length pitfalls are refused."""

from __future__ import annotations

import pytest
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from data.schemas import Conversation, Message
from data.validation import DataValidationError
from sft.prepare import check_row, prepare_sft_rows
from sft.style_audit import audit_style, opener


def conv(i, *turns):
    roles = ["user", "assistant"] * len(turns)
    return Conversation(id=f"c{i}", messages=[Message(role=r, content=t) for r, t in zip(roles, turns)])


def test_rows_become_prompt_completion_and_end_in_eos(tokenizer):
    prepared = prepare_sft_rows([conv(0, "hi", "hello"), conv(1, "a", "b", "c", "d")], tokenizer, 256, file="x.jsonl")
    assert [r["id"] for r in prepared.rows] == ["c0", "c1"]
    assert prepared.rows[1]["completion"] == [{"role": "assistant", "content": "d"}]
    assert [m["content"] for m in prepared.rows[1]["prompt"]] == ["a", "b", "c"]
    assert not prepared.rejects


def test_trl_labels_the_final_eos_even_though_pad_equals_eos(tokenizer, tiny_model_dir, tmp_path):
    # SmolLM2: pad == eos == <|im_end|>. The final <|im_end|> must carry a real label (completion_mask 1).
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    prepared = prepare_sft_rows([conv(0, "What is 2+2?", "4")], tokenizer, 256, file="x")
    trainer = SFTTrainer(model=tiny_model_dir, args=SFTConfig(output_dir=str(tmp_path), report_to=[], bf16=False,
                                                                max_length=256, use_cpu=True),
                         train_dataset=Dataset.from_list(prepared.rows), processing_class=tokenizer)
    row = trainer.train_dataset[0]
    ids, labels = row["input_ids"], row["labels"]
    last_eos = max(i for i, t in enumerate(ids) if t == tokenizer.eos_token_id)
    assert labels[last_eos] == tokenizer.eos_token_id  # the end-of-turn token is trained on
    assert tokenizer.decode([t for t in labels if t != -100]) == "4<|im_end|>\n"  # assistant tokens only
    # After collation with padding (pad == eos), the real EOS keeps its label: padding is masked by position.
    batch = trainer.data_collator([row, trainer.train_dataset[0] | {"input_ids": ids[:5], "labels": labels[:5]}])
    assert batch["labels"][0, last_eos].item() == tokenizer.eos_token_id
    assert (batch["labels"][1, 5:] == -100).all()


def test_over_length_rows_drop_oldest_turns_never_the_final_eos(tokenizer):
    long = "word " * 60
    prepared = prepare_sft_rows([conv(0, long, long, long, "short answer")], tokenizer, 100, file="x")
    assert prepared.n_prompt_turns_dropped == 1
    assert [m["content"] for m in prepared.rows[0]["prompt"]] == [long]


def test_final_reply_longer_than_max_length_is_an_error_naming_the_row(tokenizer):
    prepared = prepare_sft_rows([conv(0, "q", "ok"), conv(1, "q", "word " * 300)], tokenizer, 64, file="demo.jsonl")
    assert len(prepared.rows) == 1 and len(prepared.rejects) == 1
    err = prepared.rejects[0]
    assert (err.file, err.row, err.field) == ("demo.jsonl", 1, "messages")
    assert "max_length 64" in err.reason and "c1" in err.reason


def test_double_bos_is_refused(tokenizer):
    class DoubleBos:
        """A tokenizer whose template emits BOS and whose encoding adds another."""

        bos_token_id, eos_token_id, eos_token = 1, tokenizer.eos_token_id, tokenizer.eos_token

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            return "<|im_start|>" + tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1] + tokenizer(text, add_special_tokens=False)["input_ids"]}

        def decode(self, ids):
            return tokenizer.decode(ids)

    with pytest.raises(DataValidationError, match="double BOS"):
        check_row(DoubleBos(), [{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a"}], 256,
                  file="f", row=3)


def test_prompt_not_a_prefix_is_refused(tokenizer):
    class Reordering:
        bos_token_id, eos_token_id, eos_token = None, tokenizer.eos_token_id, tokenizer.eos_token

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
            return text if add_generation_prompt else "X" + text  # full render gains a leading token

        def __call__(self, text, add_special_tokens=False):
            return tokenizer(text, add_special_tokens=False)

        def decode(self, ids):
            return tokenizer.decode(ids)

    with pytest.raises(DataValidationError, match="not a token prefix") as exc:
        check_row(Reordering(), [{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a"}], 256,
                  file="f.jsonl", row=7)
    assert exc.value.row == 7 and exc.value.file == "f.jsonl"


def test_style_audit_flags_a_dominant_opener():
    replies = ["Sure! Here's a poem"] * 3 + ["The answer is 4", "No."]
    audit = audit_style(replies, max_opener_share=0.5)
    assert audit.top_openers[0] == ("sure here's a", 3, 0.6)
    assert not audit.passed and "60.0%" in audit.message
    assert audit_style(replies, max_opener_share=0.6).passed
    assert opener("  Hello, World! again and again") == "hello world again"
    with pytest.raises(ValueError):
        audit_style([])
