"""Device resolution with and without accelerators, NPU probing, placement audit."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterable

import pytest
import torch

from deliverykit import device as devices
from deliverykit.errors import DeliveryError, DeviceUnavailableError, ExitCode
from deliverykit.ops import NPU_OPS


@pytest.fixture(autouse=True)
def _fresh_probes():
    devices.probe_npu.cache_clear()
    devices.probe_cuda.cache_clear()
    yield
    devices.probe_npu.cache_clear()
    devices.probe_cuda.cache_clear()


def _status(kind: str, count: int) -> devices.AcceleratorStatus:
    return devices.AcceleratorStatus(kind, count > 0, count, f"{count} fake device(s)" if count else "none here")


@pytest.fixture
def fake_accelerators(monkeypatch):
    """Pretend which accelerators exist; resolve_device only consults the probes."""

    def install(npu: int = 0, cuda: int = 0):
        monkeypatch.setattr(devices, "probe_npu", lambda: _status("npu", npu))
        monkeypatch.setattr(devices, "probe_cuda", lambda: _status("cuda", cuda))
        monkeypatch.setattr(devices, "is_torch_npu_installed", lambda: False)

    return install


def _device_tuple(device: torch.device) -> tuple[str, int | None]:
    return device.type, device.index


@pytest.mark.parametrize(
    ("npu", "cuda", "spec", "expected"),
    [
        (0, 0, "auto", ("cpu", None)),
        (0, 1, "auto", ("cuda", 0)),
        (2, 1, "auto", ("npu", 0)),  # npu wins over cuda
        (2, 1, "cpu", ("cpu", None)),
        (0, 2, "cuda:1", ("cuda", 1)),
        (0, 2, "CUDA", ("cuda", 0)),
    ],
)
def test_resolve_device_prefers_npu_then_cuda_then_cpu(fake_accelerators, npu, cuda, spec, expected):
    fake_accelerators(npu=npu, cuda=cuda)
    resolved = devices.resolve_device(spec) if expected[0] != "npu" else None
    if expected[0] == "npu":
        # torch.device("npu") raises without torch_npu loaded: proves the npu branch was taken.
        with pytest.raises(RuntimeError, match="npu"):
            devices.resolve_device(spec)
    else:
        assert _device_tuple(resolved) == expected


def test_explicit_accelerator_missing_names_reason_and_fix(fake_accelerators):
    fake_accelerators(npu=0, cuda=0)
    for spec in ("npu", "npu:0", "cuda", "cuda:3"):
        with pytest.raises(DeviceUnavailableError) as info:
            devices.resolve_device(spec)
        message = str(info.value)
        assert spec in message and "none here" in message and "--device cpu" in message
        assert info.value.exit_code == ExitCode.DEVICE


def test_index_out_of_range(fake_accelerators):
    fake_accelerators(cuda=2)
    with pytest.raises(DeviceUnavailableError, match="only 2 cuda device"):
        devices.resolve_device("cuda:2")


@pytest.mark.parametrize("spec", ["gpu", "cpu:0", "auto:1", "npu:x", "cuda:-1", ""])
def test_bad_device_spec_is_a_usage_error(fake_accelerators, spec):
    fake_accelerators()
    if spec == "":  # empty means "not given" → default
        assert devices.resolve_device(spec).type == "cpu"
        return
    with pytest.raises(DeliveryError) as info:
        devices.resolve_device(spec)
    assert info.value.exit_code == ExitCode.USAGE
    assert devices.DEVICE_CHOICES in str(info.value)


def test_env_var_overrides_default_but_not_explicit(fake_accelerators, monkeypatch):
    fake_accelerators(cuda=1)
    monkeypatch.setenv(devices.DEVICE_ENV_VAR, "cpu")
    assert devices.resolve_device(None).type == "cpu"
    assert devices.resolve_device("cuda").type == "cuda"
    monkeypatch.delenv(devices.DEVICE_ENV_VAR)
    assert devices.resolve_device(None).type == "cuda"


def test_probe_npu_not_installed(monkeypatch):
    monkeypatch.setattr(devices, "is_torch_npu_installed", lambda: False)
    status = devices.probe_npu()
    assert not status.available and status.reason == "torch_npu is not installed"


def test_probe_npu_broken_install_never_raises_and_restores_env(monkeypatch):
    """torch_npu without CANN raises on import and leaves TORCH_DEVICE_BACKEND_AUTOLOAD=0 behind."""
    monkeypatch.setattr(devices, "is_torch_npu_installed", lambda: True)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)

    class BrokenFinder:
        def find_spec(self, name, path=None, target=None):
            if name == "torch_npu":
                os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
                raise ImportError("libhccl.so: cannot open shared object file")
            return None

    monkeypatch.setattr(sys, "meta_path", [BrokenFinder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    status = devices.probe_npu()
    assert not status.available
    assert "libhccl.so" in status.reason and "set_env.sh" in status.reason
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ


def _fake_torch_npu(version: str, ops: Iterable[str]) -> types.ModuleType:
    module = types.ModuleType("torch_npu")
    module.__version__ = version
    for op in ops:
        setattr(module, op, lambda *args, **kwargs: None)
    return module


def test_probe_npu_no_device(monkeypatch):
    monkeypatch.setattr(devices, "is_torch_npu_installed", lambda: True)
    fake_npu = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch_npu", _fake_torch_npu("2.13.0", NPU_OPS))
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    status = devices.probe_npu()
    assert not status.available and "no NPU device is visible" in status.reason


@pytest.mark.parametrize(
    ("version", "ops", "expected"),
    [
        ("2.5.1.post1", NPU_OPS, "torch_npu 2.5.1.post1 is older than 2.6.0"),
        ("2.13.0", [op for op in NPU_OPS if op != "npu_rms_norm"], "torch_npu 2.13.0 has no npu_rms_norm"),
        ("2.6.0.post5", NPU_OPS, None),
        ("2.14.0+git1a2b", NPU_OPS, None),
    ],
)
def test_a_torch_npu_that_cannot_run_the_deliveries_is_refused_up_front(monkeypatch, version, ops, expected):
    problem = devices.torch_npu_problem(_fake_torch_npu(version, ops))
    if expected is None:
        assert problem is None
        return
    assert problem.startswith(expected) and "matches your CANN" in problem
    monkeypatch.setattr(devices, "is_torch_npu_installed", lambda: True)
    monkeypatch.setitem(sys.modules, "torch_npu", _fake_torch_npu(version, ops))
    status = devices.probe_npu()
    assert not status.available and status.reason == problem  # resolve_device("npu") then exits 5 with it


def test_npu_env_defaults_only_fill_unset():
    environ = {"TASK_QUEUE_ENABLE": "1"}
    applied = devices.apply_npu_env_defaults(environ)
    assert environ["TASK_QUEUE_ENABLE"] == "1"  # the user's value is kept
    assert applied == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "CPU_AFFINITY_CONF": "2"}
    assert devices.apply_npu_env_defaults(environ) == {}
    assert "PYTORCH_NPU_ALLOC_CONF" not in devices.apply_npu_env_defaults({"PYTORCH_ALLOC_CONF": "x"})


def test_cpu_helpers_are_safe_noops():
    devices.synchronize("cpu")
    devices.synchronize(None)
    devices.empty_cache("cpu")
    devices.reset_peak_memory_stats("cpu")
    assert devices.max_memory_allocated("cpu") is None  # "n/a", never a fake 0
    assert devices.device_string("cpu") == "cpu"
    assert devices.device_string(torch.device("cuda")) == "cuda:0"
    assert devices.device_name("cpu")


def test_generator_is_seeded_and_device_independent_on_cpu():
    a = torch.randn(4, generator=devices.make_generator(3))
    b = torch.randn(4, generator=devices.make_generator(3))
    assert torch.equal(a, b)
    devices.seed_everything(5)
    first = torch.rand(3)
    devices.seed_everything(5)
    assert torch.equal(first, torch.rand(3))


def test_placement_audit_reports_off_device_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    audit = devices.audit_placement(model, "cpu", {"input": torch.zeros(1)})
    assert audit.model_device == "cpu" and audit.off_device == [] and not audit.cpu_fallback
    # Against another target everything is "off device": the audit must say so, parameters and buffers alike.
    audit = devices.audit_placement(model, torch.device("cuda", 0), {"output": torch.zeros(1)})
    assert audit.cpu_fallback
    assert "0.weight@cpu" in audit.off_device and "1.running_mean@cpu" in audit.off_device
    assert audit.tensor_devices == {"output": "cpu"}


def test_repeatable_cpu_env_keeps_user_choices():
    env = devices.repeatable_cpu_env({"MKL_DYNAMIC": "TRUE", "PATH": "/bin"})
    assert env == {"MKL_DYNAMIC": "TRUE", "OMP_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO,STRICT", "PATH": "/bin"}


class _FakeAccelerator:
    """``torch.accelerator`` whose current accelerator is ``kind``, with the given ``memory`` namespace."""

    def __init__(self, kind, memory):
        self.kind, self.memory = kind, memory

    def is_available(self):
        return True

    def current_accelerator(self):
        return torch.device(self.kind)


def _fake_memory_query(calls, name, figures):
    def query(device):
        calls.append((name, device))
        return figures

    return query


def test_free_memory_is_the_hosts_available_memory_on_cpu(tmp_path, monkeypatch):
    """On the CPU a run can take what the kernel calls available (free plus reclaimable cache), not ``MemFree``."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   16000000 kB\n")
    assert devices.free_memory("cpu", meminfo=str(meminfo)) == 16_000_000 * 1024
    assert devices.free_memory("cpu", meminfo=str(tmp_path / "absent")) is None  # not Linux
    monkeypatch.setattr(devices, "memory_info", lambda device: (7, 64))
    assert devices.free_memory("npu:0", meminfo=str(meminfo)) == 7  # an accelerator: its runtime's free figure
    monkeypatch.setattr(devices, "memory_info", lambda device: None)
    assert devices.free_memory("npu:0") is None


