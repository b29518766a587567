"""What a model needs to know about its data: sizes only, so configs stay JSON.

Stdlib only: the artifact records it and the device reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataInfo:
    num_items: int  # catalogue size |V| (ids 1..|V|, 0 = padding)
    num_categories: int  # category ids incl. 0 = padding and 1 = unknown
    num_slots: int  # time-slot ids incl. 0 = padding and 1 = unknown
    max_len: int  # longest input sequence (positions)
    num_users: int = 0  # user ids 0..num_users-1 (models with user embeddings); 0 = unknown
