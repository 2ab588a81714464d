"""Launch chosen moe_expand variants of tkc_tuning51 once each on the sparse routing (for ncu)."""
import importlib
import sys

import torch

sys.path.insert(0, "benchmarks/tuning")
sys.path.insert(0, "benchmarks")
import sweep

names = sys.argv[1:]
pkg = importlib.import_module("tkc_tuning51")
found = {v.name: v for v in sweep.variants(pkg, sweep.SWEEPS["tkc_tuning51"])}
case = sweep.expand_case({"dtype": "bfloat16", "with_sf": False, "routing": "sparse"})
args = case.make(case.new_x())
torch.cuda.synchronize()
for n in names:
    found[n].launch(*args)
    torch.cuda.synchronize()
    print("launched", n, found[n].describe_knobs())
