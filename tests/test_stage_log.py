"""A stage's output reaches the flow log at its own level, and its progress bars at most every few seconds.

The bar lines are tqdm's own (the library the trainers use), written with ``\\r`` and read back with universal
newlines as the launcher (flows/interrupt.py) reads a stage's pipe.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

from tqdm import tqdm

from flows.stage_log import StageLogRelay, line_level


def tqdm_lines(total: int, desc: str = "") -> list[str]:
    buffer = io.StringIO()
    for _ in tqdm(range(total), desc=desc or None, file=buffer, mininterval=0, miniters=1, ascii=True):
        pass
    return io.StringIO(buffer.getvalue(), newline=None).read().splitlines()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_bar_is_relayed_at_most_every_period_and_once_at_its_total():
    lines = tqdm_lines(50, desc="train")
    assert len(lines) >= 51  # tqdm refreshed at every step
    clock, relayed = Clock(), []
    relay = StageLogRelay("sft", lambda level, msg: relayed.append((level, msg)), every_s=10, clock=clock)
    for line in lines:
        # a step a second: the clock follows the step the line shows (tqdm may print a step twice, e.g. a refresh
        # and its close, so the line's index is not its step)
        shown = re.search(r"(\d+)/50", line)
        clock.now = float(shown.group(1)) if shown else clock.now
        relay(line)
    steps = [msg.split("|")[-1].split()[0] for _, msg in relayed]
    # first refresh, then one every 10 s (steps 10, 20, 30, 40: the line at second i shows i/50), 100% once
    assert steps == ["0/50", "10/50", "20/50", "30/50", "40/50", "50/50"]
    assert all(level == logging.INFO and msg.startswith("[sft] train:") for level, msg in relayed)


def test_two_bars_are_throttled_apart_and_a_restarted_bar_reports_its_end_again():
    clock, relayed = Clock(), []
    relay = StageLogRelay("dpo", lambda level, msg: relayed.append(msg), every_s=10, clock=clock)
    for line in tqdm_lines(3, desc="train") + tqdm_lines(2, desc="eval") + tqdm_lines(3, desc="train"):
        relay(line)  # all at t = 0
    ends = [m for m in relayed if "3/3" in m or "2/2" in m]
    assert len(ends) == 3  # each bar's 100% line, the restarted train bar's too
    assert sum("eval:" in m for m in relayed) == 2  # its first refresh, and its end


def test_lines_keep_their_level():
    assert line_level("2026-12-02 04:31:07,123 WARNING sft.train: max_steps overrides epochs") == logging.WARNING
    assert line_level("2026-12-02 04:31:07,123 INFO rlhf.trainer_stage: saved") == logging.INFO
    assert line_level("2026-12-02 04:31:07,123 ERROR dpo.train: reference hash changed") == logging.ERROR
    assert line_level("Traceback (most recent call last):") == logging.ERROR
    assert line_level("torch.OutOfMemoryError: CUDA out of memory.") == logging.ERROR
    assert line_level("ValueError: max_prompt_length must be positive") == logging.ERROR
    assert line_level("plain stage output") == logging.INFO
    assert line_level("  File \"x.py\", line 3, in <module>") == logging.INFO


def test_a_real_python_warning_is_relayed_as_a_warning():
    out = subprocess.run([sys.executable, "-c", "import warnings; warnings.warn('old key', FutureWarning)"],
                         capture_output=True, text=True, check=True).stderr.splitlines()
    relayed = []
    relay = StageLogRelay("gates", lambda level, msg: relayed.append(level))
    for line in out:
        relay(line)
    assert relayed[0] == logging.WARNING  # "<string>:1: FutureWarning: old key"


def test_a_failed_stage_traceback_is_relayed_once_not_again_with_the_launchers_repeat(tmp_path):
    """A stage that fails under the real ``accelerate launch`` prints its traceback; the launcher then raises from a
    RuntimeError holding that stderr and prints it all again with its own frames. The flow log gets the stage's
    traceback once, one line saying what was left out, and the launcher's CalledProcessError; every line still
    reaches the log file."""
    import os

    from flows.interrupt import run_process_group

    script = tmp_path / "failing_stage.py"
    script.write_text(
        "import sys\n"
        "print('stage: step 1 of 3', file=sys.stderr)\n"
        "try:\n"
        "    raise ValueError('hidden size 8 is not a multiple of 32 heads')\n"
        "except ValueError as err:\n"
        "    raise RuntimeError('could not load the base model') from err\n")
    relayed, written = [], []
    relay = StageLogRelay("sft", lambda level, message: relayed.append((level, message)))

    def on_line(line):
        written.append(line)
        relay(line)

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    rc = run_process_group(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, on_line=on_line)
    assert rc == 1
    text = "".join(written)
    assert text.count("ValueError: hidden size 8") == 2  # the stage's traceback, and the launcher's repeat of it
    messages = [m for _, m in relayed]
    assert sum("ValueError: hidden size 8" in m for m in messages) == 1
    assert sum("RuntimeError: could not load the base model" in m for m in messages) == 1
    assert sum("stage: step 1 of 3" in m for m in messages) == 1
    assert any("accelerate repeated" in m and "stage.log" in m for m in messages)
    assert not any("accelerate/commands/launch.py" in m for m in messages)  # the launcher's frames
    called = [(lv, m) for lv, m in relayed if "subprocess.CalledProcessError" in m]
    assert len(called) == 1 and called[0][0] == logging.ERROR and "exit status 1" in called[0][1]
