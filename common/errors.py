"""The project's own exceptions: problems a user can fix, each phrased for them.

``g2rpo`` prints any :class:`G2RPOError` as one ``g2rpo: error: ...`` line (exit 2)
and lets every other exception show its traceback: that one is a bug. Each class
also keeps the builtin base code and tests have always caught (``ValueError``,
``FileNotFoundError``, ``RuntimeError``)."""

from __future__ import annotations


class G2RPOError(Exception):
    """A problem the user can fix; its message says what and where."""


class ConfigError(G2RPOError, ValueError):
    """A configuration problem: names the dotted field path, the value and the reason."""


class UsageError(G2RPOError, ValueError):
    """A command-line option, or an input it names, that the command cannot use."""


class RunDirError(G2RPOError, ValueError):
    """A run or comparison directory that is not one, is incomplete, or cannot be
    continued as asked."""


class ModelPathError(G2RPOError, FileNotFoundError):
    """A model or checkpoint path that is missing or incomplete."""


class RunFailed(G2RPOError, RuntimeError):
    """A run or comparison that stopped for the reason the message names (it can be
    resumed once that is fixed)."""
