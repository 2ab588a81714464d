"""PNG bar chart of each kernel's share of the card's copy bandwidth, from a bench.py results.json.

Bars are blue where an op reaches 90% of the copy or 90% of its own mix ceiling, orange elsewhere.

    python benchmarks/plot.py RESULTS_DIR     # writes RESULTS_DIR/pct_copy.png

bench.py calls ``plot`` itself when matplotlib is importable (it is on the GPU image).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(results_json: Path, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU machine or in CI
    import matplotlib.pyplot as plt

    data = json.loads(results_json.read_text())
    rows = [r for r in data["rows"] if r.get("pct_copy") is not None]
    labels = [f"{r['op']}\n{r['shape']}" for r in rows]
    values = [r["pct_copy"] for r in rows]
    # The op's own ceiling (bench.py's "% mix": a kernel streaming exactly its bytes read and written) as % of
    # the copy, marked on its bar; results from before that column have none.
    ceilings = [r["pct_copy"] * 100 / r["pct_mix"] if r.get("pct_mix") else None for r in rows]
    near = [v >= 90 or (r.get("pct_mix") or 0) >= 90 for v, r in zip(values, rows)]
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.5))
    bars = ax.barh(labels, values, color=["#4c72b0" if ok else "#dd8452" for ok in near])
    ax.bar_label(bars, padding=3, labels=[
        f"{v:.0f}%  ({r['gb_s']:.0f} GB/s)" + (f", {r['pct_mix']:.0f}% of mix" if r.get("pct_mix") else "")
        for v, r in zip(values, rows)])
    marked = [(i, c) for i, c in enumerate(ceilings) if c is not None]
    if marked:
        ax.scatter([c for _, c in marked], [i for i, _ in marked], marker="|", s=300, color="black", zorder=3,
                   label="ceiling of the op's own bytes read and written (mix_ceiling.py)")
        ax.legend(loc="lower right", fontsize=8)
    ax.axvline(100, color="black", linewidth=1)
    ax.axvline(90, color="grey", linestyle="--", linewidth=1)  # issue 5's goal
    ax.set_xlim(0, 190)  # room for the labels
    ax.invert_yaxis()
    meta = data["meta"]
    ax.set_xlabel(f"% of copy bandwidth ({meta.get('copy_gb_s', 0):.0f} GB/s, read + written)")
    ax.set_title(f"{meta.get('gpu', 'GPU')}, {meta.get('package', '')} @ {meta.get('commit', '')}, "
                 f"{meta.get('date', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main() -> None:
    folder = Path(sys.argv[1])
    plot(folder / "results.json", folder / "pct_copy.png")
    print(folder / "pct_copy.png")


if __name__ == "__main__":
    main()
