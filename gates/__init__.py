"""Release gates: pure functions from generations + judgments to a ``GateResult``.

The stage (``evaluate.main``) is a checklist over small modules: ``config`` (GateStageConfig), ``inputs`` (checks
before any model loads), ``generation`` (suites and answers), ``measure`` (judge preferences, judge agreement,
graded answers -> ``Measurements``), ``decide`` (the one pure function from measurements to GateResults),
``render`` and ``report`` (Markdown / JSON / JUnit XML). Each gate's rule lives in its own module: ``judge``,
``winrate``, ``intent``, ``refusal``, ``capability``, ``sycophancy``, ``drift``, ``citations``; ``result`` holds
GateResult, Metric and release_verdict. Scoring, labels and agreement statistics are shared code (``judging``).
"""
