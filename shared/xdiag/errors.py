"""Errors the stages record and the CLI reports as a one-line reason."""


class XdiagError(Exception):
    """Base of xdiag's own errors: the message is meant for the user, as is."""


class ProfileError(XdiagError):
    """The input is not a readable profile session (missing, empty, corrupt, too large)."""


class NotAvailable(XdiagError):
    """A tool's data does not exist on this platform or in this profile; the message says why."""


class UnknownTool(XdiagError):
    """A tool name that is not in the registry."""


class PoisonMessage(XdiagError):
    """A message no retry can make work (malformed, an unknown session, a missing object): it goes to dead letters."""


class InvalidRequest(XdiagError, ValueError):
    """A request field or message id failed its check; the message says which and why (an HTTP 400, a refused
    message)."""


class UnsafeOutput(XdiagError, PermissionError):
    """An output that would be written outside its folder (a link planted among the folder's subfolders)."""


class OutputError(XdiagError, OSError):
    """The analysis folder cannot be made or written (read-only, full, below a file), or another analysis is
    writing there now."""
