"""tvmgrad's log output: one ``tvmgrad`` logger on stderr, with TVM's chatter routed into it.

Results go to stdout (``--json`` documents among them), so nothing else may: meta_schedule's
own console handler prints its tuning tables to stdout, and tuning runs inside ``stdout_to_log``.
``-v`` shows INFO (what is being built and tuned), ``-vv`` DEBUG (meta_schedule's tables).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys

__all__ = ["logger", "configure", "show_progress", "stdout_to_log"]

logger = logging.getLogger("tvmgrad")
_MS = "tvm.s_tir.meta_schedule"
_state = {"quiet": False}


def configure(verbosity: int = 0, quiet: bool = False) -> None:
    """Level and stderr handler of the ``tvmgrad`` logger (the command line calls this once)."""
    _state["quiet"] = quiet
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbosity, 2)]
    logger.setLevel(level)
    if not any(getattr(h, "_tvmgrad", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tvmgrad: %(levelname)s: %(message)s"))
        handler._tvmgrad = True
        logger.addHandler(handler)


def show_progress() -> bool:
    """Progress bars only on an interactive terminal (tqdm's ``\\r`` updates garble log files)
    and not under ``--quiet``."""
    return not _state["quiet"] and sys.stderr.isatty()


@contextlib.contextmanager
def stdout_to_log(name: str = "tvmgrad.meta_schedule", level: int = logging.DEBUG):
    """Lines printed to ``sys.stdout`` inside the block become records of logger ``name``.

    meta_schedule configures a console handler on ``sys.stdout`` at every tuning call; made
    inside this block, it writes here instead of into the caller's stdout."""
    log = logging.getLogger(name)
    with contextlib.redirect_stdout(_LineWriter(lambda line: log.log(level, "%s", line))):
        yield


class _LineWriter(io.TextIOBase):
    def __init__(self, emit):
        self._emit, self._pending = emit, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                self._emit(line)
        return len(text)

    def flush(self) -> None:
        if self._pending.strip():
            self._emit(self._pending)
        self._pending = ""
