"""On-policy responses for the annotation export: sampled from the current policy (the tiny model)."""

from __future__ import annotations

from flywheel.responses import PolicySampler


def test_policy_sampler_returns_distinct_samples(tiny_model_dir):
    sampler = PolicySampler(tiny_model_dir, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=0)
    messages = [{"role": "user", "content": "How do I boil an egg?"}]
    out = sampler.sample(messages, 3)
    assert 1 <= len(out) <= 3 and all(isinstance(t, str) and t.strip() for t in out)
    assert len(set(out)) > 1  # sampling, not greedy: a random 2-layer model does not repeat itself
    # Same seed, same samples (the export is reproducible).
    again = PolicySampler(tiny_model_dir, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=0).sample(messages, 3)
    assert again == out
