"""Sharing a session's report: V4 signed links with an expiry, recorded with who asked (links.py), and the control
plane's endpoints for links, a run's readers and the monitored events (routes.py). Who may share is who may read
the run (xdiag.identity)."""
