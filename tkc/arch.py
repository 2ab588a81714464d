"""Everything tkc knows about a GPU architecture lives here, and only here."""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Arch:
    """One target architecture of the build."""

    name: str  # the short name users type and wheels carry: "sm90"
    target: str  # TileLang / nvcc arch: "sm_90a" (arch-specific features: wgmma, TMA, setmaxnreg)
    major: int  # compute capability the cubins run on, checked by the loader at run time
    minor: int
    gpus: str  # human names for error messages
    # Widest global load/store one thread issues: templates size their vectors from this,
    # never from the GPU of the build machine (there may be none).
    vector_bytes: int
    # Alignment the loader demands of every tensor's data pointer: the widest global access
    # the compiler may emit for the arch (Blackwell has 32-byte loads; nvcc fuses two adjacent
    # 16-byte vectors into one when it can prove 32-byte alignment of the row starts).
    alignment: int
    max_dynamic_smem: int  # bytes per block opt-in limit

    @property
    def gencode(self) -> str:
        """nvcc's -gencode value producing SASS only (no PTX: nothing is JIT-compiled at run time)."""
        num = self.target.removeprefix("sm_")
        return f"arch=compute_{num},code={self.target}"

    @property
    def elf_sm(self) -> int:
        """The SM number a cubin for this arch carries in its ELF header."""
        return self.major * 10 + self.minor


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            name="sm90",
            target="sm_90a",
            major=9,
            minor=0,
            gpus="H100/H200",
            vector_bytes=16,
            alignment=16,
            max_dynamic_smem=227 * 1024,
        ),
        Arch(
            name="sm100",
            target="sm_100a",
            major=10,
            minor=0,
            gpus="B200/GB200",
            vector_bytes=16,
            alignment=32,
            max_dynamic_smem=227 * 1024,
        ),
    )
}


def get_arch(name: str) -> Arch:
    """The arch called ``name`` ("sm90", also accepted: "sm_90a", "90")."""
    key = name.strip().lower().removeprefix("sm_").removeprefix("sm").removesuffix("a")
    arch = ARCHS.get(f"sm{key}")
    if arch is None:
        raise UsageError(f"unknown arch {name!r}; choose from {', '.join(ARCHS)}")
    return arch


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """``"sm90,sm100"`` -> the two archs, in the order given, without duplicates."""
    archs: list[Arch] = []
    for part in text.split(","):
        if part.strip():
            arch = get_arch(part)
            if arch not in archs:
                archs.append(arch)
    if not archs:
        raise UsageError(f"--arch {text!r} names no arch; choose from {', '.join(ARCHS)}")
    return tuple(archs)
