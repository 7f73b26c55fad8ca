"""Cloud Function `dead_letter`: a message on any `<topic>-dead-letter` → recorded in Firestore with the
reason; a lost tool run becomes a failed tool, a lost stage fails its analysis, so no analysis hangs."""

import functions_framework
from xdiag.cloud.runtime import dead_letter_stage
from xdiag.pipeline.stages.dead_letter import dead_letter as dead_letter_handler


@functions_framework.cloud_event
@dead_letter_stage
def dead_letter(letter, deps):
    dead_letter_handler(letter, deps)
