# The viewer: XProf's own server (the pinned `xprof` wheel, image built from infra/viewer/Dockerfile) on Cloud Run
# over gs://<profiles bucket>, so every session of every run opens in XProf's trace viewer, op profile, memory
# viewer and roofline, the same names as `xdiag view` shows locally.
#
# Distributed processing is XProf's own: the frontend sends each host's conversion to its workers round-robin
# (`--worker_service_address`, a comma-separated list: one gRPC stub per address), and each worker is the same
# server listening on `--grpc_port`. XProf's stubs are plaintext gRPC (plugin/xprof/worker/stub_factory.cc:
# InsecureChannelCredentials), and a Cloud Run service is reachable only over TLS at its URL, so the workers cannot
# be a service of their own: they run as sidecar containers of each frontend instance, on 127.0.0.1. The pool
# therefore scales with load the way Cloud Run scales instances (0 when idle, up to viewer_max_instances, each with
# var.viewer_workers workers), and several users' requests spread over instances and their workers.
#
# Access: Cloud Run IAM (roles/run.invoker for var.viewer_members only; nobody else, nothing public), and within it
# each session only to the readers of its run (its owners, the readers they named, var.control_plane_admins), read
# from Firestore as the control plane wrote them, the caller named by the ID token Cloud Run checked
# (xdiag.viewer.access). Open it with
# `gcloud run services proxy <viewer_service> --region <region> --port 8791`, then http://localhost:8791 (the port
# the reports' viewer links use). The capture button is hidden: captures go through the control plane.
# The viewer reads the bucket and may create objects in it (XProf keeps its caches beside each session); it can
# neither overwrite nor delete an object, so profiles and reports stay as written.
#
# Every container runs `python -m xdiag.viewer.server` (infra/viewer/Dockerfile): XProf's main behind xdiag's guard
# (only sessions XProf lists in the bucket, no path from a request, no capture) with its gRPC worker confined to the
# loopback interface (SO_BINDTODEVICE, which the second-generation execution environment's Linux kernel allows).

locals {
  viewer_enabled      = var.viewer_image != ""
  viewer_port         = 8080
  viewer_grpc_port    = 50051                                            # the frontend's own worker service
  viewer_worker_ports = [for i in range(var.viewer_workers) : 50061 + i] # one per worker sidecar
  viewer_logdir       = "gs://${google_storage_bucket.profiles.name}"
}

resource "google_service_account" "viewer" {
  count        = local.viewer_enabled ? 1 : 0
  project      = var.project
  account_id   = "${var.name_prefix}-viewer"
  display_name = "xdiag viewer: XProf over the profiles bucket"
}

resource "google_storage_bucket_iam_member" "viewer" {
  for_each = local.viewer_enabled ? toset(["roles/storage.objectViewer", "roles/storage.objectCreator"]) : toset([])
  bucket   = google_storage_bucket.profiles.name
  role     = each.value
  member   = "serviceAccount:${google_service_account.viewer[0].email}"
}

resource "google_project_iam_member" "viewer_reads_runs" {
  count   = local.viewer_enabled ? 1 : 0
  project = var.project
  role    = "roles/datastore.viewer" # the runs' owners and readers; it writes nothing there
  member  = "serviceAccount:${google_service_account.viewer[0].email}"
}

resource "google_cloud_run_v2_service" "viewer" {
  count               = local.viewer_enabled ? 1 : 0
  project             = var.project
  name                = "${var.name_prefix}-viewer"
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL" # reachable, but only by callers IAM lets in (below)
  deletion_protection = false
  labels              = var.labels

  template {
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2" # a Linux kernel: the workers' loopback-only binding
    service_account                  = google_service_account.viewer[0].email
    timeout                          = "900s" # a large profile's first conversion takes minutes
    max_instance_request_concurrency = var.viewer_concurrency

    scaling {
      min_instance_count = 0 # idle, it costs nothing
      max_instance_count = var.viewer_max_instances
    }

    containers {
      name  = "xprof"
      image = var.viewer_image
      args = [
        "--logdir=${local.viewer_logdir}",
        "--port=${local.viewer_port}",
        "--grpc_port=${local.viewer_grpc_port}",
        "--worker_service_address=${join(",", [for port in local.viewer_worker_ports : "127.0.0.1:${port}"])}",
        "--max_concurrent_worker_requests=${var.viewer_workers}",
        "--hide_capture_profile_button",
      ]
      env {
        name  = "XDIAG_VIEWER_AUTH"
        value = "iam"
      }
      env {
        name = "XDIAG_VIEWER_AUDIENCE" # what the callers' ID tokens name: its run.app URL, and any other given
        value = join(",", concat([
          "https://${var.name_prefix}-viewer-${data.google_project.this.number}.${var.region}.run.app",
        ], var.viewer_audiences))
      }
      env {
        name  = "XDIAG_VIEWER_ADMINS"
        value = join(",", var.control_plane_admins)
      }
      env {
        name  = "GOOGLE_CLOUD_PROJECT"
        value = var.project
      }
      ports {
        container_port = local.viewer_port
      }
      resources {
        limits = {
          cpu    = var.viewer_cpu
          memory = var.viewer_memory
        }
      }
      startup_probe {
        tcp_socket {
          port = local.viewer_port
        }
      }
      depends_on = [for i, _ in local.viewer_worker_ports : "xprof-worker-${i}"]
    }

    dynamic "containers" {
      for_each = local.viewer_worker_ports
      content {
        name  = "xprof-worker-${containers.key}"
        image = var.viewer_image
        args = [
          "--logdir=${local.viewer_logdir}",
          "--port=${9000 + containers.key}", # its web server, unused
          "--grpc_port=${containers.value}",
          "--hide_capture_profile_button",
        ]
        resources {
          limits = {
            cpu    = var.viewer_worker_cpu
            memory = var.viewer_worker_memory
          }
        }
        startup_probe {
          tcp_socket {
            port = containers.value
          }
        }
      }
    }
  }

  depends_on = [google_project_service.api, google_storage_bucket_iam_member.viewer, google_project_iam_member.viewer_reads_runs]
}

resource "google_cloud_run_v2_service_iam_member" "viewer_members" {
  for_each = local.viewer_enabled ? toset(var.viewer_members) : toset([])
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_service.viewer[0].name
  role     = "roles/run.invoker"
  member   = each.value
}

# Share links: the control plane signs V4 URLs for report objects through IAM (signBlob) as its own service account.
resource "google_service_account_iam_member" "control_plane_signs_links" {
  service_account_id = google_service_account.function["control_plane"].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${google_service_account.function["control_plane"].email}"
}
