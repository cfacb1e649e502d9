"""What this machine offers a stage: physical cores (within the process's CPU affinity), native bf16, the memory
allocator a stage process runs with, and the measured matmul peak that model FLOPs utilisation is reported against.

Every function here reads the machine, never a guess: ``/sys`` CPU topology and ``sched_getaffinity`` for cores,
``/proc/cpuinfo`` flags or CUDA's capability for bf16, a timed matmul (cached per machine) or a published figure
for a known GPU for the peak.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from pathlib import Path

logger = logging.getLogger(__name__)

#: CPU flags that mean bf16 matmuls run natively (AVX-512 BF16 dot products, AMX tiles), from /proc/cpuinfo.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

#: Published dense peaks (FLOP/s, no sparsity) of known GPUs: NVIDIA data sheets (A100 SXM, H100 SXM, H200 SXM).
PUBLISHED_PEAK_FLOPS = {
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
}

PEAK_CACHE = Path(os.environ.get("RLHF_CACHE", Path.home() / ".cache" / "rlhf-flywheel")) / "matmul_peak.json"


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the container's cgroup quota allows (quota / period), or None where there is no quota.

    cgroup v2: ``<root>/cpu.max`` ("max 100000" = no quota, "200000 100000" = 2 CPUs); cgroup v1:
    ``<root>/cpu/cpu.cfs_quota_us`` (-1 = no quota) over ``<root>/cpu/cpu.cfs_period_us``. A container limited
    by quota but not by CPU affinity (Docker ``--cpus``, Kubernetes CPU limits) sees every host CPU in
    ``sched_getaffinity``; this is what it may actually use.
    """
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def physical_cores() -> int:
    """Physical cores this process may run on.

    The logical CPUs in the process's affinity mask, counted once per (package, core) from
    ``/sys/devices/system/cpu/cpuN/topology`` (hyper-thread siblings share a core). Without sysfs topology:
    ``psutil.cpu_count(logical=False)`` (else ``os.cpu_count()``), capped at the affinity mask's size.
    Either way capped at the cgroup CPU quota, rounded up (:func:`cgroup_cpu_limit`).
    """
    cores = _physical_cores_in_affinity()
    limit = cgroup_cpu_limit()
    return cores if limit is None else max(1, min(cores, math.ceil(limit)))


def _physical_cores_in_affinity() -> int:
    cpus = _affinity()
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(), topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores = set()
            break
    if cores:
        return len(cores)
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        physical = os.cpu_count() or 1
    return max(1, min(physical, len(cpus)))


