"""What a stage's ``main()`` calls around its work: logging and W&B setup, the blocked exit code. (Rejected rows are
handled by ``data.validation.handle_rejects``: rows are the data layer's business.)"""

from __future__ import annotations

import logging

from .distributed import check_launch
from .manifest import precision_name
from .tracking import setup_wandb

logger = logging.getLogger(__name__)


def setup_stage(name: str, args, *, round_id: str | None = None, tracking: bool = True) -> dict:
    """Logging, the launch check, the precision (logged) and W&B for a stage. Call first in ``main()``, after the
    config is parsed (precision was resolved when it was built).

    Args:
        args: the stage config: ``output_dir``, ``report_to`` and ``run_name`` (optional), ``round_id`` unless
            given, ``bf16``/``fp16`` for a TRL config (other configs log no precision here).
        round_id: the W&B group, where the config keeps it elsewhere (PPO's script arguments).
        tracking: False: W&B is set up later with :func:`setup_tracking` (the gate stage, on rank 0 only, after it
            cleared its folder).

    Returns:
        ``rlhf.distributed.check_launch``'s ``{"world_size", "collective_timeout_s"}``.

    Raises ``rlhf.distributed.WorldSizeMismatch`` when ``RLHF_EXPECTED_WORLD_SIZE`` differs from the launch's world
    size; sets ``args.ddp_timeout`` from ``RLHF_COLLECTIVE_TIMEOUT_S`` (``rlhf.distributed.check_launch``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    launch = check_launch(args)
    if hasattr(args, "bf16"):
        logger.info("%s: precision %s", name, precision_name(args))
    if tracking:
        setup_tracking(name, args, round_id=round_id)
    return launch


def setup_tracking(name: str, args, *, round_id: str | None = None) -> None:
    """W&B for the stage when ``args.report_to`` names it: run ``<round id>/<args.run_name>`` (default the stage's
    name), job type the stage's name, group the round id, files under ``args.output_dir``
    (``rlhf.tracking.setup_wandb``)."""
    if "wandb" in (args.report_to or []):
        group = round_id if round_id is not None else getattr(args, "round_id", None)
        setup_wandb(run_name=getattr(args, "run_name", None) or name, group=group, output_dir=args.output_dir,
                    job_type=name)


# Exit code of a gate run whose report is written and whose release is blocked (CI fails on it).
BLOCKED_EXIT_CODE = 3
