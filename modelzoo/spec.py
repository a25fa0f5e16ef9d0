"""What a model reads: a :class:`FeatureSpec` of columns, made from the data sets' schemas.

Numeric features, categorical ids with their vocabulary sizes, optional
multi-hot lists and the label columns; :func:`criteo_spec` and
:func:`movielens_spec` make the spec of the data :mod:`datasets` writes.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

from modelzoo.repository import import_datasets


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """The columns a model reads.

    Attributes:
      numeric: float32 columns of shape ``[batch]``.
      categorical: id column -> vocabulary size (ids in ``[0, size)``).
      multi_hot: list-of-ids column -> vocabulary size; delivered to the
        model as a ``[batch, size]`` float32 indicator.
      labels: label columns, the first is the training target.
    """

    numeric: Tuple[str, ...] = ()
    categorical: Tuple[Tuple[str, int], ...] = ()
    multi_hot: Tuple[Tuple[str, int], ...] = ()
    labels: Tuple[str, ...] = ("label",)

    @property
    def columns(self) -> List[str]:
        """Every Parquet column the input pipeline reads, labels included."""
        return (list(self.numeric) + [n for n, _ in self.categorical] + [n for n, _ in self.multi_hot]
                + list(self.labels))

    def vocab(self, name: str) -> int:
        for column, size in self.categorical + self.multi_hot:
            if column == name:
                return size
        raise KeyError(f"feature {name!r} is not a categorical feature of this spec; "
                       f"it has {', '.join(n for n, _ in self.categorical + self.multi_hot)}")


def criteo_spec(cardinalities: Sequence[int]) -> FeatureSpec:
    """The Criteo layout (:mod:`datasets.schema`): 13 numeric features and 26 id columns of these sizes."""
    schema = import_datasets().schema
    if len(cardinalities) != len(schema.CATEGORICAL):
        raise ValueError(f"got {len(cardinalities)} table sizes for the {len(schema.CATEGORICAL)} categorical "
                         "Criteo columns C1..C26; pass one size per column")
    return FeatureSpec(numeric=tuple(schema.DENSE), categorical=tuple(zip(schema.CATEGORICAL, cardinalities)),
                       labels=(schema.LABEL,))


def movielens_spec(users: int, items: int, genres: int = 0) -> FeatureSpec:
    """MovieLens as converted by :mod:`datasets.movielens`: user and movie ids, genres, rating and label."""
    return FeatureSpec(categorical=(("user_id", users), ("item_id", items)),
                       multi_hot=(("genres", genres),) if genres else (), labels=("rating", "label"))
