# The sweeper's tick: Cloud Scheduler publishes `{}` on the sweeps topic (var.sweep_schedule, every minute by
# default); the sweep function repairs every analysis past its deadline (var.stage_deadline_s without progress) by
# publishing its lost stage again, and fails it with the reason after var.max_repairs repairs. Cloud Scheduler's
# service agent publishes with the role Google grants it (roles/cloudscheduler.serviceAgent).

resource "google_cloud_scheduler_job" "sweep" {
  name        = "${var.name_prefix}-sweep"
  description = "xdiag: tick the sweeper (stuck analyses are repaired or failed with the reason)"
  region      = var.region
  schedule    = var.sweep_schedule
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.pipeline["sweeps"].id
    data       = base64encode("{}")
  }

  retry_config {
    retry_count = 0 # a missed tick is the next minute's
  }

  depends_on = [google_project_service.api]
}
