"""Launch a stage on Kubernetes: a headless Service and an Indexed Job, one pod a node, torchrun rendezvous.

Plain ``batch/v1`` objects, so no operator is needed and the manifest is checked offline against the Kubernetes
API schema (``kubernetes-validate``, strict: unknown fields are errors); it is the pattern JobSet and the Kubeflow
trainer generate. Pod ``i`` of the Job gets ``JOB_COMPLETION_INDEX=i`` (its machine rank) and, through the
Service (``subdomain``), the DNS name ``<job>-<i>.<service>``; every pod runs

    accelerate launch --config_file <zero3> --num_machines N --num_processes N*G --machine_rank $JOB_COMPLETION_INDEX
        --rdzv_backend c10d --main_process_ip <job>-0.<service> --main_process_port P -m <stage module> ...

``accelerate launch`` runs ``torch.distributed.run`` (torchrun): the c10d rendezvous at pod 0 waits until all N
nodes have joined, so a pod that starts late joins, and a world that never fills fails after the rendezvous
timeout instead of training on fewer processes. The pods export ``RLHF_EXPECTED_WORLD_SIZE=N*G`` and
``RLHF_COLLECTIVE_TIMEOUT_S`` (checked by the stage). ``backoffLimit: 0``: a failed pod fails the Job, nothing
retrains on its own. The runs folder is a shared volume (a ReadWriteMany PersistentVolumeClaim), so the stage's
manifest lands where the flow reads it.

    python -m flows.launch.kubernetes --stage sft --preset 8b/full --round-id r1 --image REGISTRY/rlhf:TAG \\
        --nodes 2 --pvc rlhf-runs > sft-job.yaml
    kubectl apply -f sft-job.yaml && kubectl wait --for=condition=complete job/rlhf-r1-sft --timeout=24h
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import sys
from pathlib import Path, PurePosixPath

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlhf.credentials import check_env_name
from rlhf.registry import STAGES
from rlhf.round_id import check_round_id
from rlhf.registry import stage as registry_stage


REPO_ROOT = Path(__file__).resolve().parents[2]


class KubernetesJob(BaseModel):
    """Resources and environment of a stage's Kubernetes Job."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    image: str = Field(..., description="Container image with this repository and its environment installed.")
    namespace: str = Field("default", description="Namespace of the Job and its Service.")
    nodes: int = Field(1, ge=1, description="Pods = accelerate machines (one a GPU node).")
    gpus_per_node: int = Field(8, ge=1, description="nvidia.com/gpu a pod = processes a pod.")
    cpu: str = Field("64", description="CPU request and limit of a pod.")
    memory: str = Field("900Gi", description="Memory request and limit of a pod.")
    shm: str = Field("64Gi", description="/dev/shm size (NCCL and the data loaders use shared memory).")
    port: int = Field(29500, ge=1024, le=65535, description="c10d rendezvous port on pod 0.")
    collective_timeout_s: int = Field(
        1800, ge=1, description="Timeout of every collective (RLHF_COLLECTIVE_TIMEOUT_S)."
    )
    pvc: str = Field(..., description="ReadWriteMany PersistentVolumeClaim holding the runs folder.")
    runs_mount: str = Field("/runs", description="Where the claim is mounted; stage outputs go below it.")
    workdir: str = Field("/workspace/rlhf-flywheel", description="Repository root inside the image.")
    python: str = Field("python", description="Python inside the image.")
    accelerate_config: str = Field("recipes/accelerate_configs/zero3.yaml", description="Relative to workdir.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="e.g. {gpu: h100}.")
    active_deadline_s: int = Field(86400, ge=1, description="The Job is stopped after this many seconds.")
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables read from Kubernetes Secrets: NAME -> Secret name (its key NAME holds the "
        "value), e.g. {OPENAI_API_KEY: judge-credentials}. The manifest names the Secret, never the value.",
    )

    @field_validator("secret_env")
    @classmethod
    def _secret_refs(cls, value: dict[str, str]) -> dict[str, str]:
        for name, secret in value.items():
            check_env_name(name, "secret_env")
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", secret):
                raise ValueError(f"secret_env.{name}: a Secret's name (DNS subdomain: lower case, digits, -, .), "
                                 "never the value itself")
        return value

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def _cores(cpu: str) -> int:
    """Whole cores of a Kubernetes CPU quantity (``64``, ``63.5``, ``64000m``)."""
    return int(float(cpu[:-1]) / 1000) if cpu.endswith("m") else int(float(cpu))


def resource_name(round_id: str, stage: str) -> str:
    """``rlhf-<round>-<stage>`` as a DNS-1035 label (lower case, ``-``, at most 52 characters so that the pod
    names ``<job>-<index>-<suffix>`` stay under 63).

    Where the round id had to be changed to fit (upper case, characters outside ``[a-z0-9-]``, or too long), the
    name is ``rlhf-<round, cut>-<8 hex of sha256(round id)>-<stage>``: the stage is never cut off and two round
    ids never share a Job, Service or rendezvous host.
    """
    def clean(text: str) -> str:
        return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")

    rnd, stg = clean(round_id), clean(stage)
    plain = "-".join(p for p in ("rlhf", rnd, stg) if p)
    if rnd == round_id and len(plain) <= MAX_NAME:
        return plain
    tag = hashlib.sha256(round_id.encode()).hexdigest()[:8]
    room = MAX_NAME - len("rlhf-") - len(tag) - (len(stg) + 1 if stg else 0) - 1
    head = rnd[: max(room, 0)].strip("-")
    return "-".join(p for p in ("rlhf", head, tag, stg) if p)


MAX_NAME = 52


def render_manifests(
    job: KubernetesJob, *, stage: str, round_id: str, preset: str, extra_args: list[str] = ()
) -> list[dict]:
    """[Service, Job] for ``stage`` of ``round_id`` with the recipe ``recipes/<preset>/<recipe>.yaml`` (inside the
    image) and the output folder ``<runs_mount>/<round_id>/<stage>``. ``extra_args`` go to the stage (e.g.
    ``--sft_dir /runs/r1/sft`` for DPO).

    Raises:
        ValueError: an unknown stage (rlhf.registry).
    """
    entry = registry_stage(stage)
    name = resource_name(round_id, stage)
    labels = {
        "app.kubernetes.io/name": "rlhf-flywheel",
        "rlhf/round": resource_name(round_id, ""),
        "rlhf/stage": stage.replace("_", "-"),
    }
    output_dir = PurePosixPath(job.runs_mount) / round_id / stage
    recipe = PurePosixPath("recipes") / preset / f"{entry.name}.yaml"
    launch = [
        job.python, "-m", "accelerate.commands.launch",
        "--config_file", job.accelerate_config,
        "--num_machines", str(job.nodes),
        "--num_processes", str(job.world_size),
        "--rdzv_backend", "c10d",
        "--main_process_ip", f"{name}-0.{name}",
        "--main_process_port", str(job.port),
        "--max_restarts", "0",
        "--num_cpu_threads_per_process", str(max(1, _cores(job.cpu) // job.gpus_per_node)),
        "-m", entry.module,
        "--config", str(recipe), "--output_dir", str(output_dir), *extra_args,
    ]  # fmt: skip
    # the machine rank is the pod's completion index, read by the shell at start
    script = (
        f"mkdir -p {shlex.quote(str(output_dir.parent))} && exec {shlex.join(launch[:3])} "
        f'--machine_rank "$JOB_COMPLETION_INDEX" {shlex.join(launch[3:])}'
    )
    env = [
        {"name": "RLHF_EXPECTED_WORLD_SIZE", "value": str(job.world_size)},
        {"name": "RLHF_COLLECTIVE_TIMEOUT_S", "value": str(job.collective_timeout_s)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        *({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
          for name, secret in sorted(job.secret_env.items())),
    ]
    resources = {"cpu": job.cpu, "memory": job.memory, "nvidia.com/gpu": str(job.gpus_per_node)}
    pod_spec = {
        "subdomain": name,  # <job>-<index>.<service>: pod 0's name is the rendezvous address
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "stage",
                "image": job.image,
                "workingDir": job.workdir,
                "command": ["bash", "-c", script],
                "env": env,
                "ports": [{"containerPort": job.port, "name": "rendezvous"}],
                "resources": {"requests": resources, "limits": dict(resources)},
                "volumeMounts": [
                    {"name": "runs", "mountPath": job.runs_mount},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            }
        ],
        "volumes": [
            {"name": "runs", "persistentVolumeClaim": {"claimName": job.pvc}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm}},
        ],
    }
    if job.node_selector:
        pod_spec["nodeSelector"] = dict(job.node_selector)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": job.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",  # headless: DNS names for the pods, no load balancing
            "publishNotReadyAddresses": True,  # the rendezvous runs before any pod is "ready"
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "rendezvous", "port": job.port, "targetPort": job.port}],
        },
    }
    job_obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": job.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": 0,  # never retrain on its own: a failed pod fails the stage
            "activeDeadlineSeconds": job.active_deadline_s,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
    return [service, job_obj]


