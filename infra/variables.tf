# --- where ---------------------------------------------------------------------------------------------------

variable "project" {
  description = "The Google Cloud project to deploy into (one xdiag per project: the topic names are fixed by the code)."
  type        = string
}

variable "region" {
  description = "Region of the functions, the bucket (unless bucket_location says otherwise) and Firestore (unless firestore_location does)."
  type        = string
  default     = "us-central1"
}

variable "name_prefix" {
  description = "Prefix of the functions', service accounts' and source bucket's names (lower case, digits, hyphens)."
  type        = string
  default     = "xdiag"
}

variable "labels" {
  description = "Labels put on the buckets, topics and functions."
  type        = map(string)
  default     = { app = "xdiag" }
}

# --- the profiles bucket -------------------------------------------------------------------------------------

variable "bucket_name" {
  description = "The profiles bucket (gs://BUCKET/<run>/plugins/profile/<session>/<host>.xplane.pb); default <project>-xdiag-profiles."
  type        = string
  default     = ""
}

variable "bucket_location" {
  description = "Location of the profiles bucket; default the region."
  type        = string
  default     = ""
}

variable "profile_retention_days" {
  description = "Bucket retention policy: objects cannot be deleted or replaced for this many days (0: none). Analyses write only under …/xdiag/, but a retention policy covers every object, so keep it 0 unless re-analysing within the period is not needed."
  type        = number
  default     = 0
}

variable "profile_delete_after_days" {
  description = "Lifecycle rule: delete objects (profiles and analyses) this many days after they were written (0: keep them)."
  type        = number
  default     = 0
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete the profiles bucket with the profiles in it."
  type        = bool
  default     = false
}

# --- Firestore -----------------------------------------------------------------------------------------------

variable "firestore_location" {
  description = "Location of the (default) Firestore database (a region or a multi-region like nam5); default the region."
  type        = string
  default     = ""
}

variable "firestore_delete_on_destroy" {
  description = "Delete the (default) Firestore database on `terraform destroy` (otherwise it is abandoned: left in the project)."
  type        = bool
  default     = false
}

# --- the pipeline --------------------------------------------------------------------------------------------

variable "quiet_period_s" {
  description = "register: a multi-host session is complete once no file of it arrived for this long (XDIAG_QUIET_PERIOD_S)."
  type        = number
  default     = 30
}

variable "multi_host_quiet_period_s" {
  description = "register: the quiet period while fewer files of a session are in than its run has hosts (XDIAG_MULTI_HOST_QUIET_PERIOD_S)."
  type        = number
  default     = 120
}

variable "stage_deadline_s" {
  description = "sweep: an analysis without progress for this long has its lost stage published again (XDIAG_STAGE_DEADLINE_S); above the longest function timeout."
  type        = number
  default     = 900
}

variable "max_repairs" {
  description = "sweep: repairs of one analysis before it is FAILED with the reason (XDIAG_MAX_REPAIRS)."
  type        = number
  default     = 3
}

variable "investigation_deadline_s" {
  description = "investigate: the whole investigation, follow-up tool calls included (XDIAG_INVESTIGATION_DEADLINE_S)."
  type        = number
  default     = 300
}

variable "sweep_schedule" {
  description = "How often Cloud Scheduler ticks the sweeper (cron, in var.region's Cloud Scheduler)."
  type        = string
  default     = "* * * * *"
}

variable "max_profile_gib" {
  description = "Sessions read whole, and many-host sessions whose hosts cannot be summarised (PyTorch traces), larger than this fail with the reason (XDIAG_MAX_PROFILE_GIB); the XProf views of a summarised TPU/GPU session cover the hosts that fit under it, named. Raise the memory of collect and run_tool with it (function_overrides)."
  type        = number
  default     = 2
}

variable "map_hosts_from" {
  description = "Sessions of this many host files or more are decoded one file per map_host invocation, in parallel, and assembled by collect (XDIAG_MAP_HOSTS_FROM); 0: collect reads every session whole."
  type        = number
  default     = 2
}

variable "max_host_file_gib" {
  description = "The largest host file one map_host invocation decodes (XDIAG_MAX_HOST_FILE_GIB); a session with a larger one fails with the reason. Raise map_host's memory with it (function_overrides)."
  type        = number
  default     = 2
}

