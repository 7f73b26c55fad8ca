"""Capture: the capture stage on `alerts` (stage.py: on demand, snapshots, automatic), the client of XProf's profiler
servers it calls (profiler.py), the step-time monitor that raises alerts (monitor.py) and the monitored events it
records (monitored_events.py). Builds on xdiag.pipeline; the control plane that requests captures is xdiag.control."""
