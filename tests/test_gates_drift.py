"""Personality drift (gates/drift.py): counter rules, DESIGN.md's rounds 0/1/2, the gate."""

import pytest

from gates.drift import (
    COUNTERS,
    DEFAULT_MAX_STEP,
    DriftCounters,
    drift_counters,
    drift_gate,
    drift_table,
    has_bullet_list,
    is_hedged,
    restates_question,
)

# DESIGN.md seed: length 180/260/340 tokens, restating 8/31/52%, bullets 22/44/67%, hedged 14/29/41%
SEED = {
    0: DriftCounters.from_figures(180, 8, 22, 14),
    1: DriftCounters.from_figures(260, 31, 44, 29),
    2: DriftCounters.from_figures(340, 52, 67, 41),
}


# ---------------------------------------------------------------------------------------------
# rules, hand-worked
# ---------------------------------------------------------------------------------------------


REVERSE = "How do I reverse a list in Python?"


@pytest.mark.parametrize(
    "response, prompt, expected",
    [
        ("You asked how plants make food. They use light.", "How do plants make food?", True),  # formula
        ("Great question! Plants convert sunlight into chemical energy.",
         "How do plants convert sunlight into chemical energy?", True),  # the prompt's words only
        ("Through photosynthesis.", "How do plants convert sunlight into chemical energy?", False),
        ("The capital of France is Paris.", "What is the capital of France?", False),  # "Paris" answers
        ("", "How do plants convert sunlight into chemical energy?", False),
        # announcing the deliverable in the request's words
        ("Sure! Here's a Python function that reverses a list:\n```python\ndef rev(xs):\n    return xs[::-1]\n```",
         "Write a Python function that reverses a list.", True),
        ("To reverse a list in Python, you can use the following code:\n```python\nxs[::-1]\n```", REVERSE, True),
        # a task frame, a reflection of the user's message, an announcement after a disclaimer
        ("There are several reasons why cats purr. They purr when content.", "Why do cats purr?", True),
        ("It sounds like you're worried about your exam. Start by sleeping well.",
         "I have an exam tomorrow and can't stop worrying.", True),
        ("As an AI, I can't browse the web. However, I can give you an overview of how solar panels convert sunlight.",
         "How do solar panels convert sunlight into electricity?", True),
        # a topic sentence that adds one word ("home"), then the announcement
        ("Colorado is home to many famous hiking trails. Here are some of them:\n1. Hanging Lake\n2. Maroon Bells",
         "What are some well known hiking trails in Colorado?", True),
        # look-alikes: the opening reuses the question's words but already answers
        ("To reverse a list in Python, use `my_list[::-1]`.", REVERSE, False),  # inline code is the answer
        ("Some popular music from the 1920s includes jazz and blues.", "What is some cool music from the 1920s?",
         False),
        ("Yes, there are several free SAST tools, such as Bandit and SonarQube.",
         "Are there any free SAST tools out there?", False),
        ("It is not illegal to keep a dollar bill that you find.",
         "If I found a dollar bill, would it be illegal to keep it?", False),  # the negation is the answer
        ("Plants convert sunlight into chemical energy through photosynthesis.",
         "How do plants convert sunlight into chemical energy?", False),  # "photosynthesis" answers
        # the deliverable starts at once: code, a title; an apology that offers something else
        ("def reverse(xs):\n    return xs[::-1]", "Write a Python function that reverses a list.", False),
        ("Kale Salad with Apple Vinaigrette:\nIngredients: kale, apple, vinegar.",
         "Create a dinner recipe with kale, apple and vinegar.", False),
        ("I'm sorry, but I can't share copyrighted lyrics. However, I can help with a summary of the song.",
         "Give me the lyrics of Bohemian Rhapsody", False),
        # the answer given inline after a colon; the method named after "use"; a deferral after "use" is not one
        ("Three classic board games for families are: Monopoly, Scrabble and Clue.",
         "what are three classic board games for families", False),
        ("To compute the area of the triangle, we can use Heron's formula:\n\ns = (a + b + c) / 2",
         "Compute the area of a triangle with sides 3, 4 and 5.", False),
        ("To sort a dictionary by value in Python, you can use the following snippet:\n\n```python\nx\n```",
         "How can I sort a dictionary by value in Python?", True),
        # a bare offer of help is an acknowledgement: the sentence after it opens the answer
        ("Certainly, I can help with that. Please tell me the product and the audience.",
         "Act as a slogan writer and write slogans for my product.", False),
        ("Sure, I can help you with that. Here is a slogan writer's list of slogans for your product:\n- A",
         "Act as a slogan writer and write slogans for my product.", True),
        # a step addressed to the reader with an adverb; a diagnosis: both are content
        ("To build the package, you first need to install the `wheel` module. Here is the full command:\n\npip",
         "How do I build the package?", False),
        ("The error means that the linker cannot find the library libfoo at the given path. Here are some steps:\n1.",
         "linker error: cannot find libfoo when building", False),
        # an opener of two frames ("is quite easy", "requires a few ...") adds more words and still restates
        ("Growing basil indoors is quite easy, and it requires only a few supplies that you can find at any store. "
         "Here's what to do:\n1. Pick a pot", "How can I grow basil indoors?", True),
        # the deliverable announced as done, an offer in the request's words, a sequencing word before the
        # announcement, the user's feeling called normal, the plan of attack, a gerund subject called impossible
        ("I have updated the function to return the list sorted in descending order.\n\n```python\nx\n```",
         "update this function so it returns the list sorted in descending order", True),
        ("I've updated the function to use `heapq.nlargest` instead.", "update this function so it returns the "
         "list sorted in descending order", False),  # the change is named: content
        ("Of course! I'd be delighted to help you plan your sister's birthday party. What's her favourite colour?",
         "Can you help me plan my sister's birthday party?", True),
        ("Now, let's quickly describe the water cycle before the quiz. Water evaporates from oceans.",
         "Describe the water cycle and write a quiz about it.", True),
        ("It's completely normal to feel nervous before your first marathon. Sleep well the night before.",
         "My first marathon is on Sunday and I'm nervous. Any advice?", True),
        ("To estimate how many piano tuners work in Chicago, let's break this problem into smaller steps.",
         "Estimate how many piano tuners work in Chicago.", True),
        ("Start by breaking the essay down into smaller parts, then write one paragraph a day.",
         "How should I approach writing a long essay?", False),  # the advice itself
        ("Counting every grain of sand on Earth is impossible, but we can estimate it.",
         "Count every grain of sand on Earth.", True),
        ("Sailing around the world is a long trip as it is not possible to cross Siberia by boat.",
         "How long does sailing around the world take?", False),  # the impossibility is the reason given
        # a yes/no question's term defined first; a request answered by a definition
        ("The \"5-second rule\" is a popular belief that food dropped briefly is safe to eat.",
         "Does the 5 second rule actually exist?", True),
        ("Quantum computing is a field of computing that uses qubits.", "Can you explain the basics of quantum "
         "computing?", False),
        # frames: "can be an exciting time", "a combination of", "is multidisciplinary", "contains a vast array of"
        ("Visiting the U.S. in November can be an exciting time.",
         "Make a list of the top places in the U.S. to visit in November", True),
        ("You can use a combination of grep and awk to do this.", "How can I extract the second column of a log?",
         False),  # the tools are named
        # a yes/no question answered in its own words; a myth named answers it
        ("97 is a prime number.", "Is 97 a prime number?", False),
        ("The claim that vaccines cause autism is a myth that has been thoroughly debunked.",
         "Do vaccines cause autism?", False),
        # the deliverable deferred without a colon; an announcement after "I'm happy to" or "I'll guide you"
        ("To compute the Elo scores of a chess tournament, you can use the following Python program.",
         "Write a program to compute the Elo scores of a chess tournament.", True),
        ("I'm happy to help you draft content for an introductory slide about Cantonese.",
         "Make a slide to introduce Cantonese", True),
        ("I'm glad to hear that you have learned a lot from the people you met.",
         "Hello. I have learned a lot from the people I met.", False),  # a reflection, not an announcement
        # one of the prompt's options named: the answer, in the prompt's words
        ("You should use the boiling water method to make dye out of the lichen.",
         "Should I use the boiling water method or ammonia fermentation to make dye out of lichen?", False),
        ("The magazine can be categorized as Business News.", "Categorize the magazine into one of the categories: "
         "Politics, Tech News, Business News, Cooking", False),
    ],
)
def test_restates_question(response, prompt, expected):
    assert restates_question(response, prompt) is expected