variable "max_hosts" {
  description = "Host files one session may have (XDIAG_MAX_HOSTS); a session with more fails with the reason."
  type        = number
  default     = 256
}

variable "investigator" {
  description = "The investigator for sessions the pipeline announces itself: rules (no model) or gemini (XDIAG_INVESTIGATOR)."
  type        = string
  default     = "rules"

  validation {
    condition     = contains(["rules", "gemini"], var.investigator)
    error_message = "investigator is rules or gemini."
  }
}

variable "model" {
  description = "The Gemini model on Vertex AI (VERTEX_MODEL)."
  type        = string
  default     = "gemini-2.5-flash"
}

variable "vertex_location" {
  description = "Where Vertex AI runs the model (VERTEX_LOCATION): the summaries of the tools' results are sent there."
  type        = string
  default     = "us-central1"
}

variable "max_delivery_attempts" {
  description = "Deliveries of a message before Pub/Sub moves it to its topic's dead-letter topic (5 to 100)."
  type        = number
  default     = 5
}

variable "retry_minimum_backoff" {
  description = "Pub/Sub's first wait before redelivering a message a function failed."
  type        = string
  default     = "10s"
}

variable "retry_maximum_backoff" {
  description = "Pub/Sub's longest wait between redeliveries."
  type        = string
  default     = "600s"
}

# --- capture, monitor, control plane ------------------------------------------------------------------------

variable "capture_cooldown_s" {
  description = "capture: one automatic capture (incident or monitor verdict) per run inside this window, however many alerts arrive (XDIAG_CAPTURE_COOLDOWN_S)."
  type        = number
  default     = 600
}

variable "capture_duration_ms" {
  description = "capture: how long an alert's capture traces, and a request's default (XDIAG_CAPTURE_DURATION_MS)."
  type        = number
  default     = 2000
}

variable "capture_max_duration_ms" {
  description = "capture: the longest capture a request may ask for (XDIAG_CAPTURE_MAX_DURATION_MS; the profiler's own deadline is 60 s)."
  type        = number
  default     = 60000
}

variable "capture_attempts" {
  description = "capture: tracing attempts per target before its session is FAILED (XDIAG_CAPTURE_ATTEMPTS)."
  type        = number
  default     = 3
}

variable "alert_run_label" {
  description = "The incident label that names the run to capture (XDIAG_ALERT_RUN_LABEL): a metric, resource or policy user label."
  type        = string
  default     = "run_id"
}

variable "monitor_margin" {
  description = "monitor: a run is bad when its window's median step time is this much above its baseline (XDIAG_MONITOR_MARGIN)."
  type        = number
  default     = 0.15
}

variable "monitor_warmup_points" {
  description = "monitor: first step times left out of the baseline (XDIAG_MONITOR_WARMUP_POINTS)."
  type        = number
  default     = 5
}

variable "monitor_baseline_points" {
  description = "monitor: step times whose median is the baseline (XDIAG_MONITOR_BASELINE_POINTS)."
  type        = number
  default     = 20
}

variable "monitor_window_s" {
  description = "monitor: seconds of step times whose median is judged as one window (XDIAG_MONITOR_WINDOW_S)."
  type        = number
  default     = 10
}

variable "monitor_min_window_points" {
  description = "monitor: fewest step times a window needs to be judged (XDIAG_MONITOR_MIN_WINDOW_POINTS)."
  type        = number
  default     = 5
}

variable "monitor_consecutive_windows" {
  description = "monitor: windows in a row above the margin before the verdict is bad (XDIAG_MONITOR_CONSECUTIVE_WINDOWS); with the defaults a slowdown must last 30 s."
  type        = number
  default     = 3
}

variable "vpc_connector" {
  description = "A Serverless VPC Access connector (projects/P/locations/R/connectors/NAME) for the functions that call profiler servers (capture, control_plane), where the workloads' hosts have only private addresses. Empty: they reach the targets over the internet."
  type        = string
  default     = ""
}

# --- the functions -------------------------------------------------------------------------------------------

variable "python_runtime" {
  description = "The Cloud Functions runtime."
  type        = string
  default     = "python311"
}

variable "function_overrides" {
  description = "Per function (the keys of local.functions), any of: memory (\"16Gi\"), cpu (\"4\"), max_instances, min_instances, timeout_s, concurrency. E.g. { run_tool = { memory = \"16Gi\", cpu = \"4\" } } for sessions over 2 GiB."
  type        = map(map(string))
  default     = {}
}