def test_memory_info_is_none_on_cpu():
    assert devices.memory_info("cpu") is None


@pytest.mark.parametrize(
    ("accelerator_has_query", "expected_call"),
    [
        # torch >= 2.10: torch.accelerator.memory.get_memory_info serves the device
        (True, "accelerator.get_memory_info"),
        # torch 2.9 (the Ascend seeds' torch 2.9.0 + torch_npu 2.9.0.post1): torch.accelerator.memory exists without
        # get_memory_info; the device module's mem_get_info must answer instead of None
        (False, "module.mem_get_info"),
    ],
)
def test_memory_info_reads_the_accelerator_api_or_falls_back_to_the_device_module(
    monkeypatch, accelerator_has_query, expected_call
):
    calls = []
    accelerator_figures, module_figures = (5 * 2**30, 64 * 2**30), (3 * 2**30, 32 * 2**30)
    memory = types.SimpleNamespace(max_memory_allocated=_fake_memory_query(calls, "accelerator.max", 7))
    if accelerator_has_query:
        memory.get_memory_info = _fake_memory_query(calls, "accelerator.get_memory_info", accelerator_figures)
    module = types.SimpleNamespace(mem_get_info=_fake_memory_query(calls, "module.mem_get_info", module_figures))
    monkeypatch.setattr(torch, "accelerator", _FakeAccelerator("cuda", memory), raising=False)
    monkeypatch.setattr(torch, "get_device_module", lambda kind: module)

    expected = accelerator_figures if accelerator_has_query else module_figures
    assert devices.memory_info("cuda:1") == expected
    assert calls == [(expected_call, torch.device("cuda:1"))]
    # the accelerator API still serves the queries it has
    assert devices.max_memory_allocated("cuda:1") == 7