def threads_per_process(processes_on_node: int = 1) -> int:
    """Threads each of ``processes_on_node`` processes should use: physical cores // processes, at least 1."""
    if processes_on_node < 1:
        raise ValueError(f"processes_on_node must be >= 1, got {processes_on_node}")
    return max(1, physical_cores() // processes_on_node)


def cpu_flags() -> set[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


#: Environment variable that overrides the bf16 detection: ``1`` (native) or ``0`` (emulated). For tests, which
#: run both precision paths on every machine, and for a user who measured otherwise; stage subprocesses inherit it.
NATIVE_BF16_ENV = "RLHF_NATIVE_BF16"


def native_bf16() -> tuple[bool, str]:
    """Whether this device computes bf16 natively, and the evidence.

    :data:`NATIVE_BF16_ENV` set to ``1`` or ``0`` decides (the evidence says so). Otherwise CUDA:
    ``torch.cuda.is_bf16_supported()`` (compute capability 8.0+); CPU: a flag of :data:`CPU_BF16_FLAGS` in
    /proc/cpuinfo (without one, bf16 is emulated through fp32 and measured 8-10x slower here).

    Raises:
        ValueError: :data:`NATIVE_BF16_ENV` is set to anything but ``0`` or ``1``.
    """
    import torch

    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{NATIVE_BF16_ENV} must be 0 or 1 (or unset to detect), got {forced!r}")
        return forced == "1", f"bf16 {'native' if forced == '1' else 'not native'} (forced by {NATIVE_BF16_ENV}={forced})"
    if torch.cuda.is_available():
        ok = torch.cuda.is_bf16_supported()
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        return ok, f"CUDA {torch.cuda.get_device_name()} capability {cap}: bf16 {'native' if ok else 'not supported'}"
    found = sorted(set(CPU_BF16_FLAGS) & cpu_flags())
    if found:
        return True, f"CPU flags {', '.join(found)}"
    return False, f"CPU without {' / '.join(CPU_BF16_FLAGS)} (bf16 would be emulated)"


#: Environment variable that picks the memory allocator of stage processes (:func:`allocator_env`): ``auto``
#: (default), ``tcmalloc``, ``glibc-tuned`` or ``system``.
ALLOCATOR_ENV = "RLHF_ALLOCATOR"
ALLOCATORS = ("auto", "tcmalloc", "glibc-tuned", "system")

#: gperftools' allocator, by soname (the dynamic loader finds it as it finds any library): Debian/Ubuntu
#: ``libtcmalloc-minimal4``, Fedora/RHEL ``gperftools-libs``, conda ``gperftools``.
TCMALLOC_SONAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")

#: glibc settings that keep freed memory in the process instead of returning it to the kernel: glibc serves blocks
#: over its mmap threshold (at most 32 MiB) with fresh ``mmap`` pages and unmaps them on free, so each training step
#: page-faults and zero-fills its logits, gradients and weight casts anew (``fill_`` and ``copy_`` held 30% of a
#: bf16 DPO step here). ``mmap_max=0`` serves every block from the heap; the trim threshold (64 GiB) keeps it.
GLIBC_TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


def _find_tcmalloc() -> str | None:
    """An installed tcmalloc (:data:`TCMALLOC_SONAMES`): its soname where the dynamic loader finds it
    (``ctypes.util.find_library``: the ldconfig cache), else its absolute path in this Python's own ``lib`` folder
    (a conda environment's gperftools, which the loader does not search), or None. Nothing is loaded: an allocator
    loaded after start-up would free blocks the C library allocated."""
    import sys
    from ctypes.util import find_library

    for soname in TCMALLOC_SONAMES:
        if find_library(soname.removeprefix("lib").split(".so")[0]) == soname:
            return soname
    for soname in TCMALLOC_SONAMES:
        path = Path(sys.prefix) / "lib" / soname
        if path.is_file():
            return str(path)
    return None


#: Libraries that replace malloc: one already in the user's ``LD_PRELOAD`` is their choice of allocator.
MALLOC_LIBRARIES = ("tcmalloc", "jemalloc", "mimalloc", "hoard", "tbbmalloc")


def allocator_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that give a stage process (and what it starts) its memory allocator.

    PyTorch on a CPU allocates its activations, logits and gradients through the C allocator, and glibc's returns
    every block over 32 MiB to the kernel on free: the next step faults the pages in and zero-fills them again.
    A caching allocator keeps them (measured, SmolLM2-135M DPO on 2 cores, 6 steps: bf16 3.56 -> 2.69 s/step with
    tcmalloc, 3.17 with the glibc settings; fp32 4.73 -> 3.96 / 4.29; jemalloc 3.41 / 4.95, mimalloc 5.68 / 4.68;
    ``benchmarks/precision.py --allocator``). :data:`ALLOCATOR_ENV` in ``environ`` (default ``os.environ``) picks:

    - ``auto`` (default): tcmalloc where installed (:data:`TCMALLOC_SONAMES`), else the glibc settings on glibc,
      else nothing;
    - ``tcmalloc``: tcmalloc, which must be installed; ``glibc-tuned``: :data:`GLIBC_TUNED` (glibc only);
    - ``system``: nothing added.

    A malloc library already in ``environ``'s ``LD_PRELOAD`` (:data:`MALLOC_LIBRARIES`), or a ``glibc.malloc.*``
    setting in its ``GLIBC_TUNABLES``, is the user's choice of allocator: with ``auto`` nothing is added; an explicit
    other choice is a conflict (ValueError). Other preloads (a profiler, libgomp) and other tunables are kept, and
    the allocator is added to them. tcmalloc's report of allocations over 1 GiB (a line on stderr for each, routine
    for a model's weights) is raised to 1 TiB unless set.

    Returns:
        ``{name: value}`` to set in the stage's environment (empty for none); ``LD_PRELOAD`` and ``GLIBC_TUNABLES``
        include what ``environ`` already held.

    Raises:
        ValueError: :data:`ALLOCATOR_ENV` is not one of :data:`ALLOCATORS`, names an allocator this machine does
            not have, or contradicts an allocator already chosen in ``LD_PRELOAD`` / ``GLIBC_TUNABLES``.
    """
    environ = os.environ if environ is None else environ
    choice = environ.get(ALLOCATOR_ENV, "").strip() or "auto"
    if choice not in ALLOCATORS:
        raise ValueError(f"{ALLOCATOR_ENV} must be one of {', '.join(ALLOCATORS)} (or unset for auto), got {choice!r}")
    if choice == "system":
        return {}
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    tcmalloc = _find_tcmalloc() if choice in ("auto", "tcmalloc") else None
    if choice == "tcmalloc" and tcmalloc is None:
        raise ValueError(f"{ALLOCATOR_ENV}=tcmalloc but none of {', '.join(TCMALLOC_SONAMES)} loads here "
                         "(Debian/Ubuntu: apt-get install libtcmalloc-minimal4)")
    if choice == "glibc-tuned" and not glibc:
        raise ValueError(f"{ALLOCATOR_ENV}=glibc-tuned but this C library is not glibc")
    preload = environ.get("LD_PRELOAD", "").replace(":", " ").split()
    tunables = [t for t in environ.get("GLIBC_TUNABLES", "").strip().split(":") if t]
    chosen = [lib for lib in preload if any(name in Path(lib).name for name in MALLOC_LIBRARIES)]
    chosen += [t for t in tunables if t.startswith("glibc.malloc.")]
    if chosen:
        if choice == "tcmalloc":
            same = all("tcmalloc" in Path(c).name for c in chosen)
        else:  # glibc-tuned: no malloc library preloaded, and the settings already there
            same = not any(c in preload for c in chosen) and set(GLIBC_TUNED.split(":")) <= set(tunables)
        if choice == "auto" or same:  # auto defers to the user; the same choice made again adds nothing
            return {}
        raise ValueError(f"{ALLOCATOR_ENV}={choice} but the environment already chooses the allocator "
                         f"({', '.join(chosen)}): unset one of them")
    if tcmalloc:
        return {"LD_PRELOAD": " ".join([tcmalloc, *preload]),
                "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": environ.get("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD",
                                                                     str(2**40))}
    return {"GLIBC_TUNABLES": ":".join([*tunables, GLIBC_TUNED])} if glibc else {}


def allocator_in_use() -> str:
    """The memory allocator of this process, for its manifest: ``tcmalloc`` / ``jemalloc`` / ``mimalloc`` (a library
    mapped into the process), ``glibc (GLIBC_TUNABLES=...)`` (its ``glibc.malloc.*`` settings) or ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if f"lib{name}" in maps:
            return name
    malloc = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    return f"glibc (GLIBC_TUNABLES={':'.join(malloc)})" if malloc else "system"


def _machine_key(dtype: str, threads: int) -> str:
    """The identity a measured peak belongs to: host, CPU model (or GPU), a digest of the CPU flags, torch's version,
    dtype and threads. Another CPU under the same host name (a moved VM, a new instance type), a torch upgrade or
    another thread count measures anew."""
    import hashlib

    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo_lines() if ln.startswith("model name")), device)
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return (f"{platform.node()}|{model if not torch.cuda.is_available() else device}|flags={flags}|"
            f"torch={torch.__version__}|{dtype}|threads={threads}")


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def measure_matmul_peak(dtype: str = "fp32", size: int = 1024, seconds: float = 1.0, trials: int = 3) -> float:
    """FLOP/s of a square ``size`` matmul in ``dtype`` on this device (2·size³ per product): the best single
    product over ``trials`` rounds of about ``seconds / trials`` each, after one untimed warm-up product. The best,
    not the mean, because load from other processes only ever slows a product down."""
    import torch

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        size = max(size, 8192)
    a = torch.randn(size, size, dtype=tdtype, device=device)
    b = torch.randn(size, size, dtype=tdtype, device=device)
    (a @ b).sum().item()  # warm-up: allocator, kernel selection
    best = 0.0
    for _ in range(max(1, trials)):
        t_end = time.perf_counter() + seconds / max(1, trials)
        while True:
            t0 = time.perf_counter()
            (a @ b).sum().item()
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
            if time.perf_counter() > t_end:
                break
    return best


