"""Numbers written in text that came from outside: a profile's names and stats, /proc, an HTTP header.

`str.isdigit()` is true of '²' and '①', which `int()` refuses, and `int()` takes other scripts' digits and
4,300 digits at most; a name that only looks numeric must read as a name. Every such number is read here."""

_MOST_DIGITS = 20  # a uint64's (XLA's program fingerprints): a longer run of digits is no count or id a profile means


def whole_number(text: str, default: int | None = None) -> int | None:
    """'36' -> 36; '', '²', '٣', '-1', ' 7', '1.5' and runs of more than 20 digits -> `default`."""
    if 0 < len(text) <= _MOST_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return default


def plain_number(text: str) -> int | float | None:
    """'38' -> 38, '12.5' -> 12.5; anything but ASCII digits with at most one '.' between them -> None."""
    whole, point, fraction = text.partition(".")
    if not point:
        return whole_number(whole)
    if whole_number(whole) is None or whole_number(fraction) is None:
        return None
    return float(text)
