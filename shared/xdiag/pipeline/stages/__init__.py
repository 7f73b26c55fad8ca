"""The pipeline's stages: register → collect → run_tool × each broad tool → aggregate → investigate → render, and
dead_letter. A many-host session (`SessionLoader.maps_hosts`) goes collect → map_host × each host file → collect
again (the reduce) before its tools.

Each stage is a handler `(message, deps)` that reads and writes through the ports and
publishes the next message. The same handlers run in-process for `xdiag analyze` and
behind Cloud Functions in the cloud. Every handler is idempotent: Pub/Sub delivers at
least once, so a second delivery finds its work done and changes nothing.

Every derived artefact is keyed by exact inputs: an analysis records the generation and size of every file it
covers, reads exactly those versions, and keeps its own files in its own folder; only the session's current
analysis writes the session's report. A late host or a replaced file makes a newer analysis current, and the
older one stops at its next stage (SUPERSEDED).

One module per stage: `register`, `collect`, `map_host`, `tool_runs` (run_tool and aggregate), `investigate`,
`render`, `dead_letter`; `analysis_record` is the analysis record they all read and write.
"""
