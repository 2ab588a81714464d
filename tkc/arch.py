"""Everything tkc knows about a GPU architecture lives here, and only here."""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class SMResources:
    """What one SM holds for its resident blocks (the CUDA occupancy calculator's figures).

    The same for compute capability 9.0 and 10.0: 64 Ki registers, allocated per warp in units of
    256; 2048 threads and 32 blocks; 228 KiB of shared memory, of which every block also takes 1 KiB
    the system reserves.
    """

    registers: int = 64 * 1024
    register_unit: int = 256  # registers are allocated per warp, in multiples of this
    threads: int = 2048
    blocks: int = 32
    shared_memory: int = 228 * 1024
    reserved_per_block: int = 1024


@dataclass(frozen=True, kw_only=True)
class Occupancy:
    """Resident blocks per SM of one launch, and the resource that bounds them."""

    blocks: int
    limit: str  # "threads", "blocks", "registers" or "shared memory"

    def __str__(self) -> str:
        return f"{self.blocks} ({self.limit})"


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
    sm: SMResources = SMResources()

    def occupancy(self, *, threads: int, registers: int, shared_memory: int) -> Occupancy:
        """Blocks of ``threads`` threads, ``registers`` per thread and ``shared_memory`` bytes (static
        plus dynamic) that one SM holds at once; the first resource to run out names the limit (ties:
        threads, then blocks, registers, shared memory). Kernel resources come from the cubin, so this
        needs no GPU: it is how a launch bound or a tile change moves the resident blocks."""
        sm = self.sm
        warps = -(-threads // 32)
        warp_registers = -(-registers * 32 // sm.register_unit) * sm.register_unit
        bounds = {
            "threads": sm.threads // max(threads, 1),
            "blocks": sm.blocks,
            "registers": sm.registers // warp_registers // warps if warp_registers else sm.blocks,
            "shared memory": sm.shared_memory // (shared_memory + sm.reserved_per_block),
        }
        limit = min(bounds, key=lambda name: bounds[name])
        return Occupancy(blocks=bounds[limit], limit=limit)

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
        # Blackwell Ultra: TileLang 0.1.15 lowers and nvcc 13.0 assembles sm_103a; the shipped specs do not list it
        # (no B300 to run them on), a user's spec may.
        Arch(
            name="sm103",
            target="sm_103a",
            major=10,
            minor=3,
            gpus="B300/GB300",
            vector_bytes=16,
            alignment=32,
            max_dynamic_smem=227 * 1024,
        ),
    )
}


# What `tkc build` builds without --arch: the archs the shipped specs declare.
DEFAULT_ARCHS = ("sm90", "sm100")


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
