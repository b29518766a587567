"""Attention analysis of trained checkpoints (`lsan analyze`): sparsity, rank, locality, pictures.

measures.py holds the pure formulas, attention.py the extraction from checkpoints, plots.py the
pictures and report.py the JSON and markdown outputs.
"""
