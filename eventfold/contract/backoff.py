"""The one back-off rule every retry loop follows: the pause doubles from a first pause with
each failure in a row, up to a cap."""

from __future__ import annotations


def doubled(first_s: float, failures: int, most_s: float) -> float:
    """The pause after ``failures`` failures in a row: none after none, ``first_s`` after the
    first, twice the last after each further one, at most ``most_s``."""
    if failures <= 0:
        return 0.0
    return min(first_s * 2.0 ** min(failures - 1, 62), most_s)  # 2**63 would overflow a float
