"""Expected distinct ids per worker and per owner, in closed form, from a per-table frequency model.

The model is the synthetic generator's own law (:mod:`datasets.synthetic`):
rank ``r`` of a table of ``n`` rows (0 the most frequent) is
``floor(X) - 1`` for ``X`` drawn from a continuous power law with exponent
``s`` on ``[1, n + 1)``, so with ``e = 1 - s`` and
``G(x) = (x**e - 1) / ((n + 1)**e - 1)`` (``log x / log(n + 1)`` at ``s = 1``)

    P(rank = r) = G(r + 2) - G(r + 1)

and ranks are scattered over the ids by :func:`datasets.synthetic.generate.rank_ids`
(a fixed bijection, as hashed ids are). A worker that looks up ``k`` ids
drawn independently from this law holds, in expectation,

    E[unique] = sum_r 1 - (1 - p_r)**k

distinct ids. The first :data:`HEAD` ranks are summed exactly (and assigned
to their owners ``id % N`` one by one); the tail is integrated over
geometric buckets of ranks, each holding its exact probability mass spread
evenly over its ranks (relative width :data:`BUCKET_WIDTH`: ``p`` varies by
about ``s * 1e-3`` inside one, so the error is far below a part in 10^4),
and is shared evenly among the owners. Nothing is sampled.

Where the generator draws ``X`` in float32, ranks far in the tail of a
table of millions of rows are reachable only every few ranks; that matters
only when a batch draws the same tail rank twice, which a worker's batch of
thousands of rows practically never does.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from datasets.synthetic.generate import DEFAULT_ZIPF, rank_ids

HEAD = 1 << 16
BUCKET_WIDTH = 1e-3


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """The id law of one table: ``size`` rows, rank ``r`` drawn with probability ~ ``r**-exponent``."""

    size: int
    exponent: float = DEFAULT_ZIPF

    def mass(self, lo, hi) -> np.ndarray:
        """Probability of the ranks in ``[lo, hi)`` (arrays allowed), computed without cancellation."""
        a = np.asarray(hi, dtype=np.float64) + 1.0
        b = np.asarray(lo, dtype=np.float64) + 1.0
        step = np.log1p((a - b) / b)
        e = 1.0 - self.exponent
        if abs(e) < 1e-9:
            return step / math.log(self.size + 1.0)
        return np.exp(e * np.log(b)) * np.expm1(e * step) / math.expm1(e * math.log(self.size + 1.0))


def _seen(p: np.ndarray, draws: int) -> np.ndarray:
    """``1 - (1 - p)**draws``: the chance that an id of probability ``p`` is among ``draws`` draws."""
    return -np.expm1(draws * np.log1p(-np.minimum(p, 1.0 - 1e-16)))


@functools.lru_cache(maxsize=256)
def _head_and_tail(law: PowerLaw, draws: int):
    """(per head rank: chance seen, summed expectation of the tail ranks); cached, so never written to."""
    head = min(law.size, HEAD)
    ranks = np.arange(head + 1, dtype=np.float64)
    head_seen = _seen(law.mass(ranks[:-1], ranks[1:]), draws)
    if law.size <= head:
        return head_seen, 0.0
    count = math.ceil(math.log(law.size / head) / math.log1p(BUCKET_WIDTH)) + 1
    edges = np.unique(np.round(np.geomspace(head, law.size, count)))
    widths = np.diff(edges)
    tail = float(np.sum(widths * _seen(law.mass(edges[:-1], edges[1:]) / widths, draws)))
    return head_seen, tail


def expected_unique(law: PowerLaw, draws: int) -> float:
    """Expected number of distinct ids among ``draws`` independent draws from ``law``."""
    if draws <= 0:
        return 0.0
    head_seen, tail = _head_and_tail(law, draws)
    return float(head_seen.sum()) + tail


def expected_owned(law: PowerLaw, draws: int, workers: int, table: int = 0) -> np.ndarray:
    """Expected distinct ids owned by each of ``workers`` ranks (``id % workers``) among ``draws`` draws.

    ``table`` picks the rank -> id scatter (:func:`datasets.synthetic.generate.rank_ids`).
    The entries sum to :func:`expected_unique`.
    """
    if draws <= 0:
        return np.zeros(workers)
    head_seen, tail = _head_and_tail(law, draws)
    owners = rank_ids(table, law.size, np.arange(len(head_seen))) % workers
    return np.bincount(owners, weights=head_seen, minlength=workers) + tail / workers
