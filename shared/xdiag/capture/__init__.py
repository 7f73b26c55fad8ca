"""Capture: the capture stage (on demand, snapshot, automatic), the step-time monitor, the control plane and its
client, XProf's profiler client, and `workload.attach` that a training job calls. Builds on xdiag.pipeline."""
