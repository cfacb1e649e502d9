"""Cluster launch of a stage: an sbatch script for Slurm (:mod:`flows.launch.slurm`) and an Indexed Job with a
headless Service for Kubernetes (:mod:`flows.launch.kubernetes`). Orchestration only: both start the same
``accelerate launch -m <stage module>`` a local run starts, on every node, with the world size they asked for
exported as ``RLHF_EXPECTED_WORLD_SIZE`` (the stage refuses to train at any other size) and the collective
timeout as ``RLHF_COLLECTIVE_TIMEOUT_S``."""
