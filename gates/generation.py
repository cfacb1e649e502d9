"""Gate-stage generation: the suites, each model's answers to them (greedy, batched), and the intents of the
win-rate prompts."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data.loaders import load_eval_prompts
from rlhf.generation import generate_report
from rlhf.precision import generation_precision, prefill_precision
from rlhf.weights import load_checked
from rlhf.manifest import dumps_strict

from .config import GateStageConfig
from .consistency import ConsistencySuite, build_suite, context_budget, load_exchanges
from .suites import capability_questions, stratified, suggested_questions
from .sycophancy import are_you_sure_messages

logger = logging.getLogger("gates.generation")

#: The consistency suite's prompt budget: above any context a model here has, so nothing is cut (the suite fits
#: itself to the context when it is built).
_LONGEST_PROMPT = 1 << 30


@dataclass(frozen=True)
class Suites:
    """The round's gate suites, loaded and sampled once.

    Fields:
        winrate: win-rate prompts (``EvalPrompt``, stratified by intent).
        questions: neutral multiple-choice questions (capability and the "are you sure?" flip probe).
        suggested: questions with a user-suggested wrong answer (sycophancy).
        safe, redteam: benign-but-scary and red-team prompts (two-sided refusal).
        consistency: the long-conversation constraint probes (``gates.consistency``); None: not run.
    """

    winrate: list
    questions: list
    suggested: list
    safe: list
    redteam: list
    consistency: ConsistencySuite | None = None

    @property
    def prompts(self) -> dict[str, list]:
        """What each model is sent, per suite (``answer_suites``' input)."""
        out = {
            "winrate": [chat_of(p) for p in self.winrate],
            "safe": [p.prompt for p in self.safe],
            "redteam": [p.prompt for p in self.redteam],
            "capability": [q.prompt for q in self.questions],
            "sycophancy": [q.prompt for q in self.suggested],
        }
        if self.consistency is not None:
            out[CONSISTENCY] = [it.messages for it in self.consistency.items]
        return out

    @property
    def ids(self) -> dict[str, list[str]]:
        """Item ids per suite, ``are_you_sure`` included (it asks the capability questions again)."""
        return {
            "winrate": [p.id for p in self.winrate],
            "safe": [p.id for p in self.safe],
            "redteam": [p.id for p in self.redteam],
            "capability": [q.id for q in self.questions],
            "are_you_sure": [q.id for q in self.questions],
            "sycophancy": [q.id for q in self.suggested],
            **({CONSISTENCY: [it.id for it in self.consistency.items]} if self.consistency is not None else {}),
        }


#: The consistency suite's key in the prompts and answers.
CONSISTENCY = "consistency"


def consistency_suite(args: GateStageConfig, model_paths: list[str]) -> ConsistencySuite:
    """The consistency probes (``gates.consistency.build_suite``) from ``consistency_data`` (and
    ``consistency_mt_bench_data``), with every conversation's rendered length counted with the first model's
    tokenizer and chat template, and the depths that do not fit the models' context (``context_budget``: the
    smaller context length, capped by ``consistency_context_length``, minus ``max_new_tokens``) skipped."""
    from .inputs import source_path
    from rlhf.generation import chat_prompt

    convs = load_exchanges(source_path(args.consistency_data),
                           source_path(args.consistency_mt_bench_data) if args.consistency_mt_bench_data else None)
    tok = AutoTokenizer.from_pretrained(model_paths[0])
    budget = context_budget(model_paths, args.max_new_tokens, args.consistency_context_length)
    suite = build_suite(
        convs, depths=args.consistency_depths, positions=args.consistency_positions, n_per_depth=args.n_consistency,
        seed=args.consistency_seed, context_length=budget,
        count_tokens=lambda msgs: len(tok(chat_prompt(tok, msgs), add_special_tokens=False)["input_ids"]))
    for depth, why in suite.skipped.items():
        logger.warning("consistency: depth %d skipped: %s", depth, why)
    return suite


def load_suites(args: GateStageConfig, models: dict | None = None) -> Suites:
    """Load and sample every suite named in ``args`` (the ``*_data`` files, ``n_*`` sizes); with ``models``
    (``gates.inputs.resolve_models``: the baseline and candidate checkpoints) and ``args.consistency``, also the
    consistency suite, fitted to their context."""
    consistency = None
    if args.consistency and models is not None:
        consistency = consistency_suite(args, [models["baseline"], models["candidate"]])
    return Suites(
        winrate=stratified(load_eval_prompts(args.winrate_data), args.n_winrate),
        questions=capability_questions(
            load_eval_prompts(args.capability_data, limit=args.n_capability), args.n_capability
        ),
        suggested=suggested_questions(load_eval_prompts(args.sycophancy_data), args.n_sycophancy),
        safe=load_eval_prompts(args.safe_data, set_name="xstest_safe", limit=args.n_safe),
        redteam=load_eval_prompts(args.redteam_data, limit=args.n_redteam),
        consistency=consistency,
    )


def write_generations(path: Path, suites: Suites, answers: dict[str, dict]) -> None:
    """One JSONL row per (suite, item): suite, id, prompt, baseline and candidate answers."""
    prompts, ids = suites.prompts, suites.ids
    with open(path, "w") as f:
        for name in [*prompts, "are_you_sure"]:
            for i, item_id in enumerate(ids[name]):
                row = {
                    "suite": name,
                    "id": item_id,
                    "prompt": prompts.get(name, prompts["capability"])[i],
                    "baseline": answers["baseline"][name]["text"][i],
                    "candidate": answers["candidate"][name]["text"][i],
                }
                f.write(dumps_strict(row) + "\n")


def chat_of(p) -> list[dict] | str:
    """What to send for an eval prompt: the full conversation of a multi-turn held-out pair, else the prompt."""
    return p.meta.get("messages") or p.prompt


def generate_suite(model, tok, prompts: list, max_new_tokens: int, args: GateStageConfig, desc: str,
                   prompt_cache=None, max_prompt_length: int | None = None, prefill_model=None,
                   prefixes: list | None = None) -> dict:
    """One suite's answers: ``{"text", "n_tokens", "truncated"}`` (per item; truncated = prompt content was cut to fit
    ``args.max_prompt_length``, the chat template never is).

    ``model``: a transformers causal LM, or a ``rlhf.vllm_engine.VLLMGenerator`` (``engine: vllm``). In a
    multi-process launch the prompts are sharded over the processes and every process gets all answers in order.
    ``prompt_cache``: a ``rlhf.prefix_cache.PromptCache`` of this model (transformers only; vLLM caches prefixes
    itself). ``max_prompt_length``: this suite's prompt budget (default ``args.max_prompt_length``).
    ``prefill_model``: the bf16 copy that prefills long prompts (``rlhf.generation.generate_report``), or None.
    ``prefixes``: per prompt, an earlier prompt it extends, or None (``generate_report``; transformers only)."""
    from rlhf.vllm_engine import VLLMGenerator

    budget = args.max_prompt_length if max_prompt_length is None else max_prompt_length
    if isinstance(model, VLLMGenerator):
        text, n, cut = model.generate_report(prompts, max_new_tokens=max_new_tokens,
                                             max_prompt_length=budget, desc=desc)
    else:
        text, n, cut = generate_report(
            model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=args.batch_size,
            max_prompt_length=budget, desc=desc, shard=True, prompt_cache=prompt_cache, prefill_model=prefill_model,
            prefixes=prefixes,
        )
    if any(cut):
        logger.warning("%s: %d of %d prompts longer than max_prompt_length=%d had their content cut (template kept)",
                       desc, sum(cut), len(cut), budget)
    return {"text": text, "n_tokens": n, "truncated": cut}


def generate_suites(model, tok, suites: dict[str, list], caps: dict[str, int], args: GateStageConfig, who: str,
                    prompt_cache=None, prefill_model=None) -> dict:
    """Every suite's answers, suites that share ``max_new_tokens`` generated in ONE call (full, length-sorted batches
    across suites instead of a part-empty last batch per suite); split back per suite, in each suite's order.

    Returns ``{suite: {"text", "n_tokens", "truncated"}}`` (see :func:`generate_suite`).
    """
    out: dict[str, dict] = {}
    for cap in sorted(set(caps.values())):
        names = [n for n in suites if caps[n] == cap]
        joined = [p for n in names for p in suites[n]]
        both = generate_suite(model, tok, joined, cap, args, f"{who} {'+'.join(names)}", prompt_cache,
                              prefill_model=prefill_model)
        start = 0
        for n in names:
            end = start + len(suites[n])
            out[n] = {k: v[start:end] for k, v in both.items()}
            start = end
    return {n: out[n] for n in suites}


def generation_efficiency(answers: dict[str, dict], seconds: float, model_path: str, precision: str = "fp32") -> dict:
    """Throughput of the gate generation: both models' generated tokens over its wall time, with the threads and the
    model FLOPs utilisation of greedy decoding (2·N FLOPs per generated token, N = the candidate's parameters;
    prompt prefill not counted), against the device's peak for ``precision`` (``rlhf.machine.peak_flops``), which
    is recorded as ``precision``; ``prefill_precision`` is the long prompts' prefill dtype (``answer_suites``)."""
    from transformers import AutoConfig

    from rlhf.efficiency import efficiency

    tokens = sum(sum(a["n_tokens"]) for who in ("baseline", "candidate") for k, a in answers[who].items()
                 if not k.startswith("_"))
    cfg = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    out = efficiency(n, tokens, seconds, precision, flops_per_param=2)  # decoding: 2·N per token
    out["generation_seconds"] = seconds
    out["precision"] = precision
    out["prefill_precision"] = (answers["candidate"].get("_precision") or {}).get("prefill", precision)
    logger.info("generation: %d tokens in %.1f s = %.1f tok/s on %d threads", tokens, seconds, out["tokens_per_s"],
                out["threads"])
    return out


def truncation_counts(answers: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Over-long prompts per suite: ``{suite: {"n": items, "baseline": cut, "candidate": cut}}``."""
    suites = [k for k in answers["candidate"] if not k.startswith("_")]
    return {
        name: {"n": len(answers["candidate"][name]["truncated"]),
               **{who: int(sum(answers[who][name]["truncated"])) for who in ("baseline", "candidate")}}
        for name in suites
    }


def answer_suites(path: str, suites: dict[str, list], args: GateStageConfig, who: str) -> dict[str, dict]:
    """Generate one model's answers to every suite. Returns ``{suite: {"text", "n_tokens", "truncated"}}``.

    The flip probe's second turn depends on the model's own first answer, so it runs after the capability suite;
    it repeats the first-turn question, whose KV cache is kept from the first turn (``rlhf.prefix_cache``) so only
    the answer and the challenge are prefilled again. Where ``rlhf.precision.prefill_precision`` says bf16 and the
    weights are fp32, a bf16 copy of the model prefills each long prompt alone and the fp32 model decodes; a second
    turn the copy prefills declares its first-turn question as its prefix (``generate_report``'s ``prefixes``), so
    the copy's prefill of that question is reused, or recomputed the same way when it was not kept.

    Also ``"_length"`` (text -> tokens in this model's tokenizer) and ``"_precision"``
    (``{"weights": fp32 | bf16 | vllm, "prefill": the long prompts' prefill dtype}``).
    """
    from rlhf.machine import available_memory_bytes
    from rlhf.prefix_cache import PromptCache

    tok = AutoTokenizer.from_pretrained(path)
    prefill = None
    if args.engine == "vllm":
        from rlhf.vllm_engine import VLLMGenerator

        model = VLLMGenerator(path, tensor_parallel_size=args.vllm_tensor_parallel_size)
        precision = {"weights": "vllm", "prefill": "vllm"}
    else:
        weights = generation_precision(args.generation_precision)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[weights]
        model = load_checked(AutoModelForCausalLM, path, what="gate model", dtype=dtype)
        from rlhf.prefix_cache import plain_layers

        # only a full-attention cache can take the copy's keys (rlhf.prefix_cache); else the weights' dtype prefills
        prefill_dtype = prefill_precision(args.prefill_precision, weights) if plain_layers(model) else weights
        precision = {"weights": weights, "prefill": prefill_dtype}
        if prefill_dtype != weights:  # a bf16 copy prefills the long prompts, the fp32 model decodes
            # loaded again in bf16, not copied and cast: a copy would first hold a second fp32 model
            prefill = load_checked(AutoModelForCausalLM, path, what="gate prefill model", dtype=torch.bfloat16).eval()
    long = {k: v for k, v in suites.items() if k == CONSISTENCY}
    short = {k: v for k, v in suites.items() if k != CONSISTENCY}
    caps = {name: args.mc_max_new_tokens if name in ("capability", "sycophancy") else args.max_new_tokens
            for name in short}
    # keep_copies: the flip probe's second turn extends the capability questions, also where the copy prefilled them
    store = PromptCache(max_bytes=available_memory_bytes() // 8, keep_copies=True) if args.engine != "vllm" else None
    out = generate_suites(model, tok, short, caps, args, who, prompt_cache=store, prefill_model=prefill)
    if store is not None:
        store.keep_copies = False
    if long and not long[CONSISTENCY]:  # every depth skipped: nothing to ask
        out[CONSISTENCY] = {"text": [], "n_tokens": [], "truncated": []}
    elif long:
        # Never cut: cutting a long conversation drops the constraint it probes. The suite holds only depths whose
        # every conversation fits the models' context with max_new_tokens to spare (gates.consistency.build_suite).
        out[CONSISTENCY] = generate_suite(model, tok, long[CONSISTENCY], args.max_new_tokens, args,
                                          f"{who} consistency", prompt_cache=store,
                                          max_prompt_length=max(args.max_prompt_length, _LONGEST_PROMPT),
                                          prefill_model=prefill)
    challenged = [are_you_sure_messages(q, a) for q, a in zip(suites["capability"], out["capability"]["text"])]
    out["are_you_sure"] = generate_suite(model, tok, challenged, args.mc_max_new_tokens, args, f"{who} are-you-sure",
                                         prompt_cache=store, prefill_model=prefill,
                                         prefixes=suites["capability"] if prefill else None)
    del store, prefill
    out["_precision"] = precision
    out["_length"] = lambda t, tok=tok: len(tok(t, add_special_tokens=False)["input_ids"])
    del model
    return out


def label_intents(prompts: list, model_path: str, args: GateStageConfig) -> tuple[list[str], dict | None]:
    """Each win-rate prompt's intent: its own label, else the embedding classifier's (fitted on
    ``intent_training_data`` with the baseline checkpoint's pooled states). Returns (intents, classifier summary)."""
    if all(p.intent for p in prompts):
        return [p.intent for p in prompts], None
    from .intent_classifier import embed, fit_intent_classifier

    labelled = [p for p in load_eval_prompts(args.intent_training_data) if p.intent]
    tok = AutoTokenizer.from_pretrained(model_path)
    model = load_checked(AutoModelForCausalLM, model_path, what="intent-classifier model", dtype=torch.float32)
    clf = fit_intent_classifier(embed(model, tok, [p.prompt for p in labelled]), [p.intent for p in labelled])
    missing = [i for i, p in enumerate(prompts) if not p.intent]
    predicted = clf.predict(embed(model, tok, [prompts[i].prompt for i in missing]))
    intents = [p.intent for p in prompts]
    for i, label in zip(missing, predicted):
        intents[i] = label
    logger.info(
        "intent classifier: %d prompts labelled, held-out accuracy %.3f (n=%d)",
        len(missing),
        clf.held_out_accuracy,
        clf.n_test,
    )
    return intents, {"n_classified": len(missing), "held_out_accuracy": clf.held_out_accuracy, "n_test": clf.n_test}
