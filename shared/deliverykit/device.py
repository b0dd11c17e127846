"""Device resolution and device-agnostic helpers (NPU, CUDA, CPU).

Why this module exists: ``import torch_npu`` without a working CANN raises, leaves
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` behind and makes ``torch.device("npu")`` itself raise; diffusers and
transformers helpers either only check that the package is installed or report 0 for NPU memory. Every delivery
resolves its device here, once, and never writes a device-specific call itself.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from .errors import DeliveryError, DeviceUnavailableError, ExitCode
from .imports import is_torch_npu_installed

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
MEMINFO = "/proc/meminfo"
CPUINFO = "/proc/cpuinfo"
# its flags of native fp16 arithmetic: x86 ("flags") and Arm ("Features")
CPU_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})

DEVICE_ENV_VAR = "DELIVERY_DEVICE"
DEVICE_CHOICES = "auto|npu|npu:N|cuda|cuda:N|cpu"
_DEVICE_RE = re.compile(r"^(auto|cpu|npu|cuda)(?::(\d+))?$")

# The oldest torch-npu the deliveries accept: the oldest release whose op schemas the conformance test checks
# (deliverykit.tools.npu_wheels.CHECKED_VERSIONS), and the first for torch 2.6, the oldest torch the locks support.
TORCH_NPU_MINIMUM = (2, 6, 0)

# Recommended for inference on Ascend (ModelZoo-PyTorch sets the same); applied only when unset.
NPU_ENV_DEFAULTS = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "TASK_QUEUE_ENABLE": "2",
    "CPU_AFFINITY_CONF": "2",
}


# Two CPU runs of the same model in two processes were seen to differ by ~1e-6 on a loaded machine: MKL/OpenMP may
# change thread counts, and MKL's kernels may depend on buffer alignment. Fixed thread counts and MKL's strict
# conditional-numerical-reproducibility mode make CPU reference runs repeatable where the libraries honour them.
REPEATABLE_CPU_ENV = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO,STRICT"}


def repeatable_cpu_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default: this process's) for subprocesses whose CPU results must repeat bit for bit."""
    env = dict(os.environ if environ is None else environ)
    for key, value in REPEATABLE_CPU_ENV.items():
        env.setdefault(key, value)
    return env


@dataclasses.dataclass(frozen=True)
class AcceleratorStatus:
    """Whether an accelerator type can be used, and why not when it cannot."""

    type: str
    available: bool
    device_count: int
    reason: str


