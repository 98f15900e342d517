"""The one signal between the thread-context reader (thread_ctx.py) and the watcher that paces it (watch.py)."""


class CheckDeferred(Exception):
    """A check of a process ran past its deadline after reading at least one ELF file: those read stay cached, and
    the next check of the process goes on from them. One check of a Python process reads dozens of libraries
    (0.5 s cold under emulation), which the poll loop, and a stop signal, would otherwise wait for."""