def test_memory_info_uses_the_device_module_when_the_accelerator_is_another_type(monkeypatch):
    calls = []
    memory = types.SimpleNamespace(get_memory_info=_fake_memory_query(calls, "accelerator", (1, 2)))
    module = types.SimpleNamespace(mem_get_info=_fake_memory_query(calls, "module", (3, 4)))
    monkeypatch.setattr(torch, "accelerator", _FakeAccelerator("mps", memory), raising=False)
    monkeypatch.setattr(torch, "get_device_module", lambda kind: module)
    assert devices.memory_info("cuda:0") == (3, 4)
    assert calls == [("module", torch.device("cuda:0"))]


def test_memory_info_is_none_without_any_query(monkeypatch):
    monkeypatch.setattr(torch, "accelerator", _FakeAccelerator("cuda", types.SimpleNamespace()), raising=False)
    monkeypatch.setattr(torch, "get_device_module", lambda kind: types.SimpleNamespace())
    assert devices.memory_info("cuda:0") is None


@pytest.mark.parametrize(
    ("device", "expected"), [("cpu", True), ("cuda:0", True), ("npu", False), ("npu:3", False), ("mps", False)]
)
def test_supports_float64_by_device_type(device, expected):
    assert devices.supports_float64(device) is expected
    if device in ("cpu", "cuda:0"):
        assert devices.supports_float64(torch.device(device)) is expected


