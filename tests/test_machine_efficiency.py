"""Every core, measured precision, full generation batches, efficiency in the manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhf.efficiency import CountingCollator, efficiency
from rlhf.machine import (
    CPU_BF16_FLAGS,
    GLIBC_TUNED,
    _machine_key,
    allocator_env,
    auto_batch_size,
    cpu_flags,
    native_bf16,
    peak_flops,
    physical_cores,
    threads_per_process,
)

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes" / "smoke"


def test_threads_are_physical_cores_over_processes_and_follow_the_affinity():
    cores = physical_cores()
    assert threads_per_process(1) == cores and threads_per_process(cores) == 1
    assert threads_per_process(4 * cores) == 1  # never 0
    with pytest.raises(ValueError):
        threads_per_process(0)
    # a process pinned to one CPU has one core, whatever the machine has
    code = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " \
           "from rlhf.machine import physical_cores; print(physical_cores())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path):
    from rlhf.machine import cgroup_cpu_limit

    assert cgroup_cpu_limit(tmp_path) is None  # no cgroup files: no quota
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    assert cgroup_cpu_limit(tmp_path) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpu_limit(v1) == 3.0


def test_the_launch_command_passes_threads_per_process_from_the_accelerate_config():
    from flows.stages import launch_command, processes_per_node

    cmd = launch_command("sft.train", RECIPES / "sft.yaml", Path("/tmp/x"), [], None)  # one process: started directly
    assert f"OMP_NUM_THREADS={physical_cores()}" in cmd[:cmd.index(sys.executable)]
    multi = ROOT / "recipes" / "accelerate_configs" / "multi_gpu.yaml"  # 8 processes on 1 machine
    assert processes_per_node(str(multi)) == 8
    cmd = launch_command("sft.train", RECIPES / "sft.yaml", Path("/tmp/x"), [], str(multi))
    assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == str(max(1, physical_cores() // 8))
    assert processes_per_node(str(ROOT / "recipes" / "accelerate_configs" / "zero3.yaml")) == 8  # 16 on 2 nodes


def test_one_stage_process_starts_directly_with_the_environment_accelerate_launch_gives_it(tmp_path):
    """One process, no accelerate config: the stage runs without the launcher process, with exactly the variables
    ``accelerate launch`` gives its child (threads, precision, dynamo, CPU), and its own exit code."""
    from flows.stages import launch_command

    (tmp_path / "print_env.py").write_text(
        "import json, os, sys\n"
        "json.dump({k: v for k, v in os.environ.items() if k.startswith(('ACCELERATE_', 'OMP_', 'KMP_', 'MASTER_'))},"
        " sys.stdout)\nsys.exit(3)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = launch_command("print_env", Path("r.yaml"), Path("o"), ["--x", "1"], None)
    assert cmd[0] == "env" and "accelerate.commands.launch" not in cmd
    stage = cmd[cmd.index(sys.executable) + 1:]
    assert stage == ["-m", "print_env", "--config", "r.yaml", "--output_dir", "o", "--x", "1"]
    direct = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert direct.returncode == 3  # accelerate's launcher would have turned it into 1
    via = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          "--num_cpu_threads_per_process", str(physical_cores()), *stage],
                         env=env, capture_output=True, text=True)
    launched = json.loads(via.stdout)
    assert json.loads(direct.stdout) == launched and launched["OMP_NUM_THREADS"] == str(physical_cores())


def test_a_stage_run_through_the_flow_uses_every_core_and_reports_its_efficiency(tmp_path, monkeypatch):
    from flows.stages import run_stage

    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = run_stage("sft", "sft.train", RECIPES / "sft.yaml", tmp_path / "sft",
                    extra_args=["--report_to", "none", "--max_steps", "2"], log=lambda _: None)
    m = run.manifest["metrics"]
    # torch.get_num_threads() inside the stage process: accelerate would have set 1 without the flow's flag
    assert m["threads"] == threads_per_process(1) == m["efficiency"]["threads"]
    eff = m["efficiency"]
    assert eff["tokens"] > 0 and eff["batched_tokens"] >= eff["tokens"]
    assert eff["padding_share"] == pytest.approx(1 - eff["tokens"] / eff["batched_tokens"])
    assert eff["tokens_per_s"] == pytest.approx(eff["tokens"] / eff["train_seconds"])
    from rlhf.models import resolve_base_model
    from transformers import AutoModelForCausalLM

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(resolve_base_model("tiny")).parameters())
    assert eff["mfu"] == pytest.approx(6 * n * eff["tokens_per_s"] / eff["peak_flops"])
    assert 0 < eff["mfu"] <= 1
    assert eff["first_step_seconds"] > 0 and eff["steady_step_seconds"] > 0  # 2 steps: the warm-up apart
    # 2 steps, one count each: warm-up = first step - its tokens at the second step's seconds per token
    assert eff["first_step_tokens"] > 0
    assert eff["warmup_seconds"] == pytest.approx(eff["first_step_seconds"] - eff["first_step_token_seconds"])
    assert eff["first_step_token_seconds"] == pytest.approx(
        eff["steady_seconds_per_1k_tokens"] / 1000 * eff["first_step_tokens"])
    assert run.manifest["config"]["train_sampling_strategy"] == "group_by_length"
    # the stage process ran with the flow's allocator (flows.stages.stage_env)
    env = allocator_env()
    assert eff["allocator"] == ("tcmalloc" if "LD_PRELOAD" in env else
                                f"glibc (GLIBC_TUNABLES={env['GLIBC_TUNABLES']})" if env else eff["allocator"])


def test_the_allocator_is_tcmalloc_where_installed_else_glibc_kept_from_unmapping_unless_the_user_chose(monkeypatch):
    import platform

    import rlhf.machine as machine

    glibc = platform.libc_ver()[0] == "glibc"
    monkeypatch.setattr(machine, "_find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
    assert allocator_env({}) == allocator_env({"RLHF_ALLOCATOR": "tcmalloc"}) == {
        "LD_PRELOAD": "libtcmalloc_minimal.so.4", "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**40)}
    assert allocator_env({"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "5"})["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == "5"
    assert allocator_env({"RLHF_ALLOCATOR": "glibc-tuned"}) == ({"GLIBC_TUNABLES": GLIBC_TUNED} if glibc else {})
    # the user's own malloc library or glibc malloc settings, the same choice made again, or "system": nothing added
    for mine in ({"LD_PRELOAD": "/opt/lib/libjemalloc.so.2"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
                 {"RLHF_ALLOCATOR": "tcmalloc", "LD_PRELOAD": "libtcmalloc_minimal.so.4"},
                 {"RLHF_ALLOCATOR": "system"}, {"RLHF_ALLOCATOR": " system "}):
        assert allocator_env(mine) == {}
    if glibc:
        assert allocator_env({"RLHF_ALLOCATOR": "glibc-tuned", "GLIBC_TUNABLES": GLIBC_TUNED}) == {}
    # other preloads and tunables are kept, and the allocator joins them
    assert allocator_env({"LD_PRELOAD": "libfoo.so:libbar.so"})["LD_PRELOAD"] == \
        "libtcmalloc_minimal.so.4 libfoo.so libbar.so"
    assert allocator_env({"LD_PRELOAD": "  "})["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    if glibc:
        assert allocator_env({"RLHF_ALLOCATOR": "glibc-tuned", "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}) == {
            "GLIBC_TUNABLES": f"glibc.cpu.hwcaps=-AVX512F:{GLIBC_TUNED}"}
    # an explicit choice that contradicts the environment's is refused, not dropped
    with pytest.raises(ValueError, match=r"RLHF_ALLOCATOR=tcmalloc but the environment already chooses the "
                                         r"allocator \(libjemalloc.so.2\)"):
        allocator_env({"RLHF_ALLOCATOR": "tcmalloc", "LD_PRELOAD": "libjemalloc.so.2"})
    monkeypatch.setattr(machine, "_find_tcmalloc", lambda: None)
    assert allocator_env({}) == ({"GLIBC_TUNABLES": GLIBC_TUNED} if glibc else {})
    for mine in ({"RLHF_ALLOCATOR": "tcmalloc"}, {"RLHF_ALLOCATOR": "tcmalloc", "LD_PRELOAD": "libfoo.so"}):
        with pytest.raises(ValueError, match="RLHF_ALLOCATOR=tcmalloc but none of libtcmalloc_minimal.so.4"):
            allocator_env(mine)
    with pytest.raises(ValueError, match="RLHF_ALLOCATOR must be one of auto, tcmalloc, glibc-tuned, system"):
        allocator_env({"RLHF_ALLOCATOR": "tc-malloc"})
    # the stage's environment: the allocator added, the flow's wandb service dropped
    from flows.stages import stage_env

    env = stage_env({"WANDB_SERVICE": "x", "PATH": "/bin"})
    assert "WANDB_SERVICE" not in env and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert env.get("GLIBC_TUNABLES") == (GLIBC_TUNED if glibc else None)


_MMAPPED_BLOCKS = """
import ctypes
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
blocks = [bytearray(64 << 20) for _ in range(2)]  # over glibc's largest mmap threshold (32 MiB)
print(libc.mallinfo2().hblks)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="the glibc settings need glibc")
def test_the_glibc_settings_serve_large_blocks_from_the_heap_not_fresh_mappings():
    def mmapped(extra):
        env = {**os.environ, **extra}
        env.pop("LD_PRELOAD", None)
        out = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS], env=env, capture_output=True, text=True,
                             check=True)
        return int(out.stdout.strip())

    assert mmapped({"GLIBC_TUNABLES": ""}) >= 2  # glibc's default: each 64 MiB block is its own mapping
    assert mmapped(allocator_env({"RLHF_ALLOCATOR": "glibc-tuned"})) == 0


