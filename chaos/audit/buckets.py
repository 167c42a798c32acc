"""ID-space buckets: how the ordered overlap scan (``chaos.audit.checks``) is spread over cores.

The ID space is cut into buckets of about ``BUCKET_ROWS`` blocks each:
piecewise-uniform buckets planned from the Parquet footers' min/max statistics
(``plan_buckets``), so a skewed ID space still balances.  Each bucket is one
window-function group; the carry row that summarises the buckets before it is
``chaos.audit.checks``' business.  ``Buckets.add_to`` computes the bucket of a
column on Spark, ``Buckets.of`` the same function in Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

BUCKET_ROWS = 8192      # target blocks per ID-space bucket (one window group)
MAX_BUCKETS = 16384
MAX_SEGMENTS = 64


@dataclass(frozen=True)
class Buckets:
    """Piecewise-uniform buckets: segment k covers [lo_k, lo_{k+1}) in ``nsub`` equal sub-buckets."""
    los: tuple[int, ...]
    widths: tuple[int, ...]
    nsub: int

    @property
    def count(self) -> int:
        return len(self.los) * self.nsub

    def add_to(self, df, col: str = "start", name: str = "bucket"):
        """``df`` with the bucket of ``col``: a binary CASE tree picks the segment (integer leaves, so the
        generated code stays small enough for the JIT to compile it), then one division."""

        def tree(i: int, j: int) -> str:
            if j - i == 1:
                return str(i + 1)
            m = (i + j) // 2
            return f"CASE WHEN {col} < {self.los[m]}L THEN {tree(i, m)} ELSE {tree(m, j)} END"
        k = f"_{name}_segment"
        los = f"array({', '.join(f'{x}L' for x in self.los)})"
        widths = f"array({', '.join(f'{x}L' for x in self.widths)})"
        df = df.withColumn(k, F.expr(tree(0, len(self.los))))
        return df.withColumn(name, F.expr(
            f"CAST(({k} - 1) * {self.nsub} + LEAST(GREATEST({col} - element_at({los}, {k}), 0L) "
            f"DIV element_at({widths}, {k}), {self.nsub - 1}L) AS INT)")).drop(k)

    def of(self, x: int) -> int:  # the same function in Python (tests)
        k = max(0, sum(1 for lo in self.los[1:] if x >= lo))
        return k * self.nsub + min(max(x - self.los[k], 0) // self.widths[k], self.nsub - 1)


def plan_buckets(pieces: list[tuple[int, int, int]], total: int, buckets: int | None = None) -> Buckets:
    """Buckets of about equal row counts from (min, max, rows) pieces (row-group statistics): the rows are
    taken as spread uniformly over each piece; segment edges are quantiles of that mixture."""
    if not pieces:
        return Buckets((0,), (1,), 1)
    n_buckets = buckets or max(1, min(MAX_BUCKETS, -(-total // BUCKET_ROWS)))
    lo_all = min(p[0] for p in pieces)
    hi_all = max(p[1] for p in pieces) + 1
    k = max(1, min(MAX_SEGMENTS, n_buckets))
    points = sorted({p[0] for p in pieces} | {p[1] + 1 for p in pieces})
    weight = sum(p[2] for p in pieces)

    def cdf(x: int) -> float:
        s = 0.0
        for lo, hi, n in pieces:
            if x >= hi + 1:
                s += n
            elif x > lo:
                s += n * (x - lo) / (hi + 1 - lo)
        return s

    cs = [cdf(x) for x in points]
    edges = [lo_all]
    for q in range(1, k):
        target = weight * q / k
        for i in range(1, len(points)):
            if cs[i] >= target:
                a, b, ca, cb = points[i - 1], points[i], cs[i - 1], cs[i]
                x = b if cb == ca else a + int((target - ca) / (cb - ca) * (b - a))
                break
        else:
            x = hi_all
        if edges[-1] < x < hi_all:
            edges.append(x)
    nsub = max(1, n_buckets // len(edges))
    bounds = edges + [hi_all]
    widths = tuple(max(1, -(-(bounds[i + 1] - bounds[i]) // nsub)) for i in range(len(edges)))
    return Buckets(tuple(edges), widths, nsub)

