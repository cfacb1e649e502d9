"""The refusal rules and label convention, re-exported for the gate modules: they live in ``judging.refusal_rules``
(shared with online RL's tripwires, which a stage could not import from here)."""

from judging.refusal_rules import (  # noqa: F401  (re-exported)
    REFUSAL_LABELS,
    XSTEST_LABELS,
    RefusalLabel,
    _first_sentences,
    _norm,
    classify_refusal,
    is_refusal,
    xstest_strmatch_label,
)