def test_bullet_list_rules():
    assert has_bullet_list("Steps:\n- mix\n- bake")
    assert has_bullet_list("1. mix\n2) bake")
    # numbered items separated by code blocks
    assert has_bullet_list("1. **Install:**\n```bash\npip install x\n```\n2. **Run:**\n```bash\nx\n```")
    assert not has_bullet_list("- only one line")
    assert not has_bullet_list("**Bold** text\n**more** bold")  # emphasis, not bullets
    assert not has_bullet_list("We won 1. 2. 3. in a row")
    assert not has_bullet_list("Config:\n```yaml\n- a\n- b\n```")  # list-like lines inside code
    assert not has_bullet_list("Monday: run\nTuesday: rest")  # no markers
    assert not has_bullet_list("| a | b |\n|---|---|\n| 1 | 2 |")  # a table
    # an outline's consecutive letters or numerals, explanations between them allowed
    assert has_bullet_list("a. Find the mean.\n$$x$$\nb. Find the variance.")
    assert has_bullet_list("(a) the first part\n\n(b) the second part")
    assert has_bullet_list("I. Introduction\nII. Method")
    assert not has_bullet_list("A. Smith wrote the book.\nC. Jones reviewed it.")  # initials, not in sequence
    assert not has_bullet_list("I. M. Pei designed it.")


