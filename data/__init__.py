"""Data layer of rlhf-flywheel: schemas, labels, validation, converters, loaders, decontamination and the demo
bundle. It imports only ``rlhf`` (plumbing) below it; ``judging`` and the stages import it.

* :mod:`data.schemas` -- pydantic row models (Conversation, PreferencePair, EvalPrompt, ...).
* :mod:`data.labels` -- the expert-label convention (0 tie, 1 first better, 2 second better) and AlpacaEval
  preferences.
* :mod:`data.validation` -- strict / lenient per-row validation, reject files, DataValidationError, a stage's
  ``handle_rejects``.
* :mod:`data.converters` -- pure functions from the shared dataset formats to the schemas.
* :mod:`data.loaders` -- ``load_sft``, ``load_pairs``, ``load_eval_prompts``, ``to_hf_dataset``, ...
* :mod:`data.bundle` -- ``demo_path`` for the offline demo bundle in ``data/demo/``.
* :mod:`data.fingerprint` -- ``data_fingerprint``: a data source's content hash, for cache keys and manifests.
"""
