"""Every torch-npu call the product code makes, checked against the real torch-npu wheels (no NPU, no CANN).

No NPU has run this code. The wheels users install are public, though, and say in plain files what each op takes:
an op missing in one checked release, a keyword it does not know, a literal of the wrong type or an ``input_layout``
its documentation does not list would be a crash on the first NPU run. The call sites are found by scanning the
product code (``scan_calls``), not from a hand list. The wheels are downloaded once (about 40 MB each) into
``deliverykit.tools.npu_wheels.cache_dir()``; offline, the wheel tests skip saying so.
"""

from __future__ import annotations

import inspect
import zipfile
from pathlib import Path

import pytest

from deliverykit import device, ops
from deliverykit.tools import npu_wheels
from deliverykit.tools.npu_wheels import CallSite, call_problems, parse_schema, reference_problems, scan_calls

REPO = Path(__file__).resolve().parents[2]
PRODUCT = [REPO / "shared" / "deliverykit"] + [REPO / d / f"{d.split('-')[0]}_npu" for d in ("trellis2-npu",
    "sulphur2-npu", "ursa-npu")]  # fmt: skip
SCRIPTS = [REPO / d / name for d in ("trellis2-npu", "sulphur2-npu", "ursa-npu") for name in ("inference.py", "app.py")]


def _product_files() -> list[Path]:
    files = [path for folder in PRODUCT for path in folder.rglob("*.py") if "tools" not in path.parts[-3:-1]]
    return files + [path for path in SCRIPTS if path.is_file()]


@pytest.fixture(scope="module")
def sites() -> list[CallSite]:
    return scan_calls(_product_files(), REPO)


@pytest.fixture(scope="module", params=[(v, a) for v in npu_wheels.CHECKED_VERSIONS for a in npu_wheels.ARCHES],
    ids=lambda p: f"{p[0]}-{p[1]}")  # fmt: skip
def wheel(request) -> npu_wheels.Wheel:
    version, arch = request.param
    try:
        path = npu_wheels.fetch_wheel(version, arch)
    except npu_wheels.WheelUnavailable as err:
        pytest.skip(f"{err}; needs the package index once (then cached in {npu_wheels.cache_dir()})")
    return npu_wheels.read_wheel(path, version, arch)


def _documented(wheel: npu_wheels.Wheel, op: str) -> dict[str, set[str]]:
    return {argument: wheel.documented_values(op, argument) for argument in ("input_layout", "sparse_mode")}


# ----------------------------------------------------------------------------------------- the scan and the checks


def test_the_scan_finds_every_kind_of_npu_call(tmp_path):
    root = tmp_path
    source = root / "module.py"
    source.write_text(
        "import torch, torch_npu\n"
        "def f(x, g, q, k, v, *args, **kwargs):\n"
        "    torch_npu.npu_rms_norm(x, g, epsilon=1e-6)\n"
        "    use(torch_npu.npu_swiglu, x)\n"
        "    torch_npu.npu_fusion_attention(q, k, v, *args, **kwargs)\n"
        "    torch.npu.mem_get_info(0)\n"
        "    torch.get_device_module('npu').set_device(0)\n"
    )
    found = {(site.target, site.name, site.called, site.forwards) for site in scan_calls([source], root)}
    assert found == {
        ("op", "npu_rms_norm", True, False),
        ("op", "npu_swiglu", False, False),
        ("op", "npu_fusion_attention", True, True),
        ("npu", "mem_get_info", True, False),
        ("npu", "set_device", True, False),
    }


def test_a_misspelled_keyword_or_a_wrong_value_is_reported():
    schema = parse_schema(
        "func: npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, float scale=1., int[]? actual_seq_qlen=None, int sparse_mode=0) -> (Tensor, Tensor)"
    )
    documented = {"input_layout": {"BSND", "TND"}, "sparse_mode": {"0", "1"}}
    site = CallSite("x.py:1", "op", "npu_fusion_attention", 3, (("head_num", 8), ("input_layout", "TDN"),
        ("actual_seq_q_len", [2, 4]), ("scale", "0.1"), ("sparse_mode", 9)), True)  # fmt: skip
    problems = call_problems(site, schema, documented)
    assert len(problems) == 4, problems
    assert any("'TDN'" in p for p in problems) and any("no argument 'actual_seq_q_len'" in p for p in problems)
    assert any("scale='0.1'" in p for p in problems) and any("sparse_mode=9" in p for p in problems)
    short = CallSite("x.py:2", "op", "npu_fusion_attention", 3, (("head_num", 8),), True)
    assert call_problems(short, schema, documented) == [
        "x.py:2: npu_fusion_attention(...) lacks the required argument(s) input_layout"
    ]

    def misspelled_reference(query, key, value, head_num, input_layout, pse=None, scale=1.0, actual_seq_q_len=None):
        """A reference whose keyword callers would pass on to the op, misspelled."""

    assert reference_problems(misspelled_reference, schema) == ["actual_seq_q_len: the op has no such argument"]


