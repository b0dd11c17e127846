"""inference.py keeps deliverykit's command-line contract (bad output, device, text, --batch lines and flags)."""

from __future__ import annotations

from deliverykit.testing import CliContract

from .conftest import DELIVERY_DIR


class TestCliContract(CliContract):
    inference = DELIVERY_DIR / "inference.py"
    output, written = "out.mp4", "out_last.png"  # the last frame: a file the run writes beside the video
    text_flag = "--prompt"
    batch_line = '{"prompt": "a cat"}'
    smoke = ("--smoke", "--device", "cpu", "--schedule", "dev")  # two-stage with dev steps: a line may set steps
