#!/usr/bin/env python3
"""Print what an LTX-2.x single file is (family, dtypes, config source, derived configs) from its header alone.

    python sulphur2-npu/scripts/inspect_checkpoint.py ~/weights/Sulphur-2-base/sulphur_distil_bf16.safetensors \
        [--text-encoder DIR] [--model-config JSON]

Reads milliseconds of header, never the weights: what ``inference.py`` checks before loading (exit 4 for a file it
refuses, 3 for an unreadable ``--text-encoder`` or ``--model-config``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deliverykit.errors import run_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="LTX-2.x single-file .safetensors")
    parser.add_argument("--text-encoder", type=Path, help="Gemma-3 folder (config.json) to check the text split")
    parser.add_argument("--model-config", type=Path, help="ltx-core config JSON for a file without __metadata__")
    args = parser.parse_args(argv)
    # after the parse, so that --help answers without importing diffusers
    from sulphur2_npu.checkpoint import inspect_checkpoint
    from sulphur2_npu.configs import read_model_config
    from sulphur2_npu.loader import read_text_encoder_config

    model_config = read_model_config(args.model_config) if args.model_config is not None else None
    text_config = read_text_encoder_config(args.text_encoder) if args.text_encoder is not None else None
    print(inspect_checkpoint(args.checkpoint, text_encoder_config=text_config, model_config=model_config).summary())
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
