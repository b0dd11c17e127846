"""Requirements for a venv that reuses the platform's (system) torch: ``ci/setup_venv.sh`` runs this with ``$PYTHON``.

Why: the locks pin torch 2.13.0's stack (sympy 1.14.0, ...), while an Ascend image's torch 2.6 pins sympy 1.13.1;
accelerate and peft pull torch into the resolve, and pip would then silently replace the platform torch (and break
its torch_npu). So pip gets a constraint ``torch==<installed version>`` (it can never move torch) and no lock line
for a package that torch (or torch_npu), directly or through its own requirements, needs: the platform's versions
stay. Standard library only: it runs on the bare system interpreter.

usage: python ci/system_torch.py OUT_REQUIREMENTS OUT_CONSTRAINTS LOCK [LOCK ...]
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys

PLATFORM_PACKAGES = ("torch", "torch-npu")
# torch requires setuptools unversioned (Python >= 3.12); the venv needs the lock's for `pip install -e shared`.
ALWAYS_FROM_LOCK = frozenset({"setuptools"})
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"\bextra\s*==")


def normalize(name: str) -> str:
    """PEP 503 name (``Typing_Extensions`` → ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _applies(requirement: str) -> bool:
    """Whether a Requires-Dist line applies to this interpreter: no extra, and its marker (if packaging, or pip's
    vendored copy, can evaluate it; else kept, which at worst leaves out one more lock line) is true."""
    if _EXTRA.search(requirement):
        return False
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement
        except ImportError:
            return True
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def platform_owned() -> set[str]:
    """torch, torch-npu and everything they require here (transitively, through what is installed), extras left out."""
    owned, pending = set(), list(PLATFORM_PACKAGES)
    while pending:
        name = normalize(pending.pop())
        if name in owned:
            continue
        owned.add(name)
        dist = _installed(name)
        for requirement in (dist.requires or []) if dist is not None else []:
            match = _NAME.match(requirement)
            if match and _applies(requirement):
                pending.append(match.group(1))
    return owned - ALWAYS_FROM_LOCK


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out_requirements, out_constraints, locks = argv[0], argv[1], argv[2:]
    owned = platform_owned()
    kept, dropped = [], []
    for lock in locks:
        with open(lock, encoding="utf-8") as handle:
            for line in handle:
                match = _NAME.match(line.split("#", 1)[0])
                if match and normalize(match.group(1)) in owned:
                    dropped.append(line.split("#", 1)[0].strip())
                else:
                    kept.append(line.rstrip("\n"))
    constraints = [f"{name}=={_installed(name).version}" for name in PLATFORM_PACKAGES if _installed(name)]
    with open(out_requirements, "w", encoding="utf-8") as handle:
        handle.write("\n".join(kept) + "\n")
    with open(out_constraints, "w", encoding="utf-8") as handle:
        handle.write("\n".join(constraints) + "\n")
    kept_versions = sorted(
        f"{name} {_installed(name).version}" for name in owned - set(PLATFORM_PACKAGES) if _installed(name)
    )
    print(f"setup: constraint {' '.join(constraints)}; the platform's own stay: {', '.join(kept_versions) or 'none'}")
    print(f"setup: lock lines left out (the platform torch owns them): {', '.join(sorted(set(dropped))) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