@pytest.mark.parametrize("response", [
    "This may help.", "It is possible that it rains.", "I think so", "This may not work on every website.",
    "The issue is likely a caching problem.", "Results generally improve with more data.", "It depends on your budget.",
    "You may experience mild side effects.",  # a prediction about the reader, not advice
    "A leak under the sink could indicate a loose fitting.", "Hops are usually added late in the boil.",
])
def test_hedged(response):
    assert is_hedged(response)


@pytest.mark.parametrize("response", [
    "The meeting is in May.",  # the month
    "You could try the other door.", "You may want to restart the router.", "You may need to install it first.",
    "If you enjoyed Dune, you might also enjoy Hyperion.",  # advice / a step addressed to the reader
    "May I suggest a walk?", "Could you clarify the question?", "I could not find the file.",
    "Caesar's military might was decisive.",  # the noun
    "A quick routine could include:\n- squats\n- lunges",  # a list frame
    "It is possible to grow tomatoes indoors.",  # feasibility
    "There are potential risks and possible side effects at typical doses.",  # adjectives
    "Cats often sleep during the day.", "Walking around the world takes about 22 years.",  # frequency, approximation
    "```python\nmonths = {'may': 5, 'june': 6}\n```",  # code
    "My idea is to explore its psychology. I could also discuss the history.",  # a proposal of the writer's
    "For example, x could be 1, 2 or 12.",  # a value of a variable
    "Reinvest your earnings. This could be in the form of new equipment.",  # frames proposals
])
def test_not_hedged(response):
    assert not is_hedged(response)


def test_narration_in_requested_fiction_is_not_hedged():
    story = "Perhaps another day, she said, and the device might still be found."
    assert is_hedged(story, "Summarise the meeting notes.")
    assert not is_hedged(story, "Write a short story about Cheshire and Green Arrow.")
    assert not is_hedged(story, "Write an interesting backstory for my ranger character.")
    assert is_hedged(story, "Write a patent for a novel way of issuing tax certificates.")  # "novel" the adjective
    assert is_hedged("I could be wrong about the date.")  # the writer's doubt


def test_hedge_that_repeats_the_prompt_is_not_the_writers():
    answer = "There are several reasons why someone might prefer to shop locally."
    assert is_hedged(answer)  # without the prompt "might prefer" reads as a hedge
    assert not is_hedged(answer, "Why might someone prefer to shop locally?")  # the question's inversion
    assert not is_hedged("Time can seem to slow down in danger.", "Why can time seem to slow down in danger?")
    assert is_hedged("It may rain.", "Why might someone prefer to shop locally?")  # a different phrase counts
    assert drift_counters([answer], ["Why might someone prefer to shop locally?"]).n_hedged == 0
    with pytest.raises(TypeError):
        is_hedged("It may rain.", 3)


