# The profiles bucket, in XProf's layout (XProf/TensorBoard can open it as a log dir):
#   gs://BUCKET/<run>/plugins/profile/<session>/<host>.xplane.pb   the profiles
#   gs://BUCKET/<run>/plugins/profile/<session>/xdiag/…            the analyses (tools/, analysis.json, summary.html)
# Every object written starts the chain: its OBJECT_FINALIZE notification goes to the uploads topic, where
# register records it (objects outside the profile layout are ignored).

locals {
  bucket_name = var.bucket_name != "" ? var.bucket_name : "${var.project}-xdiag-profiles"
}

resource "google_storage_bucket" "profiles" {
  name                        = local.bucket_name
  location                    = var.bucket_location != "" ? var.bucket_location : var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.bucket_force_destroy
  labels                      = var.labels

  dynamic "retention_policy" {
    for_each = var.profile_retention_days > 0 ? [var.profile_retention_days] : []
    content {
      retention_period = retention_policy.value * 86400
    }
  }

  dynamic "lifecycle_rule" {
    for_each = var.profile_delete_after_days > 0 ? [var.profile_delete_after_days] : []
    content {
      condition {
        age = lifecycle_rule.value
      }
      action {
        type = "Delete"
      }
    }
  }

  depends_on = [google_project_service.api]
}

# The Cloud Storage service agent publishes the bucket's notifications.
data "google_storage_project_service_account" "gcs" {
  project = var.project

  depends_on = [google_project_service.api]
}

resource "google_pubsub_topic_iam_member" "gcs_publishes_uploads" {
  topic  = google_pubsub_topic.pipeline[local.uploads_topic].id
  role   = "roles/pubsub.publisher"
  member = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

resource "google_storage_notification" "uploads" {
  bucket         = google_storage_bucket.profiles.name
  topic          = google_pubsub_topic.pipeline[local.uploads_topic].id
  payload_format = "JSON_API_V1"
  event_types    = ["OBJECT_FINALIZE"]

  depends_on = [google_pubsub_topic_iam_member.gcs_publishes_uploads]
}

# The functions' source: the zip built in functions.tf, one object per version of the code.
resource "google_storage_bucket" "source" {
  name                        = "${var.project}-${var.name_prefix}-source"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = var.labels

  depends_on = [google_project_service.api]
}
