"""The analysis pipeline: its messages' topics, the ports, the storage layout, the run registry and the stages
(register, collect, run_tool, aggregate, investigate, render, dead_letter). Cloud-free: adapters live in xdiag.cloud."""
