"""The installed package under test, shared by the GPU test modules.

Skips the calling module cleanly (at collection) when the wheel is not installed or torch sees
no CUDA device, so the same ``pytest`` command runs on machines without either.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch


def installed_package(name: str = "tile_kernels_aot") -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    """(package, its quant module, its errors module, its _runtime module)."""
    package = pytest.importorskip(name)
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    return (package, importlib.import_module(f"{name}.quant"), importlib.import_module(f"{name}.errors"),
            importlib.import_module(f"{name}._runtime"))
