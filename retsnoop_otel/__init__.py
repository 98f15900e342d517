"""retsnoop-otel: retsnoop-style mass tracing of kernel functions, exported as OpenTelemetry."""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"


def interrupted_while_loading(signum: int, frame: object) -> None:
    """Ctrl-C while the command's modules load: nothing is attached, open or written yet, so it ends as a Ctrl-C
    at start-up does (130), without the traceback of the import it landed in. cli.main hands SIGINT back to
    Python's handler, which its own code catches."""
    _os._exit(130)


def _quiet_interrupt_while_loading() -> None:
    """Only for the command itself (the console script, or `python -m retsnoop_otel`, whose package is imported
    while argv[0] is '-m'), never for a program importing the package, and never over an ignored SIGINT."""
    argv0 = (getattr(_sys, "argv", None) or [""])[0]
    if _os.path.basename(argv0) != "retsnoop-otel" and argv0 != "-m":
        return
    try:
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, interrupted_while_loading)
    except ValueError:  # not the main thread
        pass


_quiet_interrupt_while_loading()


def _load_from_bundle() -> None:
    """The package's modules from its code bundle where one was written (code_bundle.py says why)."""
    from retsnoop_otel.code_bundle import install
    install(_os.path.dirname(__file__))


_load_from_bundle()