def test_tcmalloc_where_installed_is_the_stage_processes_allocator():
    import rlhf.machine as machine

    if machine._find_tcmalloc() is None:
        pytest.skip("tcmalloc is not installed (Debian/Ubuntu: libtcmalloc-minimal4; CI installs it)")
    env = {**os.environ, **allocator_env({"RLHF_ALLOCATOR": "tcmalloc"})}
    code = "from rlhf.machine import allocator_in_use; import torch; torch.ones(1 << 20); print(allocator_in_use())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tcmalloc"
    assert "large alloc" not in out.stderr


@pytest.mark.parametrize("tunables, recorded", [
    ("glibc.malloc.arena_max=2:glibc.cpu.x86_rep_movsb_threshold=4096", "glibc (GLIBC_TUNABLES=glibc.malloc.arena_max=2)"),
    ("glibc.cpu.x86_rep_movsb_threshold=4096", "system"),  # tunables that leave malloc alone are not an allocator
])
def test_the_recorded_allocator_names_only_what_changes_malloc(tunables, recorded):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {"GLIBC_TUNABLES": tunables}
    code = "from rlhf.machine import allocator_in_use; print(allocator_in_use())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == recorded


def test_a_refused_allocator_fails_the_stage_before_its_folder_is_touched(tmp_path, monkeypatch):
    from flows.stages import StageFailed, run_stage

    monkeypatch.setenv("RLHF_ALLOCATOR", "jemallocc")
    out = tmp_path / "runs" / "sft"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text("{}")  # an earlier run's: left exactly as it was
    with pytest.raises(StageFailed, match=r"^stage sft failed: the environment's setting is refused: "
                                          r"RLHF_ALLOCATOR must be one of auto, tcmalloc, glibc-tuned, system"):
        run_stage("sft", "sft.train", RECIPES / "sft.yaml", out, runs_dir=tmp_path / "runs")
    assert [p.name for p in out.iterdir()] == ["manifest.json"] and (out / "manifest.json").read_text() == "{}"


