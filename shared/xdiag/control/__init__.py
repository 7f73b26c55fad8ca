"""The control plane: the HTTP function over the run registry (plane.py: the ML Diagnostics SDK's self-hosted
contract, profiler targets, sessions, on-demand and continuous captures, step times for the monitor) and the client
the CLI, the agent and the in-job SDK call it with (client.py). Who may call it is xdiag.identity; the endpoints for
share links and readers it serves are xdiag.sharing.routes."""
