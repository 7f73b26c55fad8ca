# State: runs/, runs/{run}/sessions/, analyses/, analyses/{id}/tools/, claims/, failures/, dead_letters/ in the
# (default) database, which the code's clients use. The state store reads documents by key and whole
# collections (xdiag.cloud.firestore); it runs no query that filters or orders on a field, so Firestore's
# automatic single-field indexes are all it needs and no composite index is declared here
# (tests/test_infra.py fails the day the code runs such a query without one).
#
# A project that already has a (default) database: `terraform import google_firestore_database.default
# "projects/PROJECT/databases/(default)"` before `apply`.

resource "google_firestore_database" "default" {
  name             = "(default)"
  location_id      = var.firestore_location != "" ? var.firestore_location : var.region
  type             = "FIRESTORE_NATIVE"
  concurrency_mode = "OPTIMISTIC"
  deletion_policy  = var.firestore_delete_on_destroy ? "DELETE" : "ABANDON"

  depends_on = [google_project_service.api]
}
