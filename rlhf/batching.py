"""Padding-aware batch plans for inference (gate generation, reward-model scoring): which length-sorted prompts
share a forward pass.

A fixed batch of 64 pads every row to the batch's longest prompt. On a CPU, prefill costs the same per token at
batch 16 as at 64 (about 400 prompt tokens/s for the 135M model on 2 cores), so padding is paid in full, while a
decode step costs a fixed ~120 ms plus ~3 ms a row: big batches pay off in decoding, small ones in prefill. Measured
on the demo's capability prompts (89-301 tokens, 16 new tokens): one batch of 64 took 69 s, four of 16 took 33 s
(``benchmarks/generation.py --suites``). The plan below minimises the modelled cost of a contiguous split of the
length-sorted prompts instead of cutting every ``batch_size`` rows.

Cost model (in prefill-token equivalents, so only one ratio is device-specific): a batch of ``n`` rows whose longest
prompt has ``L`` tokens costs ``n·L`` (its padded prefill) plus ``steps·overhead`` (one forward per decode step plus
the prefill forward, each a fixed cost of ``overhead`` tokens' worth of prefill). The per-row share of a decode step
is the same whatever the split (every row is decoded once per step), so it drops out. The plan is deterministic
(no timing enters it), so the same prompts always go in the same batches and a rerun reproduces its outputs bit for
bit.
"""

from __future__ import annotations

#: Fixed cost of one forward pass, in prompt tokens of prefill, per device type. CPU: ~120 ms a decode step over
#: ~2.5 ms a prefill token (135M model, 2 cores, fp32; ``benchmarks/generation.py --suites``). CUDA: a decode step
#: is launch-bound (~10-20 ms) while prefill runs ~10^5 tokens/s, so a forward is worth thousands of prompt tokens
#: and the plan fills batches to the cap.
FORWARD_OVERHEAD_TOKENS = {"cpu": 48, "cuda": 4096}


def forward_overhead_tokens(device) -> int:
    """:data:`FORWARD_OVERHEAD_TOKENS` for a torch device (or its type string); unknown types use the CUDA figure."""
    kind = getattr(device, "type", str(device)).split(":")[0]
    return FORWARD_OVERHEAD_TOKENS.get(kind, FORWARD_OVERHEAD_TOKENS["cuda"])


def plan_batches(lengths: list[int], max_batch: int, forwards: int, overhead_tokens: int) -> list[tuple[int, int]]:
    """Split prompts already sorted longest first into contiguous batches of at most ``max_batch``, minimising
    ``sum(n_b · L_b) + n_batches · forwards · overhead_tokens`` (module docstring), by dynamic programming over the
    split points (O(len · max_batch)).

    Args:
        lengths: token counts, non-increasing (the caller sorts; each batch's first row is its longest).
        max_batch: largest batch (memory cap, ``rlhf.machine.auto_batch_size``), >= 1.
        forwards: forward passes a batch makes: ``max_new_tokens + 1`` for generation, 1 for scoring.
        overhead_tokens: fixed cost of a forward in prompt tokens (:func:`forward_overhead_tokens`).

    Returns:
        ``[(start, end), ...]`` half-open slices covering ``range(len(lengths))`` in order; ties go to fewer,
        larger batches.

    Raises:
        ValueError: ``max_batch`` < 1, or ``lengths`` increases somewhere (names the position).
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    for i in range(1, len(lengths)):
        if lengths[i] > lengths[i - 1]:
            raise ValueError(f"lengths must be sorted longest first: position {i} has {lengths[i]} > {lengths[i - 1]}")
    n = len(lengths)
    fixed = forwards * overhead_tokens
    best = [0.0] + [float("inf")] * n  # best[i]: cheapest plan of the first i prompts
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(max(0, end - max_batch), end):
            cost = best[start] + (end - start) * lengths[start] + fixed
            if cost < best[end] or (cost == best[end] and start < cut[end]):
                best[end], cut[end] = cost, start
    plan, end = [], n
    while end > 0:
        plan.append((cut[end], end))
        end = cut[end]
    return plan[::-1]


def attention_break_even_tokens(model) -> float:
    """Context length at which one token's attention costs as much as its linear layers, for a decoder LM:
    ``K = N_lin / (2 · layers · heads · head_dim)``, where ``N_lin`` is the parameters outside the embedding and
    the LM head (a prefill scores only its last position). Per token, the linear layers cost ``2·N_lin`` FLOPs and
    attention ``4 · layers · heads · head_dim`` per key it attends to (``QKᵀ`` and ``PV``, 2 FLOPs a multiply-add;
    Kaplan et al. 2020, table 1). SmolLM2-135M: about 3,100 tokens.

    Raises:
        ValueError: the config names no layer count or hidden size (not a decoder LM).
    """
    cfg = model.config.get_text_config(decoder=True)
    layers, hidden = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "hidden_size", None)
    if not layers or not hidden:
        raise ValueError(f"{type(model).__name__}: config has no num_hidden_layers / hidden_size")
    heads = getattr(cfg, "num_attention_heads", None)
    width = heads * (getattr(cfg, "head_dim", None) or hidden // heads) if heads else hidden
    skip = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings())
            if m is not None and getattr(m, "weight", None) is not None}
    n_lin = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    return n_lin / (2 * layers * width)


def separate_prefill_pays(lengths: list[int], overhead_tokens: int, break_even: float) -> bool:
    """Whether prefilling each prompt of a batch alone (no padding, causal attention) costs less than one padded
    forward over all of them: ``Σ L_i · (1 + L_i / 2K) + n · overhead < (1 - margin) · n · W · (1 + W / K)``.

    In prefill-token equivalents (module docstring): a padded batch of ``n`` rows and width ``W`` runs its linear
    layers on ``n·W`` tokens and, with the padding masked, full ``W × W`` attention per row (a masked kernel cannot
    skip the causal half); alone, each row runs ``L_i`` tokens and half of ``L_i × L_i``, but pays a forward's fixed
    cost. ``K`` = :func:`attention_break_even_tokens`. The margin (10%) keeps batches whose saving is within the
    model's error padded; the rule reads only token counts, so the same prompts always prefill the same way.
    Measured on the demo's consistency probes (16 rows of 1,299-1,883 tokens, 135M model, 2 cores, fp32): padded
    36 s, alone 22 s, answers identical.

    Args:
        lengths: the batch's prompt lengths in tokens (each row keeps its last token for the batched forward).
        overhead_tokens: a forward's fixed cost in prefill tokens (:func:`forward_overhead_tokens`).
        break_even: ``K``, in tokens (> 0).
    """
    if len(lengths) < 2:
        return False
    n, width = len(lengths), max(lengths)
    padded = n * width * (1 + width / break_even)
    alone = sum(L * (1 + L / (2 * break_even)) for L in lengths) + n * overhead_tokens
    return alone < 0.9 * padded
