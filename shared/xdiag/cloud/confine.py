"""Runs a program that may write under one folder only: `python -m xdiag.cloud.confine FOLDER PROGRAM [ARG...]`.

The local stack's storage emulator (fake-gcs-server) keeps each object in a file named after the object, and takes a
name like `a/../../../x` for a path: whoever can reach the bucket could write (and delete) anywhere its process may.
Confined with Linux Landlock (an unprivileged sandbox, Linux 5.13+), it may create, write, rename and delete under
its own folder and nowhere else; what it opened before (its log) stays writable. Where the kernel has no Landlock,
the program runs unconfined and says so on stderr (its log).
"""

from __future__ import annotations

import ctypes
import os
import sys

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_NO_NEW_PRIVS = 38  # prctl PR_SET_NO_NEW_PRIVS: required before an unprivileged process restricts itself

_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # Landlock ABI 2 and 3


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(libc, *args) -> int:
    result = libc.syscall(*args)
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def confine_writes(folder: str) -> None:
    """From now on this process and what it runs may write under `folder` only; OSError where Landlock is missing."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = _syscall(libc, _CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    writes = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE | (_REFER if abi >= 2 else 0) | (
        _TRUNCATE if abi >= 3 else 0)
    handled = ctypes.c_uint64(writes)  # struct landlock_ruleset_attr's first field is all an older kernel reads
    ruleset = _syscall(libc, _CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    try:
        beneath = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            rule = _PathBeneath(writes, beneath)
            _syscall(libc, _ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                     ctypes.c_uint32(0))
        finally:
            os.close(beneath)
        if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        _syscall(libc, _RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


def main(argv: list[str]) -> None:
    folder, program = argv[0], argv[1:]
    try:
        confine_writes(folder)
    except (OSError, AttributeError) as exc:
        print(f"xdiag.cloud.confine: Landlock is not available ({exc}): {program[0]} runs unconfined and may write "
              f"outside {folder}", file=sys.stderr, flush=True)
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
