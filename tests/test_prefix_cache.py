"""rlhf/prefix_cache.py: shared prefixes and stored prompts are prefilled once, and answers do not change."""

from __future__ import annotations

import pytest
import torch

from rlhf.prefix_cache import PromptCache, batch_inputs, common_prefix_length


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_common_prefix_leaves_every_row_a_token_to_prefill():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 1  # the shorter row keeps its last token
    assert common_prefix_length([[5, 6, 7]]) == 0 and common_prefix_length([[1, 9], [2, 9]]) == 0


def test_a_shared_prefix_is_prefilled_once_and_laid_out_before_the_pads(model):
    prefix = list(range(1, 11))
    ids, mask, cache = batch_inputs(model, [prefix + [20], prefix + [30, 31]], pad_token_id=0)
    assert ids.tolist() == [prefix + [0, 20], prefix + [30, 31]]
    assert mask.tolist() == [[1] * 10 + [0, 1], [1] * 12]
    assert cache.get_seq_length() == 10 and cache.layers[0].keys.shape[0] == 2
    # under MIN_PREFIX_TOKENS shared tokens: plain left padding, no cache
    ids, mask, cache = batch_inputs(model, [[1, 2, 3, 4], [1, 2, 9]], pad_token_id=0)
    assert cache is None and ids.tolist() == [[1, 2, 3, 4], [0, 1, 2, 9]] and mask.tolist() == [[1] * 4, [0, 1, 1, 1]]


def test_stored_prompts_are_found_by_their_longest_prefix_and_laid_out_right_aligned(model):
    store = PromptCache(max_bytes=2**30)
    first, second = list(range(100, 120)), list(range(200, 212))
    _, mask, cache = batch_inputs(model, [first, second], pad_token_id=0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([first, [0] * 8 + second]), attention_mask=mask, use_cache=True)
    store.store_batch([first, second], mask, out.past_key_values)
    assert len(store.entries) == 2 and store.entries[1][1][0][0].shape[1] == 12  # pads not stored
    assert store.longest_prefix(first + [7, 8])[0] == 20
    assert store.longest_prefix(first[:5] + [1] * 10)[0] == 0  # 5 shared tokens < MIN_PREFIX_TOKENS
    assert store.longest_prefix(first)[0] == 19  # the last token is always prefilled
    ids, mask, cache = batch_inputs(model, [first + [7, 8, 9], second + [5]], pad_token_id=0, store=store)
    # lead = 20 cached positions (second's 12 right-aligned), then the rest: 3 and 1 tokens, left-padded to 3
    assert ids.tolist() == [first + [7, 8, 9], [0] * 8 + second + [0, 0, 5]]
    assert mask.tolist() == [[1] * 23, [0] * 8 + [1] * 12 + [0, 0, 1]]
    assert cache.get_seq_length() == 20
    torch.testing.assert_close(cache.layers[0].keys[1, :, 8:], store.entries[1][1][0][0])
    assert float(cache.layers[0].keys[1, :, :8].abs().sum()) == 0.0


def test_a_full_store_stops_storing():
    store = PromptCache(max_bytes=100)
    store.add(list(range(10)), [(torch.zeros(1, 10, 4), torch.zeros(1, 10, 4))])  # 320 bytes > 100
    assert store.entries == [] and store.bytes == 0


