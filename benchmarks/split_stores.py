"""Find 16-byte global stores that nvcc split into four 4-byte stores, in built cubins.

nvcc (13.0) emits some `*(uint4*)(p + offset)` stores of TileLang's vectorized loops as four
st.global.u32 when it cannot re-derive the address's 16-byte alignment from a long offset sum
(benchmarks/tuning/README.md, sweep 42). In the SASS that is four STG.E (no width suffix) at
+0, +4, +8 and +12 from one base register. Where a kernel's L2 is its limit, such a store costs
four times the sector accesses of its bytes; ``store_v4`` in ``kernels/quant/common.py`` stores one vector.

    python benchmarks/split_stores.py build/pkg/tile_kernels_aot/sm90/tile_kernels_aot/cubins

needs cuobjdump and nvdisasm (``pip install --target DIR nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``,
then ``--cuobjdump DIR/nvidia/cu13/bin/cuobjdump``, or either on PATH). Prints each cubin with such
runs and a count per kernel name; exit status 1 if any were found.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

# One 4-byte global store: optional predicate, STG.E with no width or cache suffix, [Rn.64 + offset].
_STORE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?P\d\s+)?STG\.E\s+(?:desc\[\w+\])?\[(R\d+)\.64(?:\+0x([0-9a-f]+))?\]")
_ANY_STORE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?ST[GS]\b")


def split_stores(sass: str) -> list[tuple[str, int]]:
    """(base register, first offset) of each run of four 4-byte global stores at +0, +4, +8, +12
    from one base, with no other store between them."""
    runs = []
    chain: list[tuple[str, int]] = []
    for line in sass.splitlines():
        match = _STORE.search(line)
        if match is None:
            if _ANY_STORE.search(line):
                chain = []  # another store in between: not one split vector
            continue
        base, offset = match.group(1), int(match.group(2) or "0", 16)
        if chain and chain[-1][0] == base and offset == chain[-1][1] + 4:
            chain.append((base, offset))
        else:
            chain = [(base, offset)]
        if len(chain) == 4:
            if chain[0][1] % 16 == 0:
                runs.append(chain[0])
            chain = []
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="cubins, or folders of them")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"), help="cuobjdump binary (default: on PATH)")
    args = parser.parse_args(argv)
    if not args.cuobjdump:
        parser.error("no cuobjdump on PATH: pip install --target DIR nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                     "then pass --cuobjdump DIR/nvidia/cu13/bin/cuobjdump")
    cubins = sorted(c for p in args.paths for c in (p.glob("*.cubin") if p.is_dir() else [p]))
    per_kernel: collections.Counter[str] = collections.Counter()
    for cubin in cubins:
        proc = subprocess.run([args.cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{cubin}: cuobjdump failed: {proc.stderr.strip()}", file=sys.stderr)
            return 2
        runs = split_stores(proc.stdout)
        if runs:
            per_kernel[cubin.stem.rsplit("_", 1)[0]] += 1
            print(f"{cubin.name}: {len(runs)} split 16-byte store(s) at " + ", ".join(f"[{b}+{o:#x}]" for b, o in runs))
    print(f"{sum(per_kernel.values())} of {len(cubins)} cubins: " + (", ".join(f"{k} {n}" for k, n in
                                                                        per_kernel.most_common()) or "none"))
    return 1 if per_kernel else 0


if __name__ == "__main__":
    sys.exit(main())
