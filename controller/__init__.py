"""WDRF controller: weighted-DRF fairness, approval classes and aging for Kueue + HAMi."""

__version__ = "0.1.0"
