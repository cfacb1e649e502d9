"""What a stage's ``main()`` calls around its work: logging and W&B setup, reject handling, the blocked exit code."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .distributed import check_launch
from .tracking import setup_wandb

logger = logging.getLogger(__name__)


def setup_stage(name: str, args) -> None:
    """Logging, the launch check and W&B for a stage (precision was resolved when the config was built). Call first
    in ``main()``.

    Raises ``rlhf.distributed.WorldSizeMismatch`` when ``RLHF_EXPECTED_WORLD_SIZE`` differs from the launch's world
    size; sets ``args.ddp_timeout`` from ``RLHF_COLLECTIVE_TIMEOUT_S`` (``rlhf.distributed.check_launch``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_launch(args)
    logger.info("%s: precision %s", name, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    if "wandb" in (args.report_to or []):
        setup_wandb(run_name=args.run_name or name, group=args.round_id, output_dir=args.output_dir)


# Exit code of a gate run whose report is written and whose release is blocked (CI fails on it).
BLOCKED_EXIT_CODE = 3


def handle_rejects(rejects: list, n_total: int, args, what: str) -> None:
    """Strict: raise the first reject. Lenient: write them all to ``<output_dir>/rejects-<what>.jsonl`` and raise
    when their share exceeds ``args.max_reject_rate``. Never silent: the count is logged either way."""
    from data.validation import DataValidationError

    if not rejects:
        return
    if args.data_mode == "strict":
        raise rejects[0]
    path = Path(args.output_dir) / f"rejects-{what}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rejects:
            f.write(json.dumps({"file": r.file, "row": r.row, "field": r.field, "reason": r.reason}) + "\n")
    rate = len(rejects) / max(n_total, 1)
    logger.warning("%s: %d of %d rows rejected (%.1f%%), listed in %s", what, len(rejects), n_total, 100 * rate, path)
    if rate > args.max_reject_rate:
        raise DataValidationError(
            f"{len(rejects)}/{n_total} rows rejected > max_reject_rate {args.max_reject_rate}", file=str(path)
        )