def test_every_torch_npu_op_is_called_only_through_a_kernel_with_an_op_reference(sites):
    used = {site.name for site in sites if site.target == "op"}
    assert used == set(ops.NPU_OPS), "a torch_npu op outside deliverykit.ops' NPU_OPS (give it an op reference)"
    outside = [site.where for site in sites if site.target == "op" and not site.where.startswith("shared/")]
    assert not outside, f"torch_npu ops called outside deliverykit.ops: {outside}"


# -------------------------------------------------------------------------------------------- against the wheels


def test_every_op_exists_and_its_reference_matches_the_schema(wheel, sites):
    for op, reference in ops.NPU_OPS.items():
        schema = wheel.schemas.get(op)
        assert schema is not None, f"torch-npu {wheel.version} ({wheel.arch}) has no op {op}"
        assert reference_problems(reference, schema) == [], f"{op} on torch-npu {wheel.version}"
        for site in (s for s in sites if s.target == "op" and s.name == op):
            assert call_problems(site, schema, _documented(wheel, op)) == []


def test_the_values_the_references_accept_are_documented(wheel):
    documented = _documented(wheel, "npu_fusion_attention")
    assert set(ops.FUSION_ATTENTION_LAYOUTS) <= documented["input_layout"], documented
    default_sparse_mode = inspect.signature(ops.NPU_OPS["npu_fusion_attention"]).parameters["sparse_mode"].default
    assert str(default_sparse_mode) in documented["sparse_mode"]  # the only mode the reference models


def test_every_torch_npu_function_we_call_exists_and_takes_the_device(wheel, sites):
    for site in (s for s in sites if s.target == "npu"):
        params = wheel.npu_functions.get(site.name)
        assert params is not None, f"{site.where}: torch.npu.{site.name} is missing in torch-npu {wheel.version}"
        assert site.positional <= len(params), f"{site.where}: torch.npu.{site.name}{params} gets {site.positional}"


def test_the_environment_we_set_is_read_by_torch_npu(wheel):
    unread = [name for name in device.NPU_ENV_DEFAULTS if not wheel.reads_variable(name)]
    assert not unread, f"torch-npu {wheel.version} ({wheel.arch}) reads none of {unread}"


# ------------------------------------------------------------------------- DrivingSDK (mx-driving), the optional kernel


@pytest.fixture(scope="module", params=[(v, a) for v in npu_wheels.MX_DRIVING_VERSIONS for a in npu_wheels.ARCHES],
    ids=lambda p: f"mx-driving-{p[0]}-{p[1]}")  # fmt: skip
def mx_driving_wheel(request) -> Path:
    version, arch = request.param
    try:
        return npu_wheels.fetch_wheel(version, arch, package="mx-driving")
    except npu_wheels.WheelUnavailable as err:
        pytest.skip(f"{err}; needs the package index once (then cached in {npu_wheels.cache_dir()})")


def test_the_subm_conv_function_takes_our_arguments_in_our_order(mx_driving_wheel):
    """``Function.apply`` is positional: a renamed, added or reordered parameter would shift every argument."""
    params = npu_wheels.function_params(mx_driving_wheel, *ops.MX_DRIVING_SUBM_CONV)
    assert params == ops.MX_DRIVING_SUBM_CONV_ARGS, f"{mx_driving_wheel.name}: forward{params}"


def test_a_reordered_or_missing_function_is_reported(tmp_path):
    member, owner, name = ops.MX_DRIVING_SUBM_CONV
    planted = tmp_path / "planted.whl"
    swapped = ", ".join(("ctx", "indices", "features", *ops.MX_DRIVING_SUBM_CONV_ARGS[2:]))
    source = f"class {owner}:\n    @staticmethod\n    def forward({swapped}):\n        pass\n\n{name} = {owner}.apply\n"
    with zipfile.ZipFile(planted, "w") as wheel:
        wheel.writestr(member, source)
    params = npu_wheels.function_params(planted, member, owner, name)
    assert params is not None and params != ops.MX_DRIVING_SUBM_CONV_ARGS and params[:2] == ("indices", "features")
    assert npu_wheels.function_params(planted, member, owner, "renamed") is None
    assert npu_wheels.function_params(planted, "mx_driving/elsewhere.py", owner, name) is None
