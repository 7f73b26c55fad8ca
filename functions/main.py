"""All entry points in one module, for deploying from this folder (`--entry-point collect`, …)."""

from aggregate import aggregate
from capture import capture
from collect import collect
from control_plane import control_plane
from dead_letter import dead_letter
from investigate import investigate
from map_host import map_host
from monitor import monitor
from register import register
from render import render
from run_tool import run_tool
from sweep import sweep

__all__ = [
    "aggregate", "capture", "collect", "control_plane", "dead_letter", "investigate", "map_host", "monitor", "register", "render",
    "run_tool", "sweep",
]
