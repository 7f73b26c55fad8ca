"""The options and help texts several command families share."""

from __future__ import annotations

import typer

from xdiag.cli.console import positive_number

PATH_HELP = "An *.xplane.pb file, a folder of one session's *.xplane.pb (one per host), or an XProf log dir (…/plugins/profile/<session>/)."

STACK_DIR = typer.Option("--stack-dir", envvar="XDIAG_STACK_DIR", help="Where the local stack keeps its state and logs.")

URL_OPTION = typer.Option("--url", envvar="XDIAG_CONTROL_PLANE_URL", help="The control plane (default: the local stack's).")
TOKEN_OPTION = typer.Option("--token", envvar="XDIAG_CONTROL_PLANE_TOKEN", help="Its bearer token (default: the local stack's).")
RUN_HELP = "The run: its id, or its display name (the ML Diagnostics SDK gives runs a UUID; the name works too)."
MAX_PROFILE_HELP = ("Refuse sessions larger than this (GiB). Of a folder of several hosts, each host file; all of them "
                    "together only where the hosts cannot be summarised (PyTorch traces).")
MAX_PROFILE_OPTION = typer.Option("--max-profile-gib", help=MAX_PROFILE_HELP,
                                  callback=lambda value: positive_number("--max-profile-gib", value))
HOSTS_HELP = "Registered target names, comma-separated (default: every target of the run)."
SESSION_HELP = "RUN/SESSION, or SESSION with --run."
