"""Imported first by every benchmark here (the script's own folder is on ``sys.path``): it makes the delivery's
package, and deliverykit in the monorepo without `make`, importable. Reports: ``deliverykit.report.delivery_report``.
"""

import sys
from pathlib import Path

DELIVERY_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DELIVERY_DIR))
try:
    import deliverykit  # noqa: F401
except ImportError:  # monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(DELIVERY_DIR.parent / "shared"))