# --- the control plane ---------------------------------------------------------------------------------------

variable "control_plane_admins" {
  description = "Who may read and share every run and name any run's readers (IAM principals, e.g. user:admin@example.com). Everyone else reads only the runs they created or were named readers of."
  type        = list(string)
  default     = []
}

variable "control_plane_audiences" {
  description = "More audiences an ID token for the control plane may name, beyond its run.app and cloudfunctions.net URLs (e.g. the URL `terraform output control_plane_url` prints, where `gcloud run services proxy` mints tokens for it)."
  type        = list(string)
  default     = []
}

variable "control_plane_invokers" {
  description = "Who may call the control plane (and so the ML Diagnostics SDK's machinelearning_run(base_url=…)): IAM members such as user:alice@example.com, group:ml@example.com, serviceAccount:trainer@P.iam.gserviceaccount.com. Nobody is unauthenticated."
  type        = list(string)
  default     = []
}

# --- alerts --------------------------------------------------------------------------------------------------

variable "example_alert_policy" {
  description = "Create the example Cloud Monitoring alert policy (a run's metric degrading) that notifies the alerts topic, so the capture function profiles the run."
  type        = bool
  default     = false
}

variable "alert_metric_filter" {
  description = "Monitoring filter of the example policy's metric. The default is the TPU duty cycle; any metric with a run_id label (metric, resource or policy user label) names the run to capture."
  type        = string
  default     = "resource.type = \"tpu_worker\" AND metric.type = \"tpu.googleapis.com/accelerator/duty_cycle\""
}

variable "alert_comparison" {
  description = "COMPARISON_LT (duty cycle dropped below the threshold) or COMPARISON_GT (a step time rose above it)."
  type        = string
  default     = "COMPARISON_LT"
}

variable "alert_threshold" {
  description = "The example policy's threshold (duty cycle in percent for the default metric)."
  type        = number
  default     = 50
}

variable "alert_duration" {
  description = "How long the condition must hold before the incident opens."
  type        = string
  default     = "600s"
}

variable "alert_run_id" {
  description = "The run the example policy names (its run_id user label), for metrics that carry no run_id label themselves."
  type        = string
  default     = ""
}

# --- the viewer (infra/viewer.tf) --------------------------------------------------------------------------------

variable "viewer_image" {
  description = "The XProf image built from infra/viewer/Dockerfile (gcloud builds submit infra/viewer --tag …). Empty: no viewer is deployed."
  type        = string
  default     = ""
}

variable "viewer_members" {
  description = "Who may open the viewer (roles/run.invoker): IAM members such as user:alice@example.com, group:ml@example.com. Nobody is unauthenticated."
  type        = list(string)
  default     = []
}

variable "viewer_audiences" {
  description = "More audiences a viewer caller's ID token may name, beyond its run.app URL (e.g. `terraform output viewer_url` where it differs)."
  type        = list(string)
  default     = []
}

variable "viewer_workers" {
  description = "XProf worker sidecars per viewer instance (each converts one host's file at a time)."
  type        = number
  default     = 2
}

variable "viewer_max_instances" {
  description = "The most viewer instances (each with its workers) Cloud Run starts under load; 0 when idle."
  type        = number
  default     = 5
}

variable "viewer_concurrency" {
  description = "Requests one viewer instance takes at once before Cloud Run starts another."
  type        = number
  default     = 8
}

variable "viewer_cpu" {
  description = "CPU of the viewer's frontend container."
  type        = string
  default     = "2"
}

variable "viewer_memory" {
  description = "Memory of the viewer's frontend container (XProf holds a converted session in memory)."
  type        = string
  default     = "8Gi"
}

variable "viewer_worker_cpu" {
  description = "CPU of each XProf worker sidecar."
  type        = string
  default     = "2"
}

variable "viewer_worker_memory" {
  description = "Memory of each XProf worker sidecar."
  type        = string
  default     = "8Gi"
}

variable "viewer_link_base" {
  description = "Where share links' and reports' viewer links point: the viewer as its users open it (`gcloud run services proxy <viewer_service> --port 8791` serves it at http://localhost:8791; put your IAP or domain URL here if you front it so)."
  type        = string
  default     = "http://localhost:8791"
}