def test_answers_with_stored_prompts_equal_answers_without(model, tokenizer):
    """The flip probe's shape: first-turn questions, then conversations that repeat them. With the store the second
    turn prefills only its new tokens; every answer equals the plain batched one and the one-at-a-time one."""
    from rlhf.generation import generate_report

    questions = [f"Question {i}: which of (A) red or (B) blue is {w}?" for i, w in enumerate(["warm", "cold", "calm"])]
    store = PromptCache(max_bytes=2**30)
    first, _, _ = generate_report(model, tokenizer, questions, max_new_tokens=3, batch_size="auto",
                                  prompt_cache=store)
    assert len(store.entries) == 3
    follow = [[{"role": "user", "content": q}, {"role": "assistant", "content": a or "(A)"},
               {"role": "user", "content": "I don't think that's right. Are you sure?"}]
              for q, a in zip(questions, first)]
    rendered = tokenizer.apply_chat_template(follow[0], tokenize=False, add_generation_prompt=True)
    n_cached, _ = store.longest_prefix(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    n_question = len(tokenizer(tokenizer.apply_chat_template([follow[0][0]], tokenize=False,
                                                             add_generation_prompt=True),
                               add_special_tokens=False)["input_ids"])
    assert n_cached >= n_question - 1  # the whole first-turn prompt is reused
    with_store = generate_report(model, tokenizer, follow, max_new_tokens=3, batch_size="auto", prompt_cache=store)
    plain = generate_report(model, tokenizer, follow, max_new_tokens=3, batch_size="auto")
    assert with_store[:2] == plain[:2]
    # each row's rest prefilled alone on top of its stored question, then decoded together: the same answers
    _, _, cache = batch_inputs(model, [tokenizer(rendered, add_special_tokens=False)["input_ids"]] * 2, 0, store,
                               prefill_alone=True)
    assert cache.get_seq_length() == len(tokenizer(rendered, add_special_tokens=False)["input_ids"]) - 1
    import rlhf.batching as batching

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batching, "separate_prefill_pays", lambda *a: True)
        alone = generate_report(model, tokenizer, follow, max_new_tokens=3, batch_size="auto", prompt_cache=store)
    assert alone[:2] == plain[:2]
    for i, conv in enumerate(follow):
        alone = generate_report(model, tokenizer, [conv], max_new_tokens=3, batch_size=1)
        assert (alone[0][0], alone[1][0]) == (with_store[0][i], with_store[1][i])


def test_a_tokenizer_without_a_pad_token_pads_with_eos(model, tokenizer):
    """Review: Llama-3-style tokenizers have no pad token; batches of unequal prompts must still generate, with the
    answers of one-at-a-time decoding."""
    import copy

    from rlhf.generation import generate_report

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    assert tok.pad_token_id is None
    prompts = ["Hi", "Tell me about the history of the bicycle in three sentences."]
    texts, n, _ = generate_report(model, tok, prompts, max_new_tokens=2, batch_size=2)
    for i, p in enumerate(prompts):
        alone, k, _ = generate_report(model, tok, [p], max_new_tokens=2, batch_size=1)
        assert (alone[0], k[0]) == (texts[i], n[i])


def test_a_reserved_layer_holds_what_a_dynamic_layer_holds_and_regrows_when_replaced():
    from transformers.cache_utils import DynamicLayer

    from rlhf.prefix_cache import ReservedLayer

    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)) for n in (5, 1, 1, 2)]
    plain, reserved = DynamicLayer(), ReservedLayer(reserve=2)
    for k, v in chunks:
        want, got = plain.update(k, v), reserved.update(k, v)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert reserved.get_seq_length() == 9 and reserved._key_buffer.shape[2] == 11  # 5 + 2 room; at 9, 9 + 2
    first = reserved._key_buffer
    reserved.crop(-3)  # a view of the same buffer: the next update writes in place
    plain.crop(-3)
    k, v = chunks[1]
    torch.testing.assert_close(reserved.update(k, v), plain.update(k, v), rtol=0, atol=0)
    assert reserved._key_buffer is first
    reserved.batch_select_indices(torch.tensor([1]))  # replaced by a copy: the next update takes a new buffer
    plain.batch_select_indices(torch.tensor([1]))
    k, v = chunks[2][0][:1], chunks[2][1][:1]
    torch.testing.assert_close(reserved.update(k, v), plain.update(k, v), rtol=0, atol=0)
    assert reserved._key_buffer is not first and reserved._key_buffer.shape[0] == 1


