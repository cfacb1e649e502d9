"""What a stage's ``main()`` calls around its work: logging and W&B setup, the blocked exit code. (Rejected rows are
handled by ``data.validation.handle_rejects``: rows are the data layer's business.)"""

from __future__ import annotations

import logging

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