def measure_copy_bandwidth(megabytes: int = 256, trials: int = 5) -> float:
    """Memory bandwidth of this device in bytes/s: the best of ``trials`` copies of a ``megabytes`` tensor (bytes
    read plus bytes written over the copy's time). Decoding one token reads every weight once, so this over the
    weights' bytes bounds tokens/s at batch 1."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page faults
    best = 0.0
    for _ in range(max(1, trials)):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - t0))
    return best


#: A cached peak is refused and measured again when a quick check now beats it by more than this factor: it was
#: measured under load (a cached 56 GFLOP/s where the CPU does 206 gave "MFU 100.9%").
PEAK_RECHECK_FACTOR = 1.10
#: Seconds of the quick check that every :func:`peak_flops` call makes against the cached figure.
PEAK_RECHECK_SECONDS = 0.25


def peak_flops(dtype: str = "fp32", *, remeasure: bool = False) -> tuple[float, str]:
    """The device's peak FLOP/s for ``dtype`` and where the figure comes from.

    A known GPU (:data:`PUBLISHED_PEAK_FLOPS`) uses its published peak. Anything else uses a matmul peak
    (:func:`measure_matmul_peak`) cached in :data:`PEAK_CACHE` (JSON) per machine identity (:func:`_machine_key`),
    never reused blindly: every call times a quick check (:data:`PEAK_RECHECK_SECONDS`), and a cached figure that
    the check beats by more than :data:`PEAK_RECHECK_FACTOR` (or ``remeasure``) is measured again; the cache keeps
    the highest figure seen. Returns ``(FLOP/s, source)``.
    """
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for gpu, peaks in PUBLISHED_PEAK_FLOPS.items():
            if gpu in name and dtype in peaks:
                return peaks[dtype], f"published peak of {gpu}"
    key = _machine_key(dtype, torch.get_num_threads())
    try:
        cache = json.loads(PEAK_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(key)
    cached = float(entry["flops"]) if isinstance(entry, dict) and "flops" in entry else None
    quick = measure_matmul_peak(dtype, seconds=PEAK_RECHECK_SECONDS, trials=1)
    if cached is not None and not remeasure and quick <= PEAK_RECHECK_FACTOR * cached:
        if quick > cached:  # the cache keeps the highest figure seen, so the next call starts from it
            _store_peak(cache, key, quick)
        return max(cached, quick), f"measured {dtype} matmul peak ({PEAK_CACHE}), re-checked"
    if cached is not None:
        logger.warning("cached %s matmul peak %.3g FLOP/s refused (a check now gives %.3g%s): measuring again",
                       dtype, cached, quick, ", re-measure asked" if remeasure else "")
    flops = max(measure_matmul_peak(dtype), quick, cached or 0.0)
    _store_peak(cache, key, flops)
    return flops, f"measured {dtype} matmul peak ({PEAK_CACHE})"


def _store_peak(cache: dict, key: str, flops: float) -> None:
    """Write ``flops`` under ``key`` into :data:`PEAK_CACHE` (atomically; other keys as read in ``cache``)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cache[key] = {"flops": flops, "measured_at": time.time(), "load_average_1min": load}
    try:
        PEAK_CACHE.parent.mkdir(parents=True, exist_ok=True)
        from .manifest import atomic_write_text, dumps_strict

        atomic_write_text(PEAK_CACHE, dumps_strict(cache, indent=2) + "\n")
    except OSError as err:  # a read-only home only costs a re-measurement next time
        logger.warning("could not cache the matmul peak in %s: %s", PEAK_CACHE, err)