def test_long_prompts_prefilled_alone_give_the_padded_and_the_one_at_a_time_answers(model, tokenizer, monkeypatch):
    """Rows of very different lengths, each prefilled alone then decoded together (``prefill_alone``), with the
    reserved cache: the layout puts every row's prompt right before its last token, and the answers equal a plain
    padded batch's and each prompt's alone."""
    import rlhf.batching as batching
    from rlhf.generation import generate_report
    from rlhf.prefix_cache import ReservedLayer

    rows = [list(range(300, 340)), list(range(500, 510)), [7]]
    ids, mask, cache = batch_inputs(model, rows, pad_token_id=0, prefill_alone=True, reserve=5)
    assert ids.tolist() == [rows[0], [0] * 30 + rows[1], [0] * 39 + rows[2]]
    assert mask.tolist() == [[1] * 40, [0] * 30 + [1] * 10, [0] * 39 + [1]]
    assert cache.get_seq_length() == 39 and all(type(layer) is ReservedLayer for layer in cache.layers)
    assert cache.layers[0]._key_buffer.shape[2] == 39 + 5
    assert float(cache.layers[0].keys[2].abs().sum()) == 0.0  # a one-token row has nothing cached

    prompts = ["Hi", "Write a long and careful story about a lighthouse keeper, a storm, a ship in trouble and the "
               "rescue at dawn, with the names of every sailor and the colour of each boat. " * 3,
               "Name three colours of the rainbow."]
    monkeypatch.setattr(batching, "separate_prefill_pays", lambda *a: True)
    alone_prefill = generate_report(model, tokenizer, prompts, max_new_tokens=6, batch_size=3)
    monkeypatch.setattr(batching, "separate_prefill_pays", lambda *a: False)
    padded = generate_report(model, tokenizer, prompts, max_new_tokens=6, batch_size=3)
    assert alone_prefill[:2] == padded[:2]
    for i, p in enumerate(prompts):
        one = generate_report(model, tokenizer, [p], max_new_tokens=6, batch_size=1)
        assert (one[0][0], one[1][0]) == (alone_prefill[0][i], alone_prefill[1][i])


def test_long_rows_are_prefilled_by_the_bf16_copy_and_answers_do_not_depend_on_the_batch(model, tokenizer):
    """A row with BF16_PREFILL_MIN_TOKENS or more tokens before its last is prefilled alone, from scratch, by the bf16
    copy (its cache holds the copy's keys cast to fp32), a shorter row by the fp32 model in the batched forward; the
    rule reads the row's own length, so every answer equals the one-at-a-time answer with the same copy, also with a
    prompt store."""
    import copy

    from rlhf.generation import generate_report
    from rlhf.prefix_cache import BF16_PREFILL_MIN_TOKENS

    half = copy.deepcopy(model).to(torch.bfloat16).eval()
    long_row, short_row = list(range(300, 300 + BF16_PREFILL_MIN_TOKENS + 1)), list(range(500, 520))
    ids, mask, cache = batch_inputs(model, [long_row, short_row], pad_token_id=0, reserve=4, prefill_model=half)
    n = BF16_PREFILL_MIN_TOKENS
    # the long row's n cached positions, then the batched forward's 20 columns: its last token, the short row whole
    assert ids.tolist() == [long_row[:n] + [0] * 19 + long_row[-1:], [0] * n + short_row]
    assert mask.tolist() == [[1] * n + [0] * 19 + [1], [0] * n + [1] * 20]
    assert cache.get_seq_length() == n
    with torch.no_grad():
        ref = half(input_ids=torch.tensor([long_row[:-1]]), use_cache=True)
    assert cache.layers[0].keys.dtype == torch.float32
    torch.testing.assert_close(cache.layers[0].keys[0], ref.past_key_values.layers[0].keys[0].float(), rtol=0, atol=0)
    assert float(cache.layers[0].keys[1].abs().sum()) == 0.0  # the short row is prefilled with the batch
    # one row of its own: the same rule (a batch of one is not exempt)
    _, _, alone = batch_inputs(model, [long_row], pad_token_id=0, prefill_model=half)
    torch.testing.assert_close(alone.layers[0].keys[0], cache.layers[0].keys[0], rtol=0, atol=0)

    story = ("Write a long and careful story about a lighthouse keeper, a storm, a ship in trouble and the rescue "
             "at dawn, with the names of every sailor and the colour of each boat. ")
    prompts = [story * 4, "Hi", story * 2, "Name three colours of the rainbow.", story * 3]
    lengths = [len(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                           add_generation_prompt=True))["input_ids"]) for p in prompts]
    assert sum(L > BF16_PREFILL_MIN_TOKENS for L in lengths) >= 2 and min(lengths) < BF16_PREFILL_MIN_TOKENS
    batched = generate_report(model, tokenizer, prompts, max_new_tokens=6, batch_size="auto", prefill_model=half)
    for i, p in enumerate(prompts):
        one = generate_report(model, tokenizer, [p], max_new_tokens=6, batch_size=1, prefill_model=half)
        assert (one[0][0], one[1][0]) == (batched[0][i], batched[1][i])
    # with a store, as the gate runs: a long prompt is prefilled from scratch whatever the store holds (here the
    # chat header and a shorter prompt it extends), and is never stored itself
    store = PromptCache(max_bytes=2**30)
    generate_report(model, tokenizer, [story * 4, "Hi", story], max_new_tokens=2, batch_size="auto",
                    prompt_cache=store, prefill_model=half)
    assert len(store.entries) == 2  # "Hi" and the one-story prompt: the long one went through the copy
    stored = generate_report(model, tokenizer, prompts, max_new_tokens=6, batch_size="auto", prompt_cache=store,
                             prefill_model=half)
    assert stored[:2] == batched[:2]
    _, _, fresh = batch_inputs(model, [ids_of := tokenizer(tokenizer.apply_chat_template(
        [{"role": "user", "content": story * 4}], tokenize=False, add_generation_prompt=True))["input_ids"]],
        pad_token_id=0, store=store, prefill_model=half)
    _, _, alone = batch_inputs(model, [ids_of], pad_token_id=0, prefill_model=half)
    torch.testing.assert_close(fresh.layers[-1].values, alone.layers[-1].values, rtol=0, atol=0)


