"""Run-time asset checks: what a run loads, checked before it loads anything.

``manifest`` (a delivery's ``weights-manifest.json``: verify, pin, download), ``loadcheck`` (the check before
loading: missing or truncated files are exit 4, a file that differs from the release loads with one warning) and
``patches`` (the pinned upstream checkout and the delivery's patches: check, apply, clone, and the one way code is
imported from a checkout).
"""
