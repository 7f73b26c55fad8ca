# Cloud Monitoring → alerts → capture. A notification channel of type pubsub publishes every incident of the
# policies that use it (incident JSON) on the alerts topic; the capture function profiles the run the incident
# names (its var.alert_run_label label: on the metric, the resource, or the policy's user labels), at most once
# per run per cool-down. The example policy (var.example_alert_policy) is one such policy: a run's metric
# degrading, by default a TPU's duty cycle dropping below var.alert_threshold percent for var.alert_duration.

resource "google_monitoring_notification_channel" "alerts" {
  display_name = "xdiag: profile the run (Pub/Sub ${google_pubsub_topic.pipeline["alerts"].name})"
  type         = "pubsub"
  labels = {
    topic = google_pubsub_topic.pipeline["alerts"].id
  }

  depends_on = [google_pubsub_topic_iam_member.monitoring_publishes_alerts]
}

# Cloud Monitoring's notification service agent publishes the incidents.
resource "google_pubsub_topic_iam_member" "monitoring_publishes_alerts" {
  topic  = google_pubsub_topic.pipeline["alerts"].id
  role   = "roles/pubsub.publisher"
  member = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-monitoring-notification.iam.gserviceaccount.com"
}

resource "google_monitoring_alert_policy" "example" {
  count = var.example_alert_policy ? 1 : 0

  display_name = "xdiag example: a run's metric degraded, capture a profile"
  combiner     = "OR"

  conditions {
    display_name = "metric ${var.alert_comparison == "COMPARISON_LT" ? "below" : "above"} ${var.alert_threshold}"

    condition_threshold {
      filter          = var.alert_metric_filter
      comparison      = var.alert_comparison
      threshold_value = var.alert_threshold
      duration        = var.alert_duration

      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MEAN"
      }

      trigger {
        count = 1
      }
    }
  }

  notification_channels = [google_monitoring_notification_channel.alerts.id]
  user_labels           = var.alert_run_id != "" ? { (var.alert_run_label) = var.alert_run_id } : {}

  documentation {
    mime_type = "text/markdown"
    content   = "xdiag captures a profile of the run this incident names (label `${var.alert_run_label}`) and analyses it; the report is in gs://${google_storage_bucket.profiles.name}/<run>/plugins/profile/<session>/xdiag/summary.html."
  }

  alert_strategy {
    auto_close = "1800s"
  }

  depends_on = [google_project_service.api]
}
