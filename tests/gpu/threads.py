"""A fresh thread for the GPU tests: one that never made a CUDA call, so no context is current in it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


def in_new_thread(work: Callable[[], object]) -> None:
    """Run ``work`` and a synchronize in a new thread; re-raise here whatever it raised there."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
            torch.cuda.synchronize()
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
