"""lsan: on-device lightweight sequential recommendation (LSAN) with baselines and export."""

__version__ = "0.1.0"
