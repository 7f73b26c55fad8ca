# One Cloud Function (gen2) per entry point of functions/, built from this repository's source.
#
# The table below is the whole deployment of each function: what triggers it, what it may publish to, what it
# may touch, its size and its environment. tests/test_infra.py holds it against the code (the entry points in
# functions/, the topics each one consumes and publishes to, the variables it reads, whether it writes the
# bucket, uses Firestore or calls Vertex AI), so a change in either that the other does not follow fails the tests.
#
#   trigger_topics  the topics whose push subscription delivers to it ([] for an HTTP function)
#   publishes       the topics it may publish to (roles/pubsub.publisher on each, nothing else)
#   bucket          "write" (roles/storage.objectUser), "read" (roles/storage.objectViewer) or "" on the profiles bucket
#   firestore       roles/datastore.user    vertex: roles/aiplatform.user
#   memory, cpu, timeout_s, max_instances, concurrency   the instance; override any with var.function_overrides
#   env             its own variables, on top of local.common_env
#
# Sizes: a stage that reads a session (collect, run_tool, investigate) takes one delivery at a time; the bench
# (bench/README.md) measured 2.2 GiB peak for a 2 GiB profile (4.9 GiB before narrower columns), and a function's
# /tmp (the download cache, XDIAG_CACHE_GIB) is memory too, so those get 8 GiB. So does register: its deliveries mostly wait out the quiet
# period, many at once, and one of them at a time per instance reads the session meanwhile and stores it
# prepared (collect and the tools then only map it). The others are small and take many deliveries at once.
#
# Many-host sessions (XDIAG_MAP_HOSTS_FROM host files or more) are never decoded in one instance: map_host decodes one
# host file per delivery (limit XDIAG_MAX_HOST_FILE_GIB = 2 GiB per file; bench/README.md measured a 1.9 GiB TPU host
# at 4.9 GiB peak, its op table the most of it, beside the file and its prepared columns in the /tmp cache: over 8 GiB
# together, so 16 GiB with 4 vCPU, the least Cloud Run pairs with it; a CPU host of 2 GiB peaks at 2.4 GiB) and writes
# its summary beside its columns, up to max_instances at once; the last host's delivery announces the session again
# and collect assembles the session's tables from the summaries (the reduce), which the tool instances read. A session
# of more than XDIAG_MAX_HOSTS (256) host files or a file over the per-file limit is FAILED with the reason at once;
# one whose hosts cannot be summarised (PyTorch traces) and whose files are over XDIAG_MAX_PROFILE_GIB together (what
# the reduce and each tool instance then map) is FAILED with the reason after its maps; never retried. Every delivery
# finishes inside its timeout_s, under the push subscriptions' 600 s ack deadline.

