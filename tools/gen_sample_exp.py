#!/usr/bin/env python3
"""Print the constants of the sampler's own exp (src/sample/sample_kernels.h), computed at 50 digits.

  ln2, 1/ln2, ln2 split into a 41-bit head and its remainder (Cody-Waite);
  q(r) ~ (e^r - 1) / r on |r| <= ln2/2 (+ a hair for the rounding of k): a Chebyshev fit of 11
  coefficients (mpmath.chebyfit), rounded to double, so that e^r ~ 1 + r * q(r) of degree 11.
The fit's error, re-evaluated with the rounded coefficients, is printed in ulps of 1 (about 0.1);
test_sample measures the whole function against libm's exp.

Needs mpmath (pip install mpmath). Re-running prints the same values."""
import math

import mpmath as mp

mp.mp.dps = 50


def hx(v):
    return float(v).hex()


ln2 = mp.log(2)
m, e = math.frexp(float(ln2))
ln2_hi = math.ldexp(math.floor(m * 2**41) / 2**41, e)
ln2_lo = ln2 - mp.mpf(ln2_hi)
print("LOG2E  ", hx(1 / ln2))
print("LN2_HI ", ln2_hi.hex())
print("LN2_LO ", hx(ln2_lo))

a = ln2 / 2 * (1 + mp.mpf(2) ** -20)
q, _ = mp.chebyfit(lambda r: mp.mpf(1) if r == 0 else mp.expm1(r) / r, [-a, a], 11, error=True)
qd = [float(c) for c in q]  # highest power first
for i, c in enumerate(qd):
    print(f"Q{len(qd) - 1 - i:<2}    {c.hex()}")
worst = mp.mpf(0)
for i in range(4001):
    r = -a + 2 * a * i / 4000
    acc = mp.mpf(0)
    for c in qd:
        acc = acc * r + mp.mpf(c)
    worst = max(worst, abs(1 + r * acc - mp.exp(r)) / mp.exp(r))
print("fit error", mp.nstr(worst / mp.mpf(2) ** -53, 3), "ulp")