@pytest.mark.parametrize(
    ("device", "kind", "gqa"),
    [("cpu", "cpu", True), ("cuda:1", "cuda", True), ("npu:3", "npu", False), (" NPU", "npu", False)],
)
def test_device_type_and_sdpa_gqa_support(device, kind, gqa):
    assert devices.device_type(device) == kind
    assert devices.supports_sdpa_gqa(device) is gqa
    if kind in ("cpu", "cuda"):
        assert devices.device_type(torch.device(device.strip())) == kind


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_forced_lower_cpu_capability_keeps_bf16_attention_working(capability):
    """On an AVX-512/AMX CPU, torch's bf16 flash attention raises under a forced lower ATen capability."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "from deliverykit.device import guard_cpu_kernels\n"
        "expected = bool(torch.cpu._is_avx512_supported())\n"
        "assert guard_cpu_kernels() is expected, expected\n"
        "q = torch.randn(1, 2, 64, 32, dtype=torch.bfloat16)\n"
        "out = F.scaled_dot_product_attention(q, q, q)\n"
        "ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float())\n"
        "assert (out.float() - ref).abs().max() < 2e-2\n"  # bf16 rounding of inputs and output
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_cpu_kernels_are_left_alone_at_the_native_capability():
    import torch

    if os.environ.get("ATEN_CPU_CAPABILITY"):
        pytest.skip("this process runs under a forced ATEN_CPU_CAPABILITY")
    assert devices.guard_cpu_kernels() is False and torch.backends.cuda.flash_sdp_enabled()


def test_backend_on_the_cpu_is_no_ops_and_none_counters():
    runtime = devices.backend("cpu")
    runtime.synchronize()
    runtime.empty_cache()
    runtime.reset_peak_memory_stats()
    assert (runtime.type, runtime.module) == ("cpu", None)
    assert runtime.max_memory_allocated() is None and runtime.memory_info() is None  # "n/a", never a fake 0
    assert runtime.name == devices.device_name("cpu") and runtime.name
    assert devices.backend(None).type == "cpu" and devices.backend(None).max_memory_allocated() is None


def test_backend_drives_the_device_module(monkeypatch):
    calls = []
    module = types.SimpleNamespace(
        synchronize=lambda device: calls.append(("synchronize", device)),
        empty_cache=lambda: calls.append(("empty_cache",)),
        get_device_name=lambda device: "Ascend910B3",
    )
    monkeypatch.setattr(torch, "get_device_module", lambda kind: module)
    runtime = devices.backend("cuda:2")
    runtime.synchronize()
    devices.empty_cache("cuda:2")  # the function spelling goes through the same object
    assert calls == [("synchronize", torch.device("cuda:2")), ("empty_cache",)]
    assert runtime.name == "Ascend910B3"


@pytest.mark.parametrize(("kind", "float64", "default"), [("cpu", True, "fp32"), ("cuda", True, "bf16")])
def test_backend_dtype_policy(kind, float64, default):
    runtime = devices.backend(kind)
    assert runtime.supports_float64 is float64
    assert runtime.default_dtype("bf16") == default
    assert runtime.adjust_dtype(torch.float64) == torch.float64
    assert runtime.adjust_dtype(torch.float16) == torch.float16


def test_backend_adjust_dtype_downcasts_float64_where_unsupported(monkeypatch):
    runtime = devices.backend("cpu")
    monkeypatch.setattr(devices.DeviceBackend, "type", "npu")  # torch.device("npu") needs torch_npu
    assert runtime.adjust_dtype(torch.float64) == torch.float32
    assert runtime.adjust_dtype(torch.bfloat16) == torch.bfloat16
    assert runtime.default_dtype("fp16") == "fp16"


@pytest.mark.parametrize(
    ("cpuinfo", "computes"),
    [
        ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16 avx512vl\n", False),
        ("processor\t: 0\nflags\t\t: fpu avx512f avx512_fp16 amx_bf16\n", True),
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes fphp asimdhp cpuid\n", True),  # Kunpeng 920
        ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n", False),  # Armv8.0 without half precision
    ],
)
def test_cpu_fp16_arithmetic_is_read_from_the_cpu_flags(tmp_path, cpuinfo, computes):
    """Without native fp16 arithmetic (x86 AVX512-FP16/AMX-FP16, Arm asimdhp) fp16 models are computed in fp32."""
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert devices.cpu_computes_fp16(str(path)) is computes


def test_cpu_fp16_arithmetic_is_no_without_cpuinfo(tmp_path):
    assert devices.cpu_computes_fp16(str(tmp_path / "absent")) is False


def test_half_precision_models_compute_in_float32_only_on_a_cpu_without_fp16(monkeypatch):
    import torch

    monkeypatch.setattr(devices, "cpu_computes_fp16", lambda: False)
    assert devices.half_compute_dtype("cpu") == torch.float32
    assert devices.half_compute_dtype("meta") == torch.float16  # an accelerator keeps the released dtype
    monkeypatch.setattr(devices, "cpu_computes_fp16", lambda: True)
    assert devices.half_compute_dtype(torch.device("cpu")) == torch.float16
