"""Scoring functions of the MoE gates (TileKernels' ``tile_kernels.moe.scoring``).

The gates take the lower-case name (``scoring_func='sigmoid'``); ``str(ScoringFunc.SIGMOID)`` is
that name, and the enum's values are TileKernels' codes."""

from enum import IntEnum


class ScoringFunc(IntEnum):
    SIGMOID = 0
    SQRTSOFTPLUS = 1
    SOFTMAX = 2
    IDENTITY = 3

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def from_str(cls, label: str) -> "ScoringFunc":
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(f"{label!r} is not a valid {cls.__name__}; one of "
                             f"{', '.join(str(f) for f in cls)}") from None


__all__ = ["ScoringFunc"]
