"""PNG bar chart of each kernel's share of the card's copy bandwidth, from a bench.py results.json.

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
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
    bars = ax.barh(labels, values, color=["#4c72b0" if v >= 80 else "#dd8452" for v in values])
    ax.bar_label(bars, labels=[f"{v:.0f}%  ({r['gb_s']:.0f} GB/s)" for v, r in zip(values, rows)], padding=3)
    ax.axvline(100, color="black", linewidth=1)
    ax.axvline(80, color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(0, 125)
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
