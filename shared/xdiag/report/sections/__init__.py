"""The detail sections of the page, one per question, each built from the tool results that answer it.

Each fact has one table: the op table lives in the op-profile section only; other sections name ops and link to
it. A section whose tool did not run, failed or has no data for this platform says so, with the tool's reason.
"""
