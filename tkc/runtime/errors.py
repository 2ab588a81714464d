"""Errors raised by the prebuilt kernels. Each message names the argument and the fix."""

from __future__ import annotations


class KernelError(Exception):
    """Base of every error this package raises on purpose."""


class KernelArgumentError(KernelError, ValueError):
    """A tensor or scalar argument does not fit the kernel (dtype, device, shape, strides, alignment)."""


class VariantNotFoundError(KernelError, LookupError):
    """No prebuilt variant covers the call's compile-time parameters."""


class ArchMismatchError(KernelError, RuntimeError):
    """The wheel's cubins were built for another GPU architecture than the device's."""


class NoGpuError(KernelError, RuntimeError):
    """No CUDA GPU is visible to torch."""


class CudaDriverError(KernelError, RuntimeError):
    """A CUDA driver call failed."""


class CorruptPackageError(KernelError, RuntimeError):
    """A file of the installed package differs from what its build recorded (damaged or modified)."""
