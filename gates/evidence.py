"""Evidence checks that concern the comparison as a whole, not one gate.

Each gate states and checks its own minimum evidence in its module (``win_rate_evidence``,
``intent_evidence``, ``probe_evidence``, the judge-agreement interval rule); what lives here is the
check that the comparison itself means something: a candidate compared with itself measures
nothing, and every win rate comes out at exactly 50%.
"""

from __future__ import annotations


def check_distinct_models(baseline_hash: str, candidate_hash: str, *, allow_same_model: bool = False) -> None:
    """Refuse a gates run whose candidate is the baseline (same content hash).

    Args:
        baseline_hash, candidate_hash: content hashes of the two checkpoints (``rlhf.hashing.content_hash``).
        allow_same_model: explicit opt-in (config ``allow_same_model: true``), e.g. to measure the
            gates' own noise floor on a model against itself.

    Raises:
        ValueError: the hashes are equal and ``allow_same_model`` is false, naming the hash and the switch.
    """
    if baseline_hash == candidate_hash and not allow_same_model:
        raise ValueError(
            f"candidate and baseline are the same model (content hash {baseline_hash[:16]}...): the gates would "
            "compare a model with itself (every win rate exactly 50%, nothing measured). Pass a different "
            "candidate, or set allow_same_model: true to run it on purpose"
        )
