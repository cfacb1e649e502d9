"""Data layer of rlhf-flywheel: schemas, validation, converters, loaders and the demo bundle.

* :mod:`data.schemas` -- pydantic row models (Conversation, PreferencePair, EvalPrompt, ...).
* :mod:`data.validation` -- strict / lenient per-row validation, reject files, DataValidationError.
* :mod:`data.converters` -- pure functions from the shared dataset formats to the schemas.
* :mod:`data.loaders` -- ``load_sft``, ``load_pairs``, ``load_eval_prompts``, ``to_hf_dataset``, ...
* :mod:`data.bundle` -- ``demo_path`` for the offline demo bundle in ``data/demo/``.
"""
