"""Test-order options for the whole suite: a test whose result depends on what ran before it is a defect.

``pytest --order reverse`` or ``--order shuffle --order-seed N`` reorders the modules (and the tests inside each
module), keeping each module's tests together so module fixtures are still built once. Every xdist worker computes
the same order from the seed, as xdist requires. ``--order given`` keeps pytest's own order.

The default, ``heavy-first``, is pytest's order with the modules that hold a ``heavy`` test moved to the front: with
``--dist loadscope`` a module runs whole on one worker, and a long module handed out last ran alone at the end while
the other worker idled (the longest-first rule of scheduling).
"""

from __future__ import annotations

import os
import random

import pytest

from deliverykit.testing import RAY_LOOPBACK_ENV

os.environ.update(RAY_LOOPBACK_ENV)  # before any test imports ray, in every process and the ones they start


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("order", "test order (to find tests that depend on what ran before them)")
    group.addoption(
        "--order", choices=("heavy-first", "given", "reverse", "shuffle"), default="heavy-first",
        help="module and test order",
    )  # fmt: skip
    group.addoption("--order-seed", type=int, default=0, help="seed of --order shuffle (printed in the header)")


def pytest_report_header(config: pytest.Config) -> str | None:
    order = config.getoption("order")
    if order in ("given", "heavy-first"):
        return None
    return f"test order: {order}" + (f" (--order-seed {config.getoption('order_seed')})" if order == "shuffle" else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order = config.getoption("order")
    if order == "given":
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups = list(modules.values())
    if order == "heavy-first":
        groups.sort(key=lambda group: not any(item.get_closest_marker("heavy") for item in group))  # stable
    elif order == "reverse":
        groups = [group[::-1] for group in groups[::-1]]
    else:
        rng = random.Random(config.getoption("order_seed"))
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
    items[:] = [item for group in groups for item in group]