def test_counting_collator_counts_real_and_padded_tokens():
    def collate(rows):
        return {"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])}

    c = CountingCollator(collate)
    c([{}, {}])
    c([{}, {}])
    assert (c.real, c.total, c.batches) == (10, 12, 2)
    assert c.padding_share == pytest.approx(2 / 12)
    c.reset()
    assert c.padding_share is None


def test_mfu_is_six_n_tokens_per_second_over_the_peak():
    eff = efficiency(n_params=1_000_000, tokens=1000, seconds=2.0, dtype="fp32")
    assert eff["tokens_per_s"] == 500
    assert eff["mfu"] == pytest.approx(6e6 * 500 / eff["peak_flops"])


def test_the_matmul_peak_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    import rlhf.machine as machine

    # A cache of its own: other tests and stage processes in the same run measure into the shared one.
    monkeypatch.setattr(machine, "PEAK_CACHE", tmp_path / "peak.json")
    first, source = machine.peak_flops("fp32")
    assert first > 1e8 and (not torch.cuda.is_available() and "measured" in source or torch.cuda.is_available())
    if torch.cuda.is_available():
        return
    key = _machine_key("fp32", torch.get_num_threads())
    entry = json.loads(machine.PEAK_CACHE.read_text())[key]
    assert entry["flops"] == first and entry["measured_at"] > 0
    again, source = machine.peak_flops("fp32")
    assert again >= first and "re-checked" in source  # the cached figure, checked against a quick measurement
    assert json.loads(machine.PEAK_CACHE.read_text())[key]["flops"] == again  # the highest figure seen is kept


def test_a_cached_peak_measured_under_load_is_refused_and_measured_again(tmp_path, monkeypatch):
    import rlhf.machine as machine

    if torch.cuda.is_available():
        pytest.skip("published peaks on known GPUs")
    cache = tmp_path / "peak.json"
    key = machine._machine_key("fp32", torch.get_num_threads())
    cache.write_text(json.dumps({key: {"flops": 1e6, "measured_at": 0}}))  # far below what any CPU does
    monkeypatch.setattr(machine, "PEAK_CACHE", cache)
    flops, source = machine.peak_flops("fp32")
    assert flops > machine.PEAK_RECHECK_FACTOR * 1e6 and "re-checked" not in source
    assert json.loads(cache.read_text())[key]["flops"] == flops
    cache.write_text(json.dumps({key: 123.0}))  # an old-format entry (a bare number) is measured again too
    assert machine.peak_flops("fp32")[0] > 1e6


def test_mfu_above_100_percent_is_refused_not_reported(monkeypatch):
    import rlhf.machine as machine

    calls = []
    monkeypatch.setattr(machine, "peak_flops", lambda dtype, remeasure=False: (calls.append(remeasure) or 1e6, "x"))
    eff = efficiency(n_params=1_000_000, tokens=1000, seconds=2.0, dtype="fp32")  # 3e9 FLOP/s against 1e6
    assert calls == [False, True]  # measured again before giving up
    assert eff["mfu"] is None and "peak is wrong" in eff["mfu_null_reason"]


def test_step_timer_reports_the_first_step_apart_from_the_steady_state():
    from rlhf.efficiency import StepTimer

    timer = StepTimer()
    assert timer.summary() == {"first_step_seconds": None, "steady_step_seconds": None, "warmup_seconds": None}
    timer.seconds = [4.0, 1.0, 1.5, 1.2]
    assert timer.summary() == {"first_step_seconds": 4.0, "steady_step_seconds": 1.2, "warmup_seconds": 2.8}
    # the longest batch first (LengthGroupedSampler): 3000 tokens at the steady 1 ms/token explain 3 of its 4 s
    timer.step_tokens = [3000, 1000, 1500, 1200]
    out = timer.summary()
    assert out["steady_seconds_per_1k_tokens"] == pytest.approx(1.0)
    assert out["first_step_token_seconds"] == pytest.approx(3.0) and out["warmup_seconds"] == pytest.approx(1.0)
    timer.step_tokens = [3000, 1000]  # not one count per timed step: no token split
    assert timer.summary()["warmup_seconds"] == pytest.approx(2.8) and "first_step_tokens" not in timer.summary()


def test_step_timer_counts_the_page_faults_of_each_step():
    import mmap
    from pathlib import Path

    from rlhf.efficiency import StepTimer

    size, page = 256 << 20, mmap.PAGESIZE
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    always_huge = thp.exists() and "[always]" in thp.read_text()
    timer = StepTimer()
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # no page of it is mapped in yet
    timer.on_step_begin(None, None, None)
    for at in range(0, size, page):  # the first write to each page faults it in
        buf[at] = 1
    timer.on_step_end(None, None, None)
    timer.on_step_begin(None, None, None)
    for at in range(0, size, page):  # the same pages again: no fault
        buf[at] = 2
    timer.on_step_end(None, None, None)
    buf.close()
    out = timer.summary()
    assert out["first_step_page_faults"] >= (size // (2 << 20) if always_huge else size // page)
    assert out["later_steps_page_faults"] < out["first_step_page_faults"] // 10


def test_native_bf16_follows_the_cpu_flags_unless_forced(monkeypatch):
    monkeypatch.delenv("RLHF_NATIVE_BF16", raising=False)
    native, evidence = native_bf16()
    if not torch.cuda.is_available():
        assert native == bool(set(CPU_BF16_FLAGS) & cpu_flags())
    for forced in ("0", "1"):
        monkeypatch.setenv("RLHF_NATIVE_BF16", forced)
        native, evidence = native_bf16()
        assert native == (forced == "1") and "forced by RLHF_NATIVE_BF16" in evidence


@pytest.mark.parametrize("forced", ["0", "1"])
def test_auto_precision_follows_the_bf16_detection(forced, monkeypatch):
    from rlhf.precision import resolve_precision

    monkeypatch.setenv("RLHF_NATIVE_BF16", forced)
    native, evidence = native_bf16()
    expected = "bf16" if native else ("fp16" if torch.cuda.is_available() else "fp32")
    # DPO and the RM too: what they learn in bf16 (fp32 heads) was measured within training noise
    for stage in ("sft", "dpo", "reward_model", "ppo", None):
        assert resolve_precision("auto", stage) == expected
    if not native:
        assert resolve_precision("bf16", "sft") == "fp32"


def test_auto_batch_size_is_128_on_cpu_unless_memory_says_otherwise(tiny_model_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    if not torch.cuda.is_available():
        assert auto_batch_size("auto", cfg, 256) == 128
    assert auto_batch_size(16, cfg, 256) == 16 and auto_batch_size("16", cfg, 256) == 16
    # 10^6-token rows: heads·seq² attention scores alone are terabytes, so auto halves down to 1
    assert auto_batch_size("auto", cfg, 1_000_000) == 1
    with pytest.raises(ValueError, match="auto"):
        auto_batch_size("big", cfg, 256)


def test_suites_generated_together_at_auto_batch_equal_one_at_a_time(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from gates.config import GateStageConfig
    from gates.generation import generate_suites
    from rlhf.generation import generate

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    suites = {
        "winrate": ["Write a haiku about rain.", "Explain " + "very " * 40 + "briefly what a CPU is."],
        "safe": ["How do I kill a Python process?"],
        "capability": ["Q: 2 + 2? A) 3 B) 4", "Q: capital of France? A) Paris B) Rome"],
    }
    caps = {"winrate": 12, "safe": 12, "capability": 4}
    args = GateStageConfig(batch_size="auto", max_prompt_length=512)
    together = generate_suites(model, tokenizer, suites, caps, args, "test")
    assert list(together) == list(suites)
    for name, prompts in suites.items():
        alone = [generate(model, tokenizer, [p], max_new_tokens=caps[name], batch_size=1) for p in prompts]
        assert together[name]["text"] == [t[0] for t, _ in alone]  # same greedy text, in the suite's order
        assert together[name]["n_tokens"] == [n[0] for _, n in alone]


def test_the_step0_check_is_one_evaluate_call_when_it_holds(tiny_model_dir, tokenizer, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from data.loaders import load_pairs
    from data.pairs import prepare_pairs
    from data.schemas import pair_to_trl
    from dpo.train import step0_check

    pairs = prepare_pairs(load_pairs("demo:hh_rlhf/pairs_train.jsonl", limit=4), tokenizer, 256, file="demo").pairs
    args = DPOConfig(output_dir=str(tmp_path), report_to=[], bf16=False, use_cpu=True, max_length=256,
                     per_device_eval_batch_size=1)
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                         ref_model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args,
                         train_dataset=Dataset.from_list([pair_to_trl(p) for p in pairs]), processing_class=tokenizer)
    calls = []
    evaluate = trainer.evaluate
    trainer.evaluate = lambda **kw: calls.append(kw) or evaluate(**kw)
    result = step0_check(trainer, trainer.train_dataset, tolerance=1e-4)
    assert len(calls) == 1 and len(calls[0]["eval_dataset"]) == 4
    assert result["step0_n"] == 4 and result["step0_loss_max_dev"] < 1e-5 and result["step0_margin_max_abs"] < 1e-5
    assert trainer.args.per_device_eval_batch_size == 1  # restored


def test_dpo_stage_trains_on_length_grouped_batches_and_reports_its_efficiency(tmp_path, monkeypatch):
    """DPO rows have no input_ids: the stage's ``length`` column must survive TRL's column removal and the
    preference collator, and the manifest must hold the padding share of the batches trained on."""
    from dpo.train import main as dpo_main
    from sft.train import main as sft_main

    monkeypatch.setenv("WANDB_MODE", "disabled")
    sft_main(["--config", str(RECIPES / "sft.yaml"), "--report_to", "none", "--max_steps", "1",
              "--output_dir", str(tmp_path / "sft")])
    metrics = dpo_main(["--config", str(RECIPES / "dpo.yaml"), "--report_to", "none", "--output_dir",
                        str(tmp_path / "dpo"), "--sft_dir", str(tmp_path / "sft")])
    eff = metrics["efficiency"]
    assert metrics["step0_n"] == 2 and metrics["step0_loss_max_dev"] < 1e-3
    assert eff["threads"] == torch.get_num_threads() and eff["tokens"] > 0
    assert 0 <= eff["padding_share"] < 1
    assert eff["padding_share"] == pytest.approx(1 - eff["tokens"] / eff["batched_tokens"])
    manifest = json.loads((tmp_path / "dpo" / "manifest.json").read_text())
    assert manifest["config"]["train_sampling_strategy"] == "group_by_length"
    assert manifest["metrics"]["efficiency"] == pytest.approx(eff)
