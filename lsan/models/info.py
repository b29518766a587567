"""DataInfo, re-exported: it lives in lsan.info, which needs no torch (the artifact uses it)."""

from lsan.info import DataInfo

__all__ = ["DataInfo"]
