# The chain's topics, with the names the code publishes to (the TOPIC_* constants of shared/xdiag), each with
# its dead-letter topic (xdiag.cloud.runtime.dead_letter_topic: "<topic>-dead-letter"). Each consumed topic has one
# push subscription to its function, wired as the local stack wires the emulator (xdiag.cloud.stack_pubsub): the topic's
# path in the push endpoint (functions-framework turns such a push into the CloudEvent the code decodes), a
# retry policy with backoff and a dead-letter policy. A message on a dead-letter topic goes to the dead_letter
# function, which records it; one that even it cannot record ends on dead-letters-unrecorded, kept 7 days for a
# person (`gcloud pubsub subscriptions pull dead-letters-unrecorded-pull`).

locals {
  pipeline_topics = [
    "profile-uploads", "captures", "host-maps", "tool-runs", "tool-results", "investigations", "reports", # the analysis chain
    "alerts", "step-times",                                                                               # capture and monitor
    "sweeps",                                                                                             # the sweeper's tick (scheduler.tf)
  ]
  uploads_topic      = "profile-uploads" # where the bucket's OBJECT_FINALIZE notifications go (register)
  dead_letter_suffix = "-dead-letter"
  unrecorded_topic   = "dead-letters-unrecorded"

  topic_ids = merge(
    { for name, topic in google_pubsub_topic.pipeline : name => topic.id },
    { for name in local.pipeline_topics : "${name}${local.dead_letter_suffix}" => google_pubsub_topic.dead_letter[name].id },
  )

  # topic -> where its undeliverable messages go: a pipeline topic's to its dead-letter topic, a dead-letter
  # topic's (a letter even the dead_letter function could not record) to the parking topic
  dead_letter_of = merge(
    { for name in local.pipeline_topics : name => google_pubsub_topic.dead_letter[name].id },
    { for name in local.pipeline_topics : "${name}${local.dead_letter_suffix}" => google_pubsub_topic.unrecorded.id },
  )

  # topic -> the function its push subscription delivers to (local.functions[*].trigger_topics)
  push_subscriptions = merge([
    for name, fn in local.functions : { for topic in fn.trigger_topics : topic => name }
  ]...)

  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

resource "google_pubsub_topic" "pipeline" {
  for_each = toset(local.pipeline_topics)

  name   = each.key
  labels = var.labels

  depends_on = [google_project_service.api]
}

resource "google_pubsub_topic" "dead_letter" {
  for_each = toset(local.pipeline_topics)

  name                       = "${each.key}${local.dead_letter_suffix}"
  labels                     = var.labels
  message_retention_duration = "604800s" # 7 days: a dead letter can be replayed (seek) after the cause is fixed

  depends_on = [google_project_service.api]
}

resource "google_pubsub_topic" "unrecorded" {
  name                       = local.unrecorded_topic
  labels                     = var.labels
  message_retention_duration = "604800s"

  depends_on = [google_project_service.api]
}

resource "google_pubsub_subscription" "unrecorded" {
  name                       = "${local.unrecorded_topic}-pull"
  topic                      = google_pubsub_topic.unrecorded.id
  message_retention_duration = "604800s"
  labels                     = var.labels

  expiration_policy {
    ttl = ""
  }
}

# The identity Pub/Sub pushes as: allowed to invoke the functions it delivers to, and nothing else.
resource "google_service_account" "push" {
  account_id   = "${var.name_prefix}-push"
  display_name = "xdiag: Pub/Sub push to the functions"

  depends_on = [google_project_service.api]
}

resource "google_pubsub_subscription" "push" {
  for_each = local.push_subscriptions

  name                       = "${each.key}-push"
  topic                      = local.topic_ids[each.key]
  ack_deadline_seconds       = 600 # a delivery may take as long as its stage does
  message_retention_duration = "604800s"
  labels                     = var.labels

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.function[each.value].service_config[0].uri}/projects/${var.project}/topics/${each.key}"

    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = google_cloudfunctions2_function.function[each.value].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = var.retry_minimum_backoff
    maximum_backoff = var.retry_maximum_backoff
  }

  dead_letter_policy {
    dead_letter_topic     = local.dead_letter_of[each.key]
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [
    google_cloud_run_service_iam_member.push_invokes,
    google_pubsub_topic_iam_member.agent_dead_letters,
  ]
}

resource "google_cloud_run_service_iam_member" "push_invokes" {
  for_each = toset(values(local.push_subscriptions))

  location = var.region
  service  = google_cloudfunctions2_function.function[each.key].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.push.email}"
}

# The Pub/Sub service agent moves dead letters: it publishes to the dead-letter topics and acknowledges on the
# subscriptions they come from; it mints the push identity's OIDC tokens.
resource "google_pubsub_topic_iam_member" "agent_dead_letters" {
  for_each = merge(
    { for name in local.pipeline_topics : "${name}${local.dead_letter_suffix}" => google_pubsub_topic.dead_letter[name].id },
    { (local.unrecorded_topic) = google_pubsub_topic.unrecorded.id },
  )

  topic  = each.value
  role   = "roles/pubsub.publisher"
  member = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "agent_acknowledges" {
  for_each = google_pubsub_subscription.push

  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}

resource "google_service_account_iam_member" "agent_mints_push_tokens" {
  service_account_id = google_service_account.push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}