locals {
  functions = {
    register = {
      description    = "Object finalize on the profiles bucket -> the host's file recorded, the session read and stored prepared (with XProf's views of a device session) during the quiet period, then announced on captures."
      entry_point    = "register"
      trigger_topics = ["profile-uploads"]
      publishes      = ["captures", "profile-uploads-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "8Gi"
      cpu            = "2"
      timeout_s      = 540
      max_instances  = 20
      concurrency    = 16
      env            = { XDIAG_CACHE_GIB = "3", XDIAG_CONCURRENCY = "0", THREADS = "16" }
    }
    collect = {
      description    = "CaptureReady on captures -> the analysis recorded, the session read once and stored prepared (with XProf's views of a device session) where register did not, one ToolRun per tool."
      entry_point    = "collect"
      trigger_topics = ["captures"]
      publishes      = ["host-maps", "tool-runs", "reports", "captures-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "8Gi"
      cpu            = "2"
      timeout_s      = 540
      max_instances  = 10
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "3", XDIAG_CONCURRENCY = "1" }
    }
    map_host = {
      description    = "HostMapRun on host-maps -> one host file of a many-host session decoded and stored prepared; the last host announces the session again on captures."
      entry_point    = "map_host"
      trigger_topics = ["host-maps"]
      publishes      = ["captures", "host-maps-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "16Gi"
      cpu            = "4"
      timeout_s      = 540
      max_instances  = 64
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "4", XDIAG_CONCURRENCY = "1" }
    }
    run_tool = {
      description    = "ToolRun on tool-runs -> one tool over the session, its result stored, ToolDone on tool-results."
      entry_point    = "run_tool"
      trigger_topics = ["tool-runs"]
      publishes      = ["tool-results", "tool-runs-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "8Gi"
      cpu            = "2"
      timeout_s      = 540
      max_instances  = 30
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "3", XDIAG_CONCURRENCY = "1" }
    }
    aggregate = {
      description    = "ToolDone on tool-results -> once every tool is in, one InvestigationReady (a create-if-absent claim)."
      entry_point    = "aggregate"
      trigger_topics = ["tool-results"]
      publishes      = ["investigations", "tool-results-dead-letter"]
      bucket         = ""
      firestore      = true
      vertex         = false
      memory         = "512Mi"
      cpu            = "1"
      timeout_s      = 120
      max_instances  = 10
      concurrency    = 16
      env            = { XDIAG_CACHE_GIB = "0.1", XDIAG_CONCURRENCY = "0" }
    }
    investigate = {
      description    = "InvestigationReady on investigations -> the diagnosis (rule engine or Gemini, at most four follow-up tools), ReportReady."
      entry_point    = "investigate"
      trigger_topics = ["investigations"]
      publishes      = ["reports", "investigations-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = true
      memory         = "8Gi"
      cpu            = "2"
      timeout_s      = 540
      max_instances  = 10
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "3", XDIAG_CONCURRENCY = "1" }
    }
    render = {
      description    = "ReportReady on reports -> summary.html and analysis.json beside the profile, the analysis DONE or FAILED."
      entry_point    = "render"
      trigger_topics = ["reports"]
      publishes      = ["reports-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "1Gi"
      cpu            = "1"
      timeout_s      = 300
      max_instances  = 10
      concurrency    = 4
      env            = { XDIAG_CACHE_GIB = "0.25", XDIAG_CONCURRENCY = "0" }
    }
    dead_letter = {
      description = "A message on any <topic>-dead-letter -> recorded with its reason; its analysis finishes without it."
      entry_point = "dead_letter"
      trigger_topics = [
        "profile-uploads-dead-letter", "captures-dead-letter", "host-maps-dead-letter", "tool-runs-dead-letter", "tool-results-dead-letter",
        "investigations-dead-letter", "reports-dead-letter", "alerts-dead-letter", "step-times-dead-letter",
        "sweeps-dead-letter",
      ]
      publishes     = ["captures", "tool-results", "reports"]
      bucket        = "write"
      firestore     = true
      vertex        = false
      memory        = "512Mi"
      cpu           = "1"
      timeout_s     = 300
      max_instances = 5
      concurrency   = 8
      env           = { XDIAG_CACHE_GIB = "0.1", XDIAG_CONCURRENCY = "0" }
    }
    capture = {
      description    = "A message on alerts (incident, monitor verdict, manual or snapshot request) -> a profile captured from the run's registered targets, CaptureReady on captures."
      entry_point    = "capture"
      trigger_topics = ["alerts"]
      publishes      = ["captures", "alerts-dead-letter"]
      bucket         = "write"
      firestore      = true
      vertex         = false
      memory         = "4Gi"
      cpu            = "2"
      timeout_s      = 540
      max_instances  = 10
      concurrency    = 8 # a capture holds its delivery for the capture's duration, mostly waiting on the targets
      env            = { XDIAG_CACHE_GIB = "0.5", XDIAG_CONCURRENCY = "0", THREADS = "8" }
    }
    monitor = {
      description    = "Step times on step-times -> a baseline per run; a bad verdict on alerts when the step time degrades."
      entry_point    = "monitor"
      trigger_topics = ["step-times"]
      publishes      = ["alerts", "step-times-dead-letter"]
      bucket         = ""
      firestore      = true
      vertex         = false
      memory         = "512Mi"
      cpu            = "1"
      timeout_s      = 120
      max_instances  = 1 # one delivery at a time: each run's baseline is one document, read and written back
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "0.1", XDIAG_CONCURRENCY = "1" }
    }
    sweep = {
      description    = "A tick on sweeps (Cloud Scheduler) -> every session with files and no analysis of them announced again, every analysis past its deadline repaired (its lost stage published again) or, after the bounded repairs, FAILED with the reason."
      entry_point    = "sweep"
      trigger_topics = ["sweeps"]
      publishes      = ["profile-uploads", "captures", "tool-runs", "tool-results", "investigations", "reports", "sweeps-dead-letter"]
      bucket         = "read" # lists the session files: an upload whose notification was lost is found there
      firestore      = true
      vertex         = false
      memory         = "512Mi"
      cpu            = "1"
      timeout_s      = 300
      max_instances  = 1 # one sweep at a time (a second would find each repair claimed already)
      concurrency    = 1
      env            = { XDIAG_CACHE_GIB = "0.1", XDIAG_CONCURRENCY = "1" }
    }
    control_plane = {
      description    = "HTTP, behind IAM: the run registry (the ML Diagnostics SDK's machinelearning_run(base_url=...)), targets, sessions, analyses, captures, continuous profiling, step times."
      entry_point    = "control_plane"
      trigger_topics = []
      publishes      = ["alerts", "step-times"]
      bucket         = "read" # the local link endpoint serves report objects (in the cloud, Cloud Storage does)
      firestore      = true
      vertex         = false
      memory         = "1Gi"
      cpu            = "1"
      timeout_s      = 300
      max_instances  = 5
      concurrency    = 16
      env            = { XDIAG_CACHE_GIB = "0.1", XDIAG_CONCURRENCY = "0" }
    }
  }

  # The functions that call the workloads' profiler servers (gRPC): through var.vpc_connector where one is set.
  target_callers = ["capture", "control_plane"]

  # What every function reads (xdiag.cloud.CloudConfig, xdiag.investigators.gemini.config.GeminiConfig). No emulator
  # variable: their absence is what points the clients at the real services.
  common_env = {
    GOOGLE_CLOUD_PROJECT = var.project
    XDIAG_BUCKET         = google_storage_bucket.profiles.name
    XDIAG_QUIET_PERIOD_S = tostring(var.quiet_period_s)

    XDIAG_MULTI_HOST_QUIET_PERIOD_S = tostring(var.multi_host_quiet_period_s)
    XDIAG_STAGE_DEADLINE_S          = tostring(var.stage_deadline_s)
    XDIAG_MAX_REPAIRS               = tostring(var.max_repairs)
    XDIAG_INVESTIGATION_DEADLINE_S  = tostring(var.investigation_deadline_s)
    XDIAG_ALLOW_LOOPBACK_TARGETS    = "0" # a capture never calls this instance's own loopback (the local stack may)

    XDIAG_INVESTIGATOR      = var.investigator
    XDIAG_CACHE_DIR         = "/tmp/xdiag-cache"
    XDIAG_MAX_PROFILE_GIB   = tostring(var.max_profile_gib)
    XDIAG_MAP_HOSTS_FROM    = tostring(var.map_hosts_from)
    XDIAG_MAX_HOST_FILE_GIB = tostring(var.max_host_file_gib)
    XDIAG_MAX_HOSTS         = tostring(var.max_hosts)
    VERTEX_PROJECT          = var.project # Gemini is available to a capture that asks for it; the default is var.investigator
    VERTEX_LOCATION         = var.vertex_location
    VERTEX_MODEL            = var.model
    NUMBA_CACHE_DIR         = "/tmp/numba-cache" # the profile reader's compiled decoder is cached where the instance may write

    XDIAG_CAPTURE_COOLDOWN_S          = tostring(var.capture_cooldown_s)
    XDIAG_CAPTURE_DURATION_MS         = tostring(var.capture_duration_ms)
    XDIAG_CAPTURE_MAX_DURATION_MS     = tostring(var.capture_max_duration_ms)
    XDIAG_CAPTURE_ATTEMPTS            = tostring(var.capture_attempts)
    XDIAG_ALERT_RUN_LABEL             = var.alert_run_label
    XDIAG_MONITOR_MARGIN              = tostring(var.monitor_margin)
    XDIAG_MONITOR_WARMUP_POINTS       = tostring(var.monitor_warmup_points)
    XDIAG_MONITOR_BASELINE_POINTS     = tostring(var.monitor_baseline_points)
    XDIAG_MONITOR_WINDOW_S            = tostring(var.monitor_window_s)
    XDIAG_MONITOR_MIN_WINDOW_POINTS   = tostring(var.monitor_min_window_points)
    XDIAG_MONITOR_CONSECUTIVE_WINDOWS = tostring(var.monitor_consecutive_windows)
    XDIAG_CONTROL_PLANE_AUTH          = "iam" # Cloud Functions IAM checks every caller: no token to keep secret
    # The control plane verifies every caller's ID token for these audiences (xdiag.identity): its
    # deterministic run.app and cloudfunctions.net URLs, and any other its callers' tokens name
    XDIAG_CONTROL_PLANE_AUDIENCE = join(",", concat([
      "https://${var.name_prefix}-control-plane-${data.google_project.this.number}.${var.region}.run.app",
      "https://${var.region}-${var.project}.cloudfunctions.net/${var.name_prefix}-control-plane",
    ], var.control_plane_audiences))
    XDIAG_CONTROL_PLANE_ADMINS = join(",", var.control_plane_admins) # read and share every run, name readers
    XDIAG_VIEWER_URL           = var.viewer_link_base                # where share answers and reports link into the viewer
  }

  bucket_roles = {
    write = "roles/storage.objectUser"
    read  = "roles/storage.objectViewer"
  }

  settings = {
    for name, fn in local.functions : name => merge(
      {
        memory        = fn.memory
        cpu           = fn.cpu
        timeout_s     = tostring(fn.timeout_s)
        max_instances = tostring(fn.max_instances)
        min_instances = "0"
        concurrency   = tostring(fn.concurrency)
      },
      lookup(var.function_overrides, name, {}),
    )
  }

  http_functions = [for name, fn in local.functions : name if length(fn.trigger_topics) == 0]
}

# --- the source: functions/*.py at the root (main.py exports every entry point), the xdiag package beside them --

locals {
  repo = "${path.module}/.."
  package_files = setunion(
    fileset("${local.repo}/shared/xdiag", "**/*.py"),
    fileset("${local.repo}/shared/xdiag", "**/*.j2"),
    fileset("${local.repo}/shared/xdiag", "**/*.md"),
  )
  # Left out: bytecode, and the example JAX programs (xdiag.examples: for the tests and `xdiag demo`; no function
  # imports them)
  package_excluded = "(__pycache__|^examples/)"
  source_files = merge(
    { for f in fileset("${local.repo}/functions", "*.py") : f => "${local.repo}/functions/${f}" },
    { for f in local.package_files : "xdiag/${f}" => "${local.repo}/shared/xdiag/${f}" if length(regexall(local.package_excluded, f)) == 0 },
  )
}

data "archive_file" "source" {
  type        = "zip"
  output_path = "${path.module}/.build/functions-source.zip"

  dynamic "source" {
    for_each = local.source_files
    content {
      filename = source.key
      content  = file(source.value)
    }
  }

  source {
    filename = "requirements.txt"
    content  = file("${path.module}/requirements.txt")
  }
}

resource "google_storage_bucket_object" "source" {
  name   = "functions-${data.archive_file.source.output_md5}.zip"
  bucket = google_storage_bucket.source.name
  source = data.archive_file.source.output_path
}

# --- who builds them ----------------------------------------------------------------------------------------

resource "google_service_account" "build" {
  account_id   = "${var.name_prefix}-build"
  display_name = "xdiag: builds the functions"

  depends_on = [google_project_service.api]
}

resource "google_project_iam_member" "build" {
  for_each = toset(["roles/logging.logWriter", "roles/artifactregistry.writer", "roles/storage.objectViewer"])

  project = var.project
  role    = each.key
  member  = "serviceAccount:${google_service_account.build.email}"
}

# --- each function's identity and what it may do -------------------------------------------------------------

resource "google_service_account" "function" {
  for_each = local.functions

  account_id   = "${var.name_prefix}-${replace(each.key, "_", "-")}"
  display_name = "xdiag function ${each.key}"

  depends_on = [google_project_service.api]
}

resource "google_pubsub_topic_iam_member" "publishes" {
  for_each = merge([
    for name, fn in local.functions : { for topic in fn.publishes : "${name}/${topic}" => { function = name, topic = topic } }
  ]...)

  topic  = local.topic_ids[each.value.topic]
  role   = "roles/pubsub.publisher"
  member = "serviceAccount:${google_service_account.function[each.value.function].email}"
}

resource "google_storage_bucket_iam_member" "profiles" {
  for_each = { for name, fn in local.functions : name => fn.bucket if fn.bucket != "" }

  bucket = google_storage_bucket.profiles.name
  role   = local.bucket_roles[each.value]
  member = "serviceAccount:${google_service_account.function[each.key].email}"
}

resource "google_project_iam_member" "firestore" {
  for_each = { for name, fn in local.functions : name => fn if fn.firestore }

  project = var.project
  role    = "roles/datastore.user"
  member  = "serviceAccount:${google_service_account.function[each.key].email}"
}

resource "google_project_iam_member" "vertex" {
  for_each = { for name, fn in local.functions : name => fn if fn.vertex }

  project = var.project
  role    = "roles/aiplatform.user"
  member  = "serviceAccount:${google_service_account.function[each.key].email}"
}

# --- the functions -------------------------------------------------------------------------------------------

resource "google_cloudfunctions2_function" "function" {
  for_each = local.functions

  name        = "${var.name_prefix}-${replace(each.key, "_", "-")}"
  location    = var.region
  description = each.value.description
  labels      = var.labels

  build_config {
    runtime         = var.python_runtime
    entry_point     = each.value.entry_point
    service_account = google_service_account.build.id

    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  # No event trigger: each function is invoked by its push subscription (pubsub.tf), which carries the retry
  # and dead-letter policies; HTTP functions are invoked by the members of var.control_plane_invokers.
  service_config {
    service_account_email            = google_service_account.function[each.key].email
    available_memory                 = local.settings[each.key].memory
    available_cpu                    = local.settings[each.key].cpu
    timeout_seconds                  = tonumber(local.settings[each.key].timeout_s)
    max_instance_count               = tonumber(local.settings[each.key].max_instances)
    min_instance_count               = tonumber(local.settings[each.key].min_instances)
    max_instance_request_concurrency = tonumber(local.settings[each.key].concurrency)
    environment_variables            = merge(local.common_env, each.value.env)
    ingress_settings                 = "ALLOW_ALL" # Pub/Sub pushes from outside any VPC; every caller still needs IAM
    all_traffic_on_latest_revision   = true
    vpc_connector                    = var.vpc_connector != "" && contains(local.target_callers, each.key) ? var.vpc_connector : null
    vpc_connector_egress_settings    = var.vpc_connector != "" && contains(local.target_callers, each.key) ? "PRIVATE_RANGES_ONLY" : null
  }

  depends_on = [
    google_project_iam_member.build,
    google_project_iam_member.firestore,
    google_storage_bucket_iam_member.profiles,
    google_firestore_database.default,
  ]
}

resource "google_cloud_run_service_iam_member" "http_invokers" {
  for_each = { for pair in setproduct(local.http_functions, var.control_plane_invokers) : "${pair[0]}/${pair[1]}" => pair }

  location = var.region
  service  = google_cloudfunctions2_function.function[each.value[0]].name
  role     = "roles/run.invoker"
  member   = each.value[1]
}
