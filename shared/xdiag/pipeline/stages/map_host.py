"""Stage `map_host` (`host-maps` → `captures`): one host file of a many-host session decoded into its prepared
columns, and the maps' fan-in that announces the session again for collect to assemble (the reduce)."""

from __future__ import annotations

import time
from typing import Any

from xdiag.errors import PoisonMessage, ProfileError
from xdiag.model import Analysis, CaptureReady, HostMapRun, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import host_file_key
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.stages.analysis_record import analysis_inputs, load_analysis
from xdiag.pipeline.topics import CLAIMS, TOPIC_CAPTURES, host_maps_collection


def input_of(analysis: Analysis, message: HostMapRun) -> BlobInfo | None:
    """The analysis' input a map run names (that URI at that generation), or None."""
    return next((i for i in analysis_inputs(analysis)
                 if (i.uri, i.generation) == (message.uri, message.generation)), None)


def map_host(message: HostMapRun, deps: Dependencies) -> None:
    """The map stage: decodes one host file of a many-host session into its prepared columns and records it; the
    delivery that finds every host of the analysis recorded announces the session again on `captures`, once (a
    create-if-absent claim), for collect to assemble. A file that cannot be read is recorded FAILED with the reason
    (collect then fails the analysis, naming it); a second delivery decodes nothing again."""
    analysis = load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    if analysis.status != "MAPPING_HOSTS":
        return  # reduced already, finished, failed or superseded: nothing waits for this host any more
    info = input_of(analysis, message)
    if info is None:
        raise PoisonMessage(f"{message.uri} (generation {message.generation!r}) is not a file of analysis "
                            f"{analysis.analysis_id}")
    collection, key = host_maps_collection(analysis.analysis_id), host_file_key(info)
    if deps.state.get(collection, key) is None:
        started = time.perf_counter()
        record: dict[str, Any] = {"uri": info.uri, "host": info.uri.rsplit("/", 1)[-1], "input_bytes": info.size}
        try:
            prepared, size = deps.sessions.map_host_file(info, analysis.output_uri)
            record.update(status="DONE", prepared_uri=prepared, prepared_bytes=size)
        except ProfileError as exc:
            record.update(status="FAILED", reason=str(exc))
        except FileNotFoundError:
            record.update(status="FAILED", reason=f"{record['host']}: profile object missing or replaced since the "
                                                  "analysis began")
        record.update(duration_ms=round((time.perf_counter() - started) * 1000, 1), finished_at=utc_now())
        deps.state.set(collection, key, record)
        deps.on_event("map_host", {k: record.get(k) for k in ("host", "status", "duration_ms", "reason")})
    reduce_when_mapped(deps, analysis, message.attempt)


def reduce_when_mapped(deps: Dependencies, analysis: Analysis, attempt: int) -> None:
    """The maps' fan-in: with every host file recorded, the session announced again for collect, once."""
    done = {key for key, _ in deps.state.list(host_maps_collection(analysis.analysis_id))}
    if not {host_file_key(info) for info in analysis_inputs(analysis)} <= done:
        return  # more hosts to come: the last one's delivery goes on
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.reduce", {"at": utc_now()}):
        deps.bus.publish(TOPIC_CAPTURES, CaptureReady(
            analysis_id=analysis.analysis_id, run_id=analysis.run_id, session_id=analysis.session_id,
            profile_uris=analysis.profile_uris, output_uri=analysis.output_uri, investigator=analysis.investigator,
            hosts_mapped=True, attempt=attempt))
