"""The exact fp32 helpers of tests/reference/numeric.py against Python's exact fractions."""

from __future__ import annotations

from fractions import Fraction

import torch

from tests.reference.numeric import fma_f32


def test_fma_f32_rounds_once() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4000, generator=gen) * torch.exp2(torch.randint(-30, 30, (4000,), generator=gen).float())
    b = torch.rand(4000, generator=gen)
    # Sums whose float64 rounding lands on a float32 midpoint: a * b = 2^-24 (1 + z) with 0 < z < 2^-29, so that
    # 1 + a * b rounds up to 1 + 2^-23 once, but to the midpoint 1 + 2^-24 in float64 and then to 1.0 (even); and
    # 1 - 2^-25 (1 + z), below 1 (where the spacing is 2^-24), which rounds down to 1 - 2^-24 once, but to the
    # midpoint 1 - 2^-25 in float64 and then to 1.0.
    a = torch.cat([a, torch.tensor([1.4145241975784302 * 2.0**-25, -1.4145241975784302 * 2.0**-26])])
    b = torch.cat([b, torch.tensor([1.413902997970581, 1.413902997970581])])
    got = fma_f32(a, b, 1.0)
    for x, y, r in zip(a.tolist(), b.tolist(), got.tolist(), strict=True):
        exact = Fraction(x) * Fraction(y) + 1
        want = torch.tensor(float(exact), dtype=torch.float64)
        # float(Fraction) rounds correctly to float64; ties to float32 are then resolved against the exact value.
        lo = want.float()
        candidates = {float(lo), float(torch.nextafter(lo, torch.tensor(torch.inf))),
                      float(torch.nextafter(lo, torch.tensor(-torch.inf)))}
        best = min(candidates, key=lambda c: (abs(Fraction(c) - exact), int(torch.tensor(c).view(torch.int32)) & 1))
        assert r == best, (x, y, r, best)
    assert got[-2] == 1 + 2.0**-23 and got[-1] == 1 - 2.0**-24
    naive = (a[-2:].double() * b[-2:].double() + 1).float()
    assert naive[0] == 1.0 and naive[1] == 1.0  # the double rounding fma_f32 avoids