#: Largest batch ``auto`` picks: 128 on CPU, 256 on a GPU. On a CPU a decode step costs a fixed ~120 ms plus ~3 ms a
#: row (``rlhf.batching``), so the fixed part is shared by more rows the bigger the batch: measured with
#: ``benchmarks/generation.py`` (135M, 128 gate prompts, 64 new tokens, AVX-512 2-core EPYC), batch 128 generated
#: 1.12x faster than 64 and 1.68x faster than 16, outputs identical. It is a cap, not a size: the padding-aware plan
#: (``rlhf.batching``) splits where padding would cost more than a forward (the demo gate suites' batches stayed at
#: <= 64), and memory lowers it (:func:`auto_batch_size`).
AUTO_BATCH_CAP = {"cpu": 128, "cuda": 256}


def available_memory_bytes() -> int:
    """Free memory of the device the models run on: CUDA free memory, else RAM available (psutil / /proc/meminfo)."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        for line in _read_lines("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * 2**30


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def auto_batch_size(requested: int | str, model_config, seq_len: int, bytes_per_value: int = 4) -> int:
    """A batch size for inference (generation or scoring) on this device.

    ``requested``: an int (used as is) or ``"auto"``: :data:`AUTO_BATCH_CAP` for the device, lowered (by halving)
    until the batch's memory fits a quarter of :func:`available_memory_bytes`. Per row, of ``seq_len`` tokens:
    the KV cache ``2·layers·kv_hidden·seq_len`` values (kv_hidden = hidden·kv_heads/heads) plus one layer's attention scores ``heads·seq_len²`` plus four
    hidden-state-sized activations, at ``bytes_per_value`` bytes.

    Raises:
        ValueError: ``requested`` is neither a positive int nor ``"auto"``.
    """
    import torch

    if isinstance(requested, str) and requested.strip().isdigit():
        requested = int(requested)
    if isinstance(requested, int) and not isinstance(requested, bool):
        if requested < 1:
            raise ValueError(f"batch_size must be >= 1 or 'auto', got {requested}")
        return requested
    if requested != "auto":
        raise ValueError(f"batch_size must be a positive int or 'auto', got {requested!r}")
    layers = getattr(model_config, "num_hidden_layers", 12)
    hidden = getattr(model_config, "hidden_size", 768)
    heads = getattr(model_config, "num_attention_heads", 12)
    kv_hidden = hidden * getattr(model_config, "num_key_value_heads", heads) // heads  # grouped-query attention
    per_row = bytes_per_value * (2 * layers * kv_hidden * seq_len + heads * seq_len**2 + 4 * hidden * seq_len)
    bs = AUTO_BATCH_CAP["cuda" if torch.cuda.is_available() else "cpu"]
    budget = available_memory_bytes() // 4
    while bs > 1 and bs * per_row > budget:
        bs //= 2
    return bs
