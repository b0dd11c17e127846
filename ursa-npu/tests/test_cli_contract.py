"""inference.py keeps deliverykit's command-line contract (bad output, device, text, --batch lines and flags)."""

from __future__ import annotations

import pytest

from deliverykit.testing import CliContract

from .conftest import DELIVERY_DIR


class TestCliContract(CliContract):
    inference = DELIVERY_DIR / "inference.py"
    output = written = "out.jpg"
    text_flag = "--prompt"
    batch_line = '{"prompt": "a cat"}'

    @pytest.fixture
    def run_flags(self, patched_upstream) -> tuple:
        return ("--upstream", patched_upstream)  # skips without $URSA_SRC
