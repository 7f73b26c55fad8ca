"""Byte counts as the one-line reasons write them."""


def readable_size(count: float) -> str:
    """2147483648 -> '2 GiB', 3.5 * 2**30 -> '3.5 GiB', 65536 -> '64 KiB', 300 -> '300 bytes': three significant
    digits at most, so a small limit never reads '0.00 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} bytes"