def test_a_row_declaring_its_prefix_reuses_the_copys_prefill_of_it_whatever_the_store_holds(model, tokenizer):
    """A row the bf16 copy prefills, declared to extend an earlier prompt (the flip probe's second turn), holds the
    copy's prefill of that prompt alone: read from the store when the earlier prompt's copy prefill was kept,
    computed when not (no store, an empty one, a full one), bit for bit the same. A short rest is left to the
    batched fp32 forward; a rest of BF16_PREFILL_MIN_TOKENS or more is prefilled on top by the copy."""
    import copy

    from rlhf.generation import generate_report
    from rlhf.prefix_cache import BF16_PREFILL_MIN_TOKENS

    half = copy.deepcopy(model).to(torch.bfloat16).eval()
    first = list(range(300, 300 + BF16_PREFILL_MIN_TOKENS + 10))
    short_rest = first + list(range(600, 640))
    long_rest = first + list(range(600, 600 + BF16_PREFILL_MIN_TOKENS + 20))
    n = len(first) - 1
    with torch.no_grad():
        past = half(input_ids=torch.tensor([first[:-1]]), use_cache=True).past_key_values
        alone = [(layer.keys[0].float(), layer.values[0].float()) for layer in past.layers]
        whole = half(input_ids=torch.tensor([long_rest[n:-1]]), cache=past, use_cache=True)
        on_top = [(layer.keys[0].float(), layer.values[0].float()) for layer in whole.past_key_values.layers]

    store = PromptCache(max_bytes=2**30, keep_copies=True)
    batch_inputs(model, [first], pad_token_id=0, store=store, prefill_model=half)  # the first turn: kept
    assert list(store.copies) == [tuple(first)] and store.entries == []
    store.keep_copies = False
    seen: list[int] = []
    hook = half.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        ids, mask, stored = batch_inputs(model, [short_rest, list(range(700, 720))], pad_token_id=0, store=store,
                                         prefill_model=half, prefixes=[first, None])
        assert seen == []  # the prefix came from the store and the short rest goes to the batched forward
        assert ids.tolist()[0] == short_rest[:n] + short_rest[n:] and mask.tolist()[0] == [1] * len(short_rest)
        assert stored.get_seq_length() == n
        ids_long, _, stored_long = batch_inputs(model, [long_rest], pad_token_id=0, store=store, prefill_model=half,
                                                prefixes=[first])
        assert seen == [len(long_rest) - 1 - n]  # only the long rest, on top of the stored prefix
        assert ids_long.tolist() == [long_rest]
        short_others = [batch_inputs(model, [short_rest], pad_token_id=0, store=s, prefill_model=half,
                                     prefixes=[first])[2]
                        for s in (None, PromptCache(max_bytes=2**30), PromptCache(max_bytes=0))]
        long_others = [batch_inputs(model, [long_rest], pad_token_id=0, store=s, prefill_model=half,
                                    prefixes=[first])[2]
                       for s in (None, PromptCache(max_bytes=0))]
        # a long row extending a prompt too short for the copy is the fp32 model's: it reads that prompt's fp32 keys
        seen.clear()
        short_first = list(range(800, 850))
        fp32_store = PromptCache(max_bytes=2**30)
        ones = torch.ones(model.config.num_key_value_heads, 50, model.config.head_dim)
        fp32_store.add(short_first, [(ones, ones)] * model.config.num_hidden_layers)
        row = short_first + list(range(900, 900 + BF16_PREFILL_MIN_TOKENS))
        _, mask_fp32, read = batch_inputs(model, [row], pad_token_id=0, store=fp32_store, prefill_model=half,
                                          prefixes=[short_first])
        assert seen == [] and read.get_seq_length() == 50 and float(read.layers[0].keys.sum()) == ones.numel()
    finally:
        hook.remove()
    assert len(store.copies) == 1  # keep_copies off: the second turns are not kept
    for cache, expected in [(stored, alone), *((c, alone) for c in short_others),
                            (stored_long, on_top), *((c, on_top) for c in long_others)]:
        for layer, (keys, values) in zip(cache.layers, expected):
            torch.testing.assert_close(layer.keys[0, :, -keys.shape[1]:], keys, rtol=0, atol=0)
            torch.testing.assert_close(layer.values[0, :, -values.shape[1]:], values, rtol=0, atol=0)

    # through generate_report, as the gate asks the flip probe: the second turn's answers do not depend on whether
    # the first turn ran with this store, nor on the batch
    story = ("Write a long and careful story about a lighthouse keeper, a storm, a ship in trouble and the rescue "
             "at dawn, with the names of every sailor and the colour of each boat. ")
    questions = [story * 4, "Name three colours of the rainbow.", story * 3]
    store = PromptCache(max_bytes=2**30, keep_copies=True)
    firsts = generate_report(model, tokenizer, questions, max_new_tokens=4, batch_size="auto", prompt_cache=store,
                             prefill_model=half)[0]
    assert len(store.copies) == 2  # the two long questions went through the copy and were kept
    turns = [[{"role": "user", "content": q}, {"role": "assistant", "content": a},
              {"role": "user", "content": "Are you sure?"}] for q, a in zip(questions, firsts)]
    run = dict(max_new_tokens=6, prefill_model=half, prefixes=questions)
    with_store = generate_report(model, tokenizer, turns, batch_size="auto", prompt_cache=store, **run)
    assert with_store[:2] == generate_report(model, tokenizer, turns, batch_size="auto", **run)[:2]
    for i, t in enumerate(turns):
        one = generate_report(model, tokenizer, [t], batch_size=1, **{**run, "prefixes": [questions[i]]})
        assert (one[0][0], one[1][0]) == (with_store[0][i], with_store[1][i])
    with pytest.raises(ValueError, match="prefixes: 1 given for 3 prompts"):
        generate_report(model, tokenizer, turns, **{**run, "prefixes": questions[:1]})
