"""The analysis of one session: its timeline (steps, ops, devices), the step breakdown, the HLO cost model and
XProf's own views. Reads profiles (xdiag.profile); knows nothing of tools, investigators or the pipeline."""
