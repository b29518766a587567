"""Code assignment for `codes` item tables: which codewords each item uses, decided by data.

Id arithmetic (the LSAN paper's quotient-remainder) makes unrelated items share rows; the
on-device literature (OD-Rec, EODRec) instead lets the data decide. Three sources:
- `arithmetic`: mixed-radix codes of the id (the starting assignment; unique per item);
- `popularity`: mixed-radix codes of the item's rank in training popularity, so the most
  popular items differ in the first book, and with `own_rows` = H the H most popular items get a
  row of their own in the hybrid book;
- `teacher`: k-means of a trained teacher's item vectors (projected to the student's D by PCA
  when the sizes differ), so similar items share codewords. Full-width books (`codes`) are
  residual k-means: book 1 clusters the vectors, book n the residuals left by books 1..n-1.
  Split books (`pq`) are product quantization: book n clusters dims [n D/N, (n+1) D/N). The
  centroids initialise the codebooks and the residual of each own-row item its own row.
The assignment is deterministic (seeded k-means), so every process of a distributed run and a
resumed run compute the same codes; the codes are saved in the checkpoint either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lsan.models.item_tables import CodeTable, mixed_radix


def popularity_rank(counts: np.ndarray) -> np.ndarray:
    """rank[v] of every id v (0 = most popular; padding id 0 last), stable on ties."""
    order = np.argsort(-np.asarray(counts[1:], dtype=np.float64), kind="stable") + 1
    rank = np.empty(len(counts), dtype=np.int64)
    rank[order] = np.arange(len(order))
    rank[0] = len(counts) - 1
    return rank


def cluster(x: np.ndarray, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded k-means of rows x into at most m clusters: labels (n,) and an (m, d) codebook
    (rows past the number of points stay zero)."""
    from sklearn.cluster import KMeans

    k = min(m, len(x))
    km = KMeans(n_clusters=k, n_init=1, max_iter=50, random_state=seed)
    labels = km.fit_predict(x)
    book = np.zeros((m, x.shape[1]))
    book[:k] = km.cluster_centers_
    return labels, book


def residual_kmeans(
    vectors: np.ndarray, sizes: list[int], seed: int
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Codes (n, N), centroids per level, and the final residuals of `vectors` (n, D)."""
    residual = vectors.astype(np.float64)
    codes, books = [], []
    for level, m in enumerate(sizes):
        labels, book = cluster(residual, m, seed + level)
        codes.append(labels)
        books.append(book)
        residual = residual - book[labels]
    return np.stack(codes, axis=1), books, residual


def subspace_kmeans(
    vectors: np.ndarray, sizes: list[int], widths: list[int], seed: int
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Product quantization: codes (n, N), centroids per book, residuals of `vectors` (n, D)."""
    x = vectors.astype(np.float64)
    starts = np.cumsum([0, *widths[:-1]])
    fits = [cluster(x[:, at : at + w], m, seed + level)
            for level, (m, w, at) in enumerate(zip(sizes, widths, starts, strict=True))]  # fmt: skip
    parts = np.concatenate([book[labels] for labels, book in fits], axis=1)
    return np.stack([labels for labels, _ in fits], axis=1), [b for _, b in fits], x - parts


def project(vectors: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """The teacher's vectors in the student's width: PCA down, zero-padded up."""
    if vectors.shape[1] == dim:
        return vectors
    if vectors.shape[1] > dim:
        from sklearn.decomposition import PCA

        return PCA(n_components=dim, random_state=seed).fit_transform(vectors)
    return np.pad(vectors, ((0, 0), (0, dim - vectors.shape[1])))


def assign(
    table: CodeTable, source: str, own_rows: int, counts: np.ndarray,
    teacher_vectors: torch.Tensor | None = None, seed: int = 0,
) -> dict[str, float]:  # fmt: skip
    """Install `source`'s codes in `table` (and, from a teacher, initial codebooks).

    counts (|V|+1,): training interactions per id. teacher_vectors (|V|+1, D_t): the teacher's
    output item vectors (`item_emb.matrix()`). Returns a summary: distinct code tuples and the
    k-means relative reconstruction error, for the checkpoint's metrics.
    """
    n_books = len(table.sizes) - (1 if own_rows > 0 else 0)
    main = table.sizes[:n_books]
    rank = torch.as_tensor(popularity_rank(counts))
    summary: dict[str, float] = {}
    if source == "arithmetic":
        codes = table.codes.long().clone()
    elif source == "popularity":
        codes = torch.minimum(mixed_radix(rank, main), torch.tensor(main) - 1)
    elif source == "teacher":
        if teacher_vectors is None:
            raise ValueError("model.codes_from=teacher needs a teacher: pass --teacher CKPT")
        x = project(teacher_vectors.detach().cpu().double().numpy()[1:], table.dim, seed)
        widths = table.widths[:n_books]
        if all(w == table.dim for w in widths):
            item_codes, books, residual = residual_kmeans(x, main, seed)
        else:
            item_codes, books, residual = subspace_kmeans(x, main, widths, seed)
        codes = torch.zeros(table.num_ids, n_books, dtype=torch.long)
        codes[1:] = torch.as_tensor(item_codes)
        with torch.no_grad():
            for t, book in zip(table.tables, books, strict=False):
                t.copy_(torch.as_tensor(book, dtype=t.dtype))
            if own_rows > 0:  # own rows start from what the books could not express
                top = torch.nonzero(rank < own_rows).flatten()
                own = table.tables[-1]
                own.zero_()
                own[rank[top] + 1] = torch.as_tensor(residual[top.numpy() - 1], dtype=own.dtype)
        summary["kmeans_relative_error"] = float(
            float(np.linalg.norm(residual)) / max(float(np.linalg.norm(x)), 1e-12)
        )
    else:
        raise ValueError(f"unknown codes source {source!r}")
    if own_rows > 0:
        hybrid = torch.where(rank < own_rows, rank + 1, torch.zeros_like(rank))
        codes = torch.cat([codes[:, :n_books], hybrid[:, None]], dim=1)
    table.set_codes(codes)
    summary["distinct_codes"] = float(len({tuple(c) for c in table.codes[1:].tolist()}))
    return summary


def teacher_vectors(teacher: Any) -> torch.Tensor:
    """A teacher's output item vectors (|V|+1, D): its item table's explicit matrix."""
    table = getattr(teacher, "item_emb", None)
    if table is None or not hasattr(table, "matrix"):
        raise ValueError(
            f"the teacher ({type(teacher).__name__}) has no item table to take codes from"
        )
    return table.matrix()