def to_yaml(docs: list[dict]) -> str:
    """The manifests as one multi-document YAML stream (``kubectl apply -f`` reads it)."""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flows.launch.kubernetes",
        description="Print the Kubernetes manifests (Service + Indexed Job) of one stage.",
    )
    ap.add_argument("--stage", required=True, choices=list(STAGES))
    ap.add_argument("--preset", required=True, help="recipe folder under recipes/, e.g. 8b/full")
    ap.add_argument("--round-id", required=True)
    for name, f in KubernetesJob.model_fields.items():
        if f.annotation in (str, int):
            ap.add_argument(
                f"--{name.replace('_', '-')}",
                type=f.annotation,
                required=f.is_required(),
                default=None if f.is_required() else f.default,
                help=f.description,
            )
    ap.add_argument("stage_args", nargs=argparse.REMAINDER, help="after --: arguments for the stage")
    args = vars(ap.parse_args(argv))
    extra = [a for a in args.pop("stage_args") if a != "--"]
    stage, preset, round_id = args.pop("stage"), args.pop("preset"), args.pop("round_id")
    try:
        check_round_id(round_id)  # the rule `rlhf round` applies: the output folder stays inside the runs volume
        job = KubernetesJob(**args)
    except (ValueError, ValidationError) as err:
        ap.error(str(err))
    recipe = REPO_ROOT / "recipes" / preset / f"{registry_stage(stage).name}.yaml"
    if not recipe.is_file():
        ap.error(f"--preset {preset!r}: no recipe {recipe.relative_to(REPO_ROOT)} for stage {stage} in this checkout "
                 "(the image runs the same recipes folder)")
    sys.stdout.write(to_yaml(render_manifests(job, stage=stage, round_id=round_id, preset=preset, extra_args=extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
