"""What every benchmark here shares: import paths and the shape of its results report.

Imported first by every script here (the script's own folder is on ``sys.path``): it makes the delivery's package,
and deliverykit in the monorepo without `make`, importable.
"""

import sys
from pathlib import Path
from typing import Any

DELIVERY_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DELIVERY_DIR))
try:
    import deliverykit  # noqa: F401
except ImportError:  # monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(DELIVERY_DIR.parent / "shared"))


def benchmark_report(device: Any, results: dict[str, Any]) -> dict[str, Any]:
    """A deliverykit run report of kind ``benchmark`` for this delivery (random inputs, this machine's fingerprint).

    ``results`` holds ``tables`` for the README backfill, next to the raw numbers.
    """
    from deliverykit.report import build_report, environment_fingerprint

    return build_report(
        "benchmark",
        "trellis2-npu",
        random_weights=True,
        environment=environment_fingerprint(device, DELIVERY_DIR),
        results=results,
    )
