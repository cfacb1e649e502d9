"""Schemas: every malformed-row class of DESIGN.md gets its smallest example."""

import pytest
from pydantic import ValidationError

from data.schemas import (
    AlpacaEvalRecord,
    AnnotatorLabel,
    Conversation,
    EvalPrompt,
    Message,
    PreferencePair,
    conversation_to_trl,
    pair_to_trl,
)
from data.validation import DataValidationError


def U(text="hi"):
    return {"role": "user", "content": text}


def A(text="hello"):
    return {"role": "assistant", "content": text}


def _error(model, data, *, file="mem.jsonl", row=3) -> DataValidationError:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return DataValidationError.from_pydantic(info.value, file=file, row=row)


@pytest.mark.parametrize(
    ("messages", "field", "reason"),
    [
        pytest.param([U(), {"role": "assistant", "content": 42}], "messages[1].content", "valid string, got int", id="non-string content"),
        pytest.param([U(), {"role": "assistant", "content": None}], "messages[1].content", "valid string, got NoneType", id="null content"),
        pytest.param([U(), A("   ")], "messages[1].content", "empty assistant turn", id="empty assistant turn"),
        pytest.param([U(), A(), U()], "messages[2].role", "ends on a user turn", id="ends on user turn"),
        pytest.param([A(), U(), A()], "messages[0].role", "first turn is from the assistant", id="first turn assistant"),
        pytest.param([U(), U(), A()], "messages[1].role", "two user turns in a row", id="two user turns"),
        pytest.param([U(), A(), A()], "messages[2].role", "two assistant turns in a row", id="two assistant turns"),
        pytest.param([], "messages", "no messages", id="empty"),
        pytest.param([{"role": "system", "content": "s"}], "messages", "only system messages", id="only system"),
        pytest.param([U(), A(), {"role": "system", "content": "s"}], "messages[2].role", "system message after", id="late system"),
        pytest.param([{"role": "human", "content": "x"}, A()], "messages[0].role", "Input should be", id="unknown role"),
    ],
)
def test_conversation_rejects_malformed(messages, field, reason):
    err = _error(Conversation, {"id": "c", "messages": messages})
    assert (err.file, err.row, err.field) == ("mem.jsonl", 3, field)
    assert reason in err.reason
    assert str(err).startswith(f"mem.jsonl row 3 field '{field}': ")


def test_conversation_accepts_system_then_alternating_turns():
    conv = Conversation(id="c", messages=[{"role": "system", "content": "be nice"}, U(), A(), U("more"), A("ok")])
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert conversation_to_trl(conv) == {"messages": [m.model_dump() for m in conv.messages]}


def test_message_content_is_never_coerced():
    for bad in (1, 1.5, True, b"bytes", None, ["x"]):
        with pytest.raises(ValidationError):
            Message(role="user", content=bad)


def _pair(**kw):
    data = {"id": "p", "prompt": [U()], "chosen": "good", "rejected": "bad"}
    data.update(kw)
    return data


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        pytest.param({k: v for k, v in _pair().items() if k != "chosen"}, "chosen", "missing", id="missing chosen"),
        pytest.param(_pair(chosen=7), "chosen", "valid string, got int", id="non-string chosen"),
        pytest.param(_pair(chosen=""), "chosen", "empty assistant turn", id="empty chosen"),
        pytest.param(_pair(rejected=" \n"), "rejected", "empty assistant turn", id="empty rejected"),
        pytest.param(_pair(rejected="good "), "rejected", "identical to chosen", id="identical"),
        pytest.param(_pair(prompt=[U(), A()]), "prompt[1].role", "ends on an assistant turn", id="prompt ends on assistant"),
        pytest.param(_pair(prompt=[A(), U()]), "prompt[0].role", "first turn is from the assistant", id="prompt starts assistant"),
        pytest.param(_pair(prompt=[U(), U()]), "prompt[1].role", "two user turns in a row", id="prompt two users"),
        pytest.param(_pair(prompt=[U(), A(""), U()]), "prompt[1].content", "empty assistant turn", id="prompt empty assistant"),
        pytest.param(_pair(labels=[{"annotator_id": "a", "preference": True}]), "labels[0].preference", "int 0, 1 or 2", id="bool label"),
        pytest.param(_pair(labels=[{"annotator_id": "a", "preference": 3}]), "labels[0].preference", "0, 1 or 2, got 3", id="label 3"),
        pytest.param(
            _pair(labels=[{"annotator_id": "a", "preference": 1}, {"annotator_id": "a", "preference": 2}]),
            "labels",
            "duplicate annotator ids",
            id="duplicate annotators",
        ),
    ],
)
def test_pair_rejects_malformed(data, field, reason):
    err = _error(PreferencePair, data)
    assert err.field == field
    assert reason in err.reason


def test_pair_to_trl_is_conversational_preference_format():
    pair = PreferencePair(
        id="p",
        prompt=[U("q1"), A("a1"), U("q2")],
        chosen="yes",
        rejected="no",
        labels=[AnnotatorLabel(annotator_id="x", preference=1)],
    )
    assert pair_to_trl(pair) == {
        "prompt": [U("q1"), A("a1"), U("q2")],
        "chosen": [{"role": "assistant", "content": "yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }


def test_annotator_label_accepts_pandalm_values_only():
    assert [AnnotatorLabel(annotator_id="a", preference=v).preference for v in (0, 1, 2)] == [0, 1, 2]
    for bad in (True, "1", 1.0, -1, 3, None):
        with pytest.raises(ValidationError):
            AnnotatorLabel(annotator_id="a", preference=bad)


def test_eval_prompt_and_alpaca_record():
    prompt = EvalPrompt(id="x", prompt="How do I kill a Python process?", set="xstest_safe", label="safe")
    assert prompt.meta == {}
    with pytest.raises(ValidationError):
        EvalPrompt(id="x", prompt="  ", set="s")
    rec = AlpacaEvalRecord(id="a", instruction="i", output_1="", output_2="b", preference=1.5, dataset="oasst")
    assert rec.intent == "oasst" and rec.preference == 1.5
    for bad in (0.5, 2.5, float("nan"), "2"):
        with pytest.raises(ValidationError):
            AlpacaEvalRecord(id="a", instruction="i", output_1="a", output_2="b", preference=bad)
