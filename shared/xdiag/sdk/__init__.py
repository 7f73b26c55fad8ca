"""What a user's training job imports: `xdiag.sdk.workload.attach` starts JAX's profiler server and registers the
host with the control plane as a profiler target of its run (and, optionally, reports step times for the monitor).
Of xdiag it uses only the control plane's client (xdiag.control.client, standard library only), so a job installs
none of the cloud's dependencies for it."""
