"""The error hierarchy of tkc.

Every error carries an exit code and a message that names the file, the key or
argument, the bad value and the fix. The CLI prints the message without a
traceback (``--debug`` shows it).
"""

from __future__ import annotations


class TkcError(Exception):
    """Base of every error tkc raises on purpose."""

    exit_code = 1


class SpecError(TkcError):
    """A kernel spec is malformed: bad key, value, type or constraint."""

    exit_code = 2


class UsageError(TkcError):
    """The command line asked for something that does not exist (arch, kernel, variant)."""

    exit_code = 2


class TemplateError(TkcError):
    """A template is missing, fails to render, or renders a module without ``prim_func``."""

    exit_code = 3


class LowerError(TkcError):
    """TileLang failed to lower a variant, or its launch contract cannot be recorded."""

    exit_code = 3


class ToolchainError(TkcError):
    """nvcc or the CUDA headers are missing or fail to compile a kernel."""

    exit_code = 4


class PackageError(TkcError):
    """The generated package or its wheel could not be written."""

    exit_code = 5
