"""Release gates: pure functions from generations + judgments to a ``GateResult``.

Modules: ``result`` (GateResult, Metric, release_verdict), ``winrate`` (AlpacaEval win rates, raw
and length-controlled), ``refusal`` (two-sided refusal gate), ``judge`` (judge agreement and
attenuation), ``report`` (JSON / Markdown / JUnit XML reports).
"""
