"""Shared test settings for deliverykit's tests."""

from __future__ import annotations

import os

# Commits made by tests work on a bare CI machine and ignore the developer's git configuration.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Delivery Tests",
    "GIT_AUTHOR_EMAIL": "tests@example.com",
    "GIT_COMMITTER_NAME": "Delivery Tests",
    "GIT_COMMITTER_EMAIL": "tests@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,  # no user settings (signing, hooks, default branch) on a developer machine
    "GIT_CONFIG_NOSYSTEM": "1",
}
