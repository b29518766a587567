"""The catalogue as the demo page searches it: raw ids, titles (when the artifact carries them)
and category names. numpy and the standard library only, like the runtime.

`search(q)` returns every matching item index, best first: the raw id equal to q, raw ids that
start with q, titles that start with q, titles that contain q, then items whose category name
contains q (case-insensitive, whitespace collapsed); within a group, catalogue order. An empty
q lists the whole catalogue, the most popular training items first. Raw ids are matched by
binary search over the sorted ids and categories by one vectorised comparison, so a
million-item catalogue without titles costs no per-item strings; titles are casefolded once, at
the first search that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lsan.data.slots import UNKNOWN
from lsan.serving.runtime import Artifact

INT64_MAX = 2**63 - 1
NO_MATCH = np.iinfo(np.int8).max
EXACT_ID, ID_PREFIX, TITLE_PREFIX, TITLE_PART, CATEGORY = range(5)  # match groups, best first


@dataclass(frozen=True)
class Item:
    item_id: int  # raw id
    title: str | None  # None: the artifact has no title for it
    category: str | None  # category name; None for "unknown"


class Catalogue:
    def __init__(self, artifact: Artifact):
        self.raw_ids, self.sorted_ids, self.sorted_index = (
            artifact.raw_ids,
            artifact.sorted_ids,
            artifact.sorted_index,
        )
        self.category = artifact.category
        self.category_names = artifact.meta.category_names
        self.popular = np.asarray(artifact.popular, dtype=np.int64)
        self.titles = artifact.titles
        self.size = len(artifact.catalogue)
        self.index = artifact.indices
        self._folded: list[str] | None = None

    @property
    def has_titles(self) -> bool:
        return self.titles is not None

    def search(self, q: str) -> np.ndarray:
        """Indices of the items matching `q`, best first (see the module docstring)."""
        q = " ".join(q.split()).casefold()
        if not q:
            rest = np.ones(self.size + 1, dtype=bool)
            rest[0] = False
            rest[self.popular] = False
            return np.concatenate([self.popular, np.flatnonzero(rest)])
        group = np.full(self.size + 1, NO_MATCH, dtype=np.int8)

        def mark(indices: np.ndarray, g: int | np.ndarray) -> None:
            group[indices] = np.minimum(group[indices], g)

        if q.isascii() and q.isdigit() and len(q) <= 19 and (q == "0" or q[0] != "0"):
            value = int(q)
            # raw ids whose decimal form starts with q: [q, q+1) * 10^extra for each length
            for extra in range(1 if q == "0" else 20 - len(q)):
                lo = value * 10**extra
                if lo > INT64_MAX:
                    break
                hi = min((value + 1) * 10**extra - 1, INT64_MAX)
                a = int(np.searchsorted(self.sorted_ids, lo, side="left"))
                b = int(np.searchsorted(self.sorted_ids, hi, side="right"))
                mark(self.sorted_index[a:b], EXACT_ID if extra == 0 else ID_PREFIX)
        if self.titles is not None:
            where = [(i, at) for i, t in enumerate(self._fold()) if (at := t.find(q)) >= 0]
            found = np.asarray(where, dtype=np.int64).reshape(-1, 2)
            mark(found[:, 0], np.where(found[:, 1] == 0, TITLE_PREFIX, TITLE_PART))
        cats = [
            c for c, name in enumerate(self.category_names) if c > UNKNOWN and q in name.casefold()
        ]
        if cats:
            mark(np.flatnonzero(np.isin(self.category, cats)), CATEGORY)
        hits = np.flatnonzero(group < NO_MATCH)
        return hits[np.argsort(group[hits], kind="stable")]

    def describe(self, indices: np.ndarray) -> list[Item]:
        return [Item(item_id=int(self.raw_ids[i]),
                     title=(self.titles[i] or None) if self.titles is not None else None,
                     category=self.category_names[c] if (c := int(self.category[i])) > UNKNOWN else None)
                for i in indices.tolist()]  # fmt: skip

    def _fold(self) -> list[str]:
        if self._folded is None:  # two threads may both build it: the same list either way
            assert self.titles is not None
            self._folded = [" ".join(t.split()).casefold() for t in self.titles]
        return self._folded
