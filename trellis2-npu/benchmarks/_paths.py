"""Make the delivery's package (and deliverykit, in the monorepo without `make`) importable from a benchmark.

Imported first by every script here; the script's own folder is on ``sys.path``, so ``import _paths`` works.
"""

import sys
from pathlib import Path

DELIVERY_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DELIVERY_DIR))
try:
    import deliverykit  # noqa: F401
except ImportError:  # monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(DELIVERY_DIR.parent / "shared"))
