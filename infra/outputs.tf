output "bucket" {
  description = "The profiles bucket: write profiles to gs://BUCKET/<run>/plugins/profile/<session>/<host>.xplane.pb."
  value       = google_storage_bucket.profiles.name
}

output "client_env" {
  description = "The environment that points xdiag's own commands (xdiag upload, status, publish-capture) at this deployment."
  value = {
    GOOGLE_CLOUD_PROJECT = var.project
    XDIAG_BUCKET         = google_storage_bucket.profiles.name
  }
}

output "function_urls" {
  description = "Each function's URL (invoked with an identity token only)."
  value       = { for name, fn in google_cloudfunctions2_function.function : name => fn.service_config[0].uri }
}

output "function_service_accounts" {
  description = "Each function's service account."
  value       = { for name, sa in google_service_account.function : name => sa.email }
}

output "topics" {
  description = "The chain's topics and their dead-letter topics."
  value       = { for name in local.pipeline_topics : name => "${name}${local.dead_letter_suffix}" }
}

output "push_subscriptions" {
  description = "topic -> the function its push subscription delivers to."
  value       = local.push_subscriptions
}

output "control_plane_url" {
  description = "The control plane (IAM: callers need roles/run.invoker, see var.control_plane_invokers). Reach it through `gcloud run services proxy` and pass http://localhost:PORT to machinelearning_run(base_url=…) and xdiag.sdk.workload.attach(control_plane=…)."
  value       = google_cloudfunctions2_function.function["control_plane"].service_config[0].uri
}

output "control_plane_service" {
  description = "The control plane's Cloud Run service, for `gcloud run services proxy SERVICE --region REGION --port 8080`."
  value       = google_cloudfunctions2_function.function["control_plane"].name
}

output "alerts_notification_channel" {
  description = "The Cloud Monitoring notification channel that sends incidents to the alerts topic: add it to any alert policy whose incidents should capture a profile."
  value       = google_monitoring_notification_channel.alerts.id
}

output "viewer_service" {
  description = "The viewer's Cloud Run service (XProf over the bucket): `gcloud run services proxy SERVICE --region REGION --port 8791`, then http://localhost:8791."
  value       = one(google_cloud_run_v2_service.viewer[*].name)
}

output "viewer_url" {
  description = "The viewer's URL (callers need roles/run.invoker: var.viewer_members)."
  value       = one(google_cloud_run_v2_service.viewer[*].uri)
}
