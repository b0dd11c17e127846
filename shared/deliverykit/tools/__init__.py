"""Maintainer tools, never on a run's path: the ``deliverykit`` command line (``commands``), README tables rendered
from results JSON (``readme``) and publishing one delivery as a standalone tree (``publish``)."""
