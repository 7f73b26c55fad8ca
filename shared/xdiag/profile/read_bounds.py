"""The time bound of every profile read: whatever a file holds, its read costs a bounded multiple of its size.

The decoders walk each byte a bounded number of times and refuse more events or lines than the bytes can hold
(wire.MIN_EVENT_BYTES, reader.MIN_LINE_BYTES), so their time is linear in the file's size; the deadline is what
stops a read that is not, whatever the reason (a decoder's bug, a machine swapping), with a ProfileError."""

from __future__ import annotations

import time

from xdiag.errors import ProfileError

READ_SECONDS = 30.0
READ_SECONDS_PER_MIB = 1.0
"""A read stops past READ_SECONDS + READ_SECONDS_PER_MIB a MiB of the file (the 200 MiB bench profile reads in about
4 s, a 150 MB Kineto trace in about 10)."""


def read_deadline(size: int) -> float:
    """The time.monotonic() past which the read of a file of `size` bytes stops."""
    return time.monotonic() + READ_SECONDS + READ_SECONDS_PER_MIB * size / 2**20


def check_deadline(deadline: float, name: str, where: int) -> None:
    """A ProfileError where `deadline` has passed; `where` is the byte (of the file, or of the inflated trace) the
    read is at."""
    if time.monotonic() > deadline:
        raise ProfileError(f"{name}: the read took longer than its bound ({READ_SECONDS:.0f} s + "
                           f"{READ_SECONDS_PER_MIB:.0f} s a MiB) and stopped at byte {where}; not read")
