"""inference.py keeps deliverykit's command-line contract (bad output, device, --batch lines and flags); it takes
no free text, so the UTF-8 case does not apply."""

from __future__ import annotations

import pytest

from deliverykit.testing import CliContract

from .conftest import DELIVERY_DIR


class TestCliContract(CliContract):
    inference = DELIVERY_DIR / "inference.py"
    output, written = "out", "out/asset.glb"  # --output is the asset's folder
    smoke = ("--smoke", "tiny", "--device", "cpu")
    batch_line = '{"seed": 1}'  # --smoke: the tiny test image

    @pytest.fixture
    def run_flags(self, patched) -> tuple:
        return ("--upstream", patched, "--preview-frames", "0")  # skips without $TRELLIS2_SRC; no turntable
