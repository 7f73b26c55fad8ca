"""All entry points in one module, for deploying from this folder (`--entry-point collect`, …)."""

from aggregate import aggregate
from collect import collect
from dead_letter import dead_letter
from investigate import investigate
from register import register
from render import render
from run_tool import run_tool

__all__ = ["aggregate", "collect", "dead_letter", "investigate", "register", "render", "run_tool"]
