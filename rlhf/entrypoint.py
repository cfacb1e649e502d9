"""What a stage's ``main()`` calls around its work: logging and W&B setup, the blocked exit code, a quick exit.
(Rejected rows are handled by ``data.validation.handle_rejects``: rows are the data layer's business.)"""

from __future__ import annotations

import atexit
import gc
import logging

from .distributed import check_launch
from .manifest import precision_name
from .tracking import setup_wandb

logger = logging.getLogger(__name__)


_quick_exit_registered = False


def skip_collection_at_exit() -> None:
    """Spare this process the garbage collector's passes over every live object when the interpreter exits.

    CPython's shutdown (``Py_FinalizeEx``) runs full collections while it tears the modules down; with torch,
    transformers, TRL and Prefect imported that walks millions of objects, 1.5-1.8 s a process on a 2-core CPU
    (a round's CLI process: about 3 s), paid by every stage and by the flow that waits for it. This registers
    ``gc.freeze`` with atexit, which moves every object to the permanent generation, skipped by those passes;
    handlers run last in, first out, so it runs after the handlers registered later (W&B's, Prefect's, the
    stage's own) and before those registered at import (logging's flush), none of which needs a collection.
    What is left undone: finalizers of the objects still alive at exit that only a collection frees, those in
    reference cycles and those the globals of ``__main__`` (the stage's own module) hold; CPython does not promise
    to run them at exit, and a stage module must therefore not keep an open file or connection in a global. Still
    done: the atexit handlers (logging's flush and close, W&B's finish,
    multiprocessing's workers, ``weakref.finalize`` callbacks such as temporary folders' cleanup), the standard
    streams' flush; and a stage writes and closes its outputs before it returns. Idempotent.
    """
    global _quick_exit_registered
    if not _quick_exit_registered:
        atexit.register(gc.freeze)
        _quick_exit_registered = True


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
    skip_collection_at_exit()
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