def test_counters_on_the_labelled_real_answers():
    # 966 hand-labelled answers of six models (benchmarks/data/drift_labels.jsonl), so a change that breaks a rule on
    # real answers fails here (the per-part figures are the benchmark's): the first reader's 504 at the target; the
    # second to fifth readers' F, G, H and the sixth to eighth readers' I (tuned on) and the ninth to eleventh
    # readers' held-out J at their measured figures (restating's recall and some parts' hedge precision are below
    # the target and the README says so)
    from benchmarks.drift_counters import LABELS, confusion, load

    rows = load()
    assert len(rows) == 966
    first = [r for r in rows if r["split"] not in ("heldout_f", "heldout_g", "heldout_h", "heldout_i", "heldout_j")]
    assert len(first) == 504
    for label in LABELS:
        c = confusion(first, label)
        assert c["precision"] >= 0.85 and c["recall"] >= 0.85, (label, c["precision"], c["recall"])
    bullets = (0.95, 0.95)
    floors = {"heldout_f": {"restates_question": (0.9, 0.67), "has_bullet_list": bullets, "is_hedged": (0.9, 0.95)},
              "heldout_g": {"restates_question": (0.9, 0.9), "has_bullet_list": bullets, "is_hedged": (0.7, 0.9)},
              "heldout_h": {"restates_question": (0.9, 0.75), "has_bullet_list": bullets, "is_hedged": (0.95, 0.95)},
              "heldout_i": {"restates_question": (0.8, 0.85), "has_bullet_list": bullets, "is_hedged": (0.75, 0.95)},
              "heldout_j": {"restates_question": (0.85, 0.75), "has_bullet_list": bullets, "is_hedged": (0.85, 0.95)}}
    for split, by_label in floors.items():
        part = [r for r in rows if r["split"] == split]
        assert len(part) == (96 if split in ("heldout_i", "heldout_j") else 90)
        for label, (precision, recall) in by_label.items():
            c = confusion(part, label)
            assert c["precision"] >= precision and c["recall"] >= recall, (split, label, c["precision"], c["recall"])


def test_drift_counters_hand_worked():
    prompts = ["How do plants convert sunlight into chemical energy?"] * 4
    responses = [
        "Plants convert sunlight into chemical energy in several steps. It may vary.",  # restates, hedged
        "Photosynthesis.\n- light\n- water",  # bullets
        "Chlorophyll absorbs light and the plant stores sugar for later use today.",  # none
        "Perhaps:\n1. light\n2. water",  # hedged, bullets
    ]
    c = drift_counters(responses, prompts)
    assert c.n == 4 and (c.n_restating, c.n_bullets, c.n_hedged) == (1, 2, 2)
    assert (c.restating_pct, c.bullets_pct, c.hedged_pct) == (25.0, 50.0, 50.0)
    # whitespace words: 12, 5, 12, 5 -> sorted 5, 5, 12, 12 -> median 8.5
    assert c.lengths == (12, 5, 12, 5) and c.median_length_tokens == 8.5
    # any length function: characters 75, 31, 73, 26 -> median (31 + 73) / 2 = 52
    assert [len(r) for r in responses] == [75, 31, 73, 26]
    assert drift_counters(responses, prompts, tokenizer_len=len).median_length_tokens == 52.0
    with pytest.raises(ValueError, match="differ"):
        drift_counters(["a"], [])
    with pytest.raises(ValueError, match="no responses"):
        drift_counters([], [])


# ---------------------------------------------------------------------------------------------
# DESIGN.md seed figures
# ---------------------------------------------------------------------------------------------


def test_seed_counters_across_rounds_table():
    t = drift_table(SEED)
    assert list(t.index) == [0, 1, 2]
    assert t["median_length_tokens"].tolist() == [180, 260, 340]
    assert t["restating_pct"].tolist() == [8, 31, 52]
    assert t["bullets_pct"].tolist() == [22, 44, 67]
    assert t["hedged_pct"].tolist() == [14, 29, 41]
    print("\n" + t.to_string())


