"""Exit codes and the one-line error every delivery prints on bad input.

Deliveries raise :class:`DeliveryError` (or a subclass) with a message that names the problem and the fix;
:func:`run_main` turns it into ``error: <message>`` on stderr, an ``EXIT_CODE=N`` evidence line and the exit code.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable


class ExitCode(enum.IntEnum):
    """Documented process exit codes, shared by every delivery's ``inference.py``."""

    OK = 0
    FAILURE = 1  # unexpected error (a bug: the traceback is printed)
    USAGE = 2  # bad command-line arguments (argparse)
    INPUT = 3  # input file missing, unreadable, not an image or a decompression bomb
    WEIGHTS = 4  # weights folder missing, incomplete, corrupt or of another architecture
    DEVICE = 5  # requested device not available
    OUTPUT = 6  # cannot write an output: a folder in its way, not writable, disk full or over quota (files.Outputs)
    NUMERICS = 7  # NaN or Inf in an output
    ACCURACY = 8  # an accuracy check failed its thresholds
    BATCH_PARTIAL = 9  # a batch ran to its end, but some items failed (batch.json names them)
    DISTRIBUTED = 10  # another rank of a multi-card run failed, died or lost the rendezvous store


class DeliveryError(Exception):
    """An error the user can fix; carries its exit code."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(DeliveryError):
    exit_code = ExitCode.INPUT


class WeightsError(DeliveryError):
    exit_code = ExitCode.WEIGHTS


class DeviceUnavailableError(DeliveryError):
    exit_code = ExitCode.DEVICE


class OutputError(DeliveryError):
    exit_code = ExitCode.OUTPUT


class NumericsError(DeliveryError):
    exit_code = ExitCode.NUMERICS


def run_main(main: Callable[[], int | None]) -> int:
    """Run ``main`` and map a :class:`DeliveryError` to its one-line message and exit code.

    The ``EXIT_CODE=N`` evidence line is printed on every path, so a log always says how the run ended.
    Unexpected exceptions keep their traceback (they are bugs) and exit with ``ExitCode.FAILURE``.
    """
    try:
        code = int(main() or 0)
    except DeliveryError as err:
        print(f"error: {err}", file=sys.stderr)
        code = int(err.exit_code)
    except SystemExit as exit_:  # argparse: usage errors exit 2, --help exits 0
        if not exit_.code:
            raise
        code = exit_.code if isinstance(exit_.code, int) else int(ExitCode.USAGE)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        code = 130
    except Exception:
        import traceback

        traceback.print_exc()
        code = int(ExitCode.FAILURE)
    print(f"EXIT_CODE={code}", flush=True)
    return code
