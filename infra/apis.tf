# The APIs a deployment uses. Left enabled on destroy: other things in the project may use them too.
locals {
  apis = [
    "aiplatform.googleapis.com",       # Vertex AI (Gemini, for investigate)
    "artifactregistry.googleapis.com", # the functions' container images
    "cloudbuild.googleapis.com",       # builds the functions from the source zip
    "cloudfunctions.googleapis.com",   # Cloud Functions gen2
    "cloudscheduler.googleapis.com",   # the sweeper's tick
    "eventarc.googleapis.com",         # required by Cloud Functions gen2
    "firestore.googleapis.com",        # state
    "iam.googleapis.com",              # the functions' service accounts
    "monitoring.googleapis.com",       # the alert → Pub/Sub notification channel
    "pubsub.googleapis.com",           # the chain
    "run.googleapis.com",              # gen2 functions run on Cloud Run
    "storage.googleapis.com",          # profiles, reports, the source zip
  ]
}

resource "google_project_service" "api" {
  for_each = toset(local.apis)

  project                    = var.project
  service                    = each.key
  disable_on_destroy         = false
  disable_dependent_services = false
}