def apply_npu_env_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the recommended Ascend variables that are unset; return those that were set.

    They are read when torch_npu initialises, so this runs before the NPU probe imports it.
    """
    environ = os.environ if environ is None else environ
    applied = {}
    for key, value in NPU_ENV_DEFAULTS.items():
        if key not in environ and not (key == "PYTORCH_NPU_ALLOC_CONF" and "PYTORCH_ALLOC_CONF" in environ):
            environ[key] = value
            applied[key] = value
    return applied


@cache
def probe_npu() -> AcceleratorStatus:
    """Probe the NPU without ever raising: package installed → guarded import → ``torch.npu.is_available()``."""
    if not is_torch_npu_installed():
        return AcceleratorStatus("npu", False, 0, "torch_npu is not installed")
    saved_autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    try:
        import torch
        import torch_npu
    except Exception as err:  # torch_npu raises RuntimeError/ImportError/OSError without CANN
        # A failed import leaves TORCH_DEVICE_BACKEND_AUTOLOAD=0 behind; restore what the user had.
        if saved_autoload is None:
            os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        else:
            os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = saved_autoload
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = "CANN missing or not sourced (source /usr/local/Ascend/ascend-toolkit/set_env.sh)"
        return AcceleratorStatus("npu", False, 0, f"import torch_npu failed: {first_line}; {hint}")
    problem = torch_npu_problem(torch_npu)
    if problem is not None:
        return AcceleratorStatus("npu", False, 0, problem)
    try:
        count = int(torch.npu.device_count()) if torch.npu.is_available() else 0
    except Exception as err:
        return AcceleratorStatus("npu", False, 0, f"torch.npu.is_available() failed: {err}")
    if count == 0:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        suffix = f" (ASCEND_RT_VISIBLE_DEVICES={visible})" if visible is not None else ""
        return AcceleratorStatus("npu", False, 0, f"torch_npu imported but no NPU device is visible{suffix}")
    return AcceleratorStatus("npu", True, count, f"{count} NPU device(s)")


def torch_npu_problem(torch_npu: Any) -> str | None:
    """Why this ``torch_npu`` cannot run the deliveries, before any work: older than :data:`TORCH_NPU_MINIMUM`, or
    without an op that ``deliverykit.ops`` calls (a crash mid-run otherwise). None when it can."""
    from .ops import NPU_OPS

    version = str(getattr(torch_npu, "__version__", "unknown"))
    release = tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])
    minimum = ".".join(map(str, TORCH_NPU_MINIMUM))
    fix = f"install the torch-npu release (>= {minimum}) that matches your CANN and torch (supported-versions table)"
    if not release or release < TORCH_NPU_MINIMUM:
        return f"torch_npu {version} is older than {minimum}, the oldest these deliveries are checked against; {fix}"
    missing = [op for op in NPU_OPS if not hasattr(torch_npu, op)]
    if missing:
        return f"torch_npu {version} has no {', '.join(missing)}, which the deliveries call; {fix}"
    return None


@cache
def probe_cuda() -> AcceleratorStatus:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda is not None
        reason = "no CUDA device visible" if built else "this torch build has no CUDA support"
        return AcceleratorStatus("cuda", False, 0, reason)
    count = torch.cuda.device_count()
    return AcceleratorStatus("cuda", True, count, f"{count} CUDA device(s)")


def probe_accelerators() -> dict[str, AcceleratorStatus]:
    """NPU first: with ``transfer_to_npu`` loaded, ``torch.cuda`` answers for the NPU."""
    return {"npu": probe_npu(), "cuda": probe_cuda()}


def _parse_device_spec(spec: str) -> tuple[str, int | None]:
    match = _DEVICE_RE.match(spec.strip().lower())
    if not match or (match.group(1) in ("auto", "cpu") and match.group(2) is not None):
        raise DeliveryError(f"unknown device {spec!r}; expected one of {DEVICE_CHOICES}", ExitCode.USAGE)
    index = int(match.group(2)) if match.group(2) is not None else None
    return match.group(1), index


def guard_cpu_kernels() -> bool:
    """Keep CPU attention working when ``ATEN_CPU_CAPABILITY`` forces kernels below what the CPU has.

    On a CPU with AVX-512 (and AMX), torch picks its packed bf16/fp16 flash-attention path from the hardware, but the
    kernel compiled for a forced lower capability (``default``/``avx2``, used to reproduce another CPU's results) has
    no packing and raises "pack_vnni2 is only supported when avx512 is supported". Only then, the CPU flash path is
    turned off: SDPA falls back to its math kernel, which computes the same attention. Returns whether it was.
    """
    import torch

    has_avx512 = getattr(torch.cpu, "_is_avx512_supported", lambda: False)()
    if has_avx512 and torch.backends.cpu.get_cpu_capability() != "AVX512":  # "DEFAULT"/"AVX2" ("NO AVX" on 2.6)
        torch.backends.cuda.enable_flash_sdp(False)  # the flag is global: it also gates the CPU flash kernel
        logger.info("ATEN_CPU_CAPABILITY below the CPU's: flash attention off on the CPU (math SDPA instead)")
        return True
    return False


def resolve_device(spec: str | None = None) -> torch.device:
    """Turn ``auto|npu|npu:N|cuda|cuda:N|cpu`` into a usable ``torch.device``.

    ``None`` reads ``$DELIVERY_DEVICE`` (default ``auto``). ``auto`` prefers npu, then cuda, then cpu. An explicit
    accelerator that is not usable raises :class:`DeviceUnavailableError` saying why and how to fix it.
    """
    import torch

    spec = spec or os.environ.get(DEVICE_ENV_VAR) or "auto"
    kind, index = _parse_device_spec(spec)
    if kind in ("auto", "npu") and is_torch_npu_installed():
        applied = apply_npu_env_defaults()
        if applied:
            logger.info("NPU environment defaults set: %s", applied)
    if kind == "auto":
        for status in probe_accelerators().values():
            if status.available:
                return torch.device(status.type, 0)
    if kind in ("auto", "cpu"):
        guard_cpu_kernels()
        return torch.device("cpu")
    status = probe_accelerators()[kind]
    if not status.available:
        raise DeviceUnavailableError(f"--device {spec} requested but {status.reason}; use --device cpu or auto")
    index = 0 if index is None else index
    if index >= status.device_count:
        raise DeviceUnavailableError(
            f"--device {spec} requested but only {status.device_count} {kind} device(s) are visible; "
            f"use an index below {status.device_count}"
        )
    return torch.device(kind, index)


def device_string(device: torch.device | str) -> str:
    """Canonical ``type:index`` for accelerators (``npu`` → ``npu:0``), ``cpu`` for the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    return f"{device.type}:{0 if device.index is None else device.index}"


# Device types whose kernels commonly reject float64 (Ascend: DT_DOUBLE missing for many aclnn ops; MPS: no float64).
FLOAT64_UNSUPPORTED_DEVICE_TYPES = frozenset({"npu", "mps"})


# SDPA's enable_gqa (fewer KV heads than query heads): native since torch 2.5 on these; unverified on the NPU.
SDPA_GQA_DEVICE_TYPES = frozenset({"cpu", "cuda"})


def device_type(device: torch.device | str) -> str:
    """``"npu"`` for ``"npu:1"`` or ``torch.device("npu", 1)``.

    A string is parsed by hand: ``torch.device("npu")`` itself raises until torch_npu is imported.
    """
    return device.type if not isinstance(device, str) else device.split(":")[0].strip().lower()


class DeviceBackend:
    """One device's runtime behind one object: the ``torch.<type>`` module, or nothing for the CPU.

    The shape of diffusers' ``TorchDeviceBackend`` (``utils/torch_utils.py``): one proxy instead of an if/elif ladder
    per helper. Every query also answers for the CPU (and for ``None``, "no device"): actions are no-ops and counters
    are None, never 0, so a report cannot mistake "not measured" for "nothing allocated".
    """

    def __init__(self, device: torch.device | str | None) -> None:
        import torch

        self.device = None if device is None else torch.device(device)
        on_accelerator = self.device is not None and self.device.type != "cpu"
        self.module = torch.get_device_module(self.device.type) if on_accelerator else None

    @property
    def type(self) -> str:
        return "cpu" if self.device is None else self.device.type

    def synchronize(self) -> None:
        """Wait for queued work; a no-op on the CPU."""
        if self.module is not None and hasattr(self.module, "synchronize"):
            self.module.synchronize(self.device)

    def empty_cache(self) -> None:
        """Release cached allocator blocks; a no-op on the CPU."""
        if self.module is not None and hasattr(self.module, "empty_cache"):
            self.module.empty_cache()

    def max_memory_allocated(self) -> int | None:
        """Peak bytes allocated since the last reset; None where the device has no such counter (CPU)."""
        query = self._memory_query("max_memory_allocated", "max_memory_allocated")
        return None if query is None else int(query(self.device))

    def reset_peak_memory_stats(self) -> None:
        query = self._memory_query("reset_peak_memory_stats", "reset_peak_memory_stats")
        if query is not None:
            query(self.device)

    def memory_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes as the runtime reports them; None for the CPU or no such query.

        Memory plans choose by the free figure: ``torch.accelerator.memory.get_memory_info`` where that serves the
        device, else ``torch.npu.mem_get_info`` / ``torch.cuda.mem_get_info``.
        """
        query = self._memory_query("get_memory_info", "mem_get_info")
        if query is None:
            return None
        free, total = query(self.device)
        return int(free), int(total)

    @property
    def name(self) -> str:
        """Human-readable name (e.g. ``Ascend910B3``, ``NVIDIA H200``, the CPU model)."""
        if self.module is not None and hasattr(self.module, "get_device_name"):
            try:
                return str(self.module.get_device_name(self.device))
            except Exception as err:  # a device-name query must never fail a run
                logger.debug("get_device_name failed: %s", err)
        return _cpu_name() if self.type == "cpu" else self.type

    @property
    def supports_float64(self) -> bool:
        """False where float64 maths should be avoided: build tables in float32 there (diffusers does the same)."""
        return self.type not in FLOAT64_UNSUPPORTED_DEVICE_TYPES

    @property
    def supports_sdpa_gqa(self) -> bool:
        """Whether ``scaled_dot_product_attention(..., enable_gqa=True)`` is known to work here."""
        return self.type in SDPA_GQA_DEVICE_TYPES

    def default_dtype(self, accelerator: str) -> str:
        """The dtype name a run uses when none is asked for: ``fp32`` on the CPU (its half-precision kernels are slow
        and some are missing), else the delivery's ``accelerator`` choice (``bf16`` / ``fp16``)."""
        return "fp32" if self.type == "cpu" else accelerator

    def adjust_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """float64 becomes float32 where the device avoids it (diffusers' ``maybe_adjust_dtype_for_device``)."""
        import torch

        return torch.float32 if dtype == torch.float64 and not self.supports_float64 else dtype

    def _memory_query(self, accelerator_name: str, module_name: str) -> Callable | None:
        """``torch.accelerator.memory.<accelerator_name>`` when that API serves this device type and has it, else
        ``torch.<type>.<module_name>``; None for the CPU or a device with neither.

        Why the fallback: ``torch.accelerator.memory`` exists in torch 2.9 without ``get_memory_info`` (it came
        later), and the Ascend images pin such a torch; the device module (``torch.npu`` / ``torch.cuda``) answers.
        """
        import torch

        if self.module is None:
            return None
        accelerator = getattr(torch, "accelerator", None)
        current = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
        memory = getattr(accelerator, "memory", None)
        if current is not None and current.type == self.type and memory is not None:
            query = getattr(memory, accelerator_name, None)
            if query is not None:
                return query
        return getattr(self.module, module_name, None)


def backend(device: torch.device | str | None) -> DeviceBackend:
    """The :class:`DeviceBackend` of ``device`` (None: no device, every query a no-op)."""
    return DeviceBackend(device)


# The function spellings the deliveries use, one line each over the backend object.
def synchronize(device: torch.device | str | None = None) -> None:
    backend(device).synchronize()


def empty_cache(device: torch.device | str | None = None) -> None:
    backend(device).empty_cache()


def max_memory_allocated(device: torch.device | str | None = None) -> int | None:
    return backend(device).max_memory_allocated()


def reset_peak_memory_stats(device: torch.device | str | None = None) -> None:
    backend(device).reset_peak_memory_stats()


def memory_info(device: torch.device | str | None = None) -> tuple[int, int] | None:
    return backend(device).memory_info()


def free_memory(device: torch.device | str, meminfo: str = MEMINFO) -> int | None:
    """Bytes a run on ``device`` can still take: the accelerator's free memory, or for the CPU the host's
    ``MemAvailable`` (what the kernel can hand out without swapping; None off Linux or where neither can say)."""
    if device_type(device) != "cpu":
        info = memory_info(device)
        return None if info is None else info[0]
    try:
        with open(meminfo, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key == "MemAvailable":
                    return int(value.split()[0]) * 1024  # kB
    except OSError:
        pass
    return None


def device_name(device: torch.device | str) -> str:
    return backend(device).name


def supports_float64(device: torch.device | str) -> bool:
    return device_type(device) not in FLOAT64_UNSUPPORTED_DEVICE_TYPES


def supports_sdpa_gqa(device: torch.device | str) -> bool:
    return device_type(device) in SDPA_GQA_DEVICE_TYPES


def _cpuinfo_value(*keys: str, path: str = CPUINFO) -> str | None:
    """The value of the first ``key : value`` line of ``/proc/cpuinfo`` with one of ``keys``; None off Linux."""
    try:
        with open(path, encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_name() -> str:
    return _cpuinfo_value("model name") or platform.processor() or platform.machine() or "cpu"


@cache
def cpu_computes_fp16(cpuinfo: str = CPUINFO) -> bool:
    """Whether this CPU has float16 arithmetic (x86 AVX512-FP16 / AMX-FP16, Arm's half-precision SIMD).

    Without it torch emulates fp16 matmuls and convolutions, many times slower than fp32 ones, so models released
    in fp16 are better computed in fp32 on such a host. Unknown (no ``/proc/cpuinfo``) counts as no.
    """
    flags = set((_cpuinfo_value("flags", "Features", path=cpuinfo) or "").split())
    return bool(flags & CPU_FP16_FLAGS)


def half_compute_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype to compute a model released in float16 in on ``device``: float16, except float32 on a CPU without
    fp16 arithmetic (:func:`cpu_computes_fp16`)."""
    import torch

    return torch.float32 if device_type(device) == "cpu" and not cpu_computes_fp16() else torch.float16


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A seeded generator. Random draws for comparisons use a CPU generator: RNG streams differ per device."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (including every initialised accelerator)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds cuda/npu generators that torch knows about


@dataclasses.dataclass
class PlacementAudit:
    """Where a model and its tensors live, compared with the device the run asked for."""

    target: str
    model_device: str
    off_device: list[str]
    tensor_devices: dict[str, str]

    @property
    def cpu_fallback(self) -> bool:
        """True when any parameter, buffer or audited tensor is not on the target device."""
        return bool(self.off_device) or any(d != self.target for d in self.tensor_devices.values())


def audit_placement(
    model: torch.nn.Module, device: torch.device | str, tensors: dict[str, torch.Tensor] | None = None
) -> PlacementAudit:
    """Report the model's device and every parameter/buffer (and named tensor) that is not on ``device``."""
    target = device_string(device)
    off_device = []
    seen = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        where = device_string(tensor.device)
        seen.add(where)
        if where != target:
            off_device.append(f"{name}@{where}")
    model_device = seen.pop() if len(seen) == 1 else ("mixed" if seen else "none")
    tensor_devices = {name: device_string(t.device) for name, t in (tensors or {}).items()}
    return PlacementAudit(target, model_device, off_device, tensor_devices)