def test_seed_documented_drift_round_0_to_2_blocks_on_every_counter():
    g = drift_gate(SEED[2], SEED[0])
    assert g.verdict == "block"
    rows = {r["counter"]: r for r in g.table}
    assert all(rows[k]["jumped"] for k in COUNTERS)
    assert rows["median_length_tokens"]["change"] == pytest.approx(100 * (340 / 180 - 1))  # +88.9%
    assert (rows["restating_pct"]["change"], rows["bullets_pct"]["change"], rows["hedged_pct"]["change"]) == (44, 45, 27)
    # figures without n cannot claim evidence
    assert [f.values["basis"] for f in g.findings] == ["no_sample_sizes"] * 4


def test_seed_each_round_step_also_blocks():
    # defaults: length 25% relative, shares 10 points; steps are +44%/+31% length, >= 12 points elsewhere
    for prev, cur in ((0, 1), (1, 2)):
        g = drift_gate(SEED[cur], SEED[prev])
        assert g.verdict == "block"
        assert all(r["jumped"] for r in g.table), (prev, cur)
    assert DEFAULT_MAX_STEP == {"median_length_tokens": 0.25, "restating_pct": 10.0, "bullets_pct": 10.0,
                                "hedged_pct": 10.0}


def test_small_movement_passes_and_steps_are_configurable():
    cur = DriftCounters.from_figures(200, 12, 25, 16)  # +11% length, +4/+3/+2 points
    assert drift_gate(cur, SEED[0]).verdict == "pass"
    # only the length gated, with a 100% step: round 0 -> 2 (+89%) passes
    g = drift_gate(SEED[2], SEED[0], {"median_length_tokens": 1.0, "restating_pct": None, "bullets_pct": None,
                                      "hedged_pct": None})
    assert g.verdict == "pass" and [f.values["step"] for f in g.findings] == [100.0, None, None, None]
    # a drop counts as a jump too
    assert drift_gate(SEED[0], SEED[2]).verdict == "block"
    with pytest.raises(ValueError, match="unknown drift counter"):
        drift_gate(SEED[1], SEED[0], {"length": 0.1})
    with pytest.raises(ValueError, match="percentage"):
        DriftCounters.from_figures(180, 120, 0, 0)


def test_with_sample_sizes_the_jump_is_on_evidence():
    g = drift_gate(DriftCounters.from_figures(340, 52, 67, 41, n=200), DriftCounters.from_figures(180, 8, 22, 14, n=200))
    rows = {r["counter"]: r for r in g.table}
    # the shares carry Newcombe intervals; the median from figures (no per-response lengths) has none
    assert g.verdict == "block" and [f.values["basis"] for f in g.findings] == [
        "no_sample_sizes", "on_evidence", "on_evidence", "on_evidence"]
    assert rows["restating_pct"]["ci_low"] > 0 and g.metrics["restating_pct_change"].n == 400
    # a 12-point jump on 30 responses each: beyond the step but the interval includes 0
    g2 = drift_gate(DriftCounters.from_figures(180, 20, 22, 14, n=30), DriftCounters.from_figures(180, 8, 22, 14, n=30))
    jumped = [f.values for f in g2.findings if f.code == "counter_jumped"]
    assert g2.verdict == "block" and [(v["counter"], v["change"], v["basis"]) for v in jumped] == [
        ("restating_pct", 12.0, "could_be_noise")]
    assert jumped[0]["ci_low"] < 0 < jumped[0]["ci_high"]


def test_median_length_bootstrap_interval_from_lengths():
    prompts = ["q"] * 40
    short = drift_counters(["word " * 10] * 40, prompts)
    long = drift_counters(["word " * 20] * 40, prompts)
    g = drift_gate(long, short)
    m = g.metrics["median_length_tokens_change"]
    assert m.value == pytest.approx(100.0) and m.ci_low == pytest.approx(100.0) and m.ci_high == pytest.approx(100.0)
    assert g.verdict == "block" and g.finding("counter_jumped").values["basis"] == "on_evidence"
