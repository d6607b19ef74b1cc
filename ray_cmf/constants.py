"""Environment variables, on-disk names and MLMD type names, in one place."""

from __future__ import annotations

ENV_STORE = "RAY_CMF_STORE"
DEFAULT_STORE = "cmf_store"

MLMD_FILE = "mlmd.sqlite"
STORE_CONFIG = "ray_cmf.json"  # where the store's MLMD is, when it is not MLMD_FILE in the store
ARTIFACTS_DIR = "artifacts"
SPILL_DIR = "spill"
ENVIRONMENTS_DIR = "environments"  # package lists, one file per distinct environment
SPILL_MANIFEST = "manifest.json"
SPILL_LOCK = ".writer.lock"  # held (flock) by the process that writes a spill, dropped with it
STORE_LOCK = ".gc.lock"  # held shared (flock) by each commit that tracks a file, exclusively by gc as it frees files
PENDING_ENDS_DIR = ".ends"  # how executions were to end when the lineage did not answer (see Store.note_end)
SEGMENT_GLOB = "seg-*.arrows"

SEQUENCE_COLUMN = "SequenceNumber"
ATTEMPT_COLUMN = "attempt"  # which start of a restored trial or restarted run logged a row
ATTEMPT_PROPERTY = "attempt"  # an execution's starts so far, as the store counts them
REPORT_STARTS_PROPERTY = "report_starts"  # a Train run's CmfTrainCallback starts: its report series' attempts
WORKER_STARTS_PROPERTY = "worker_starts"  # a Train run's worker-group starts, over every fit of it: their series
SUMMARY_KEY = "ray_cmf.summary"  # Parquet footer key: per-column min/max/last and the row count

PIPELINE_CONTEXT_TYPE = "Parent_Context"
STAGE_CONTEXT_TYPE = "Child_Context"
STEP_METRICS_TYPE = "Step_Metrics"
EXECUTION_METRICS_TYPE = "Metrics"
DATASET_TYPE = "Dataset"
TRIAL_EXECUTION_TYPE = "Ray_Tune_Trial"
RUN_EXECUTION_TYPE = "Ray_Train_Run"
TRIAL_PROPERTY = "tune_trial_id"  # a Train run's property: the Tune trial that runs it
MODEL_TYPE = "Model"
ENVIRONMENT_TYPE = "Environment"
SYSTEM_METRICS_NAME = "system_metrics"
RESULTS_METRICS_NAME = "tune_results"  # CmfRayLogger's series of each trial's Tune results
STEPS_METRICS_NAME = "train_steps"  # StepLogger's series of a Train run's steps
THROUGHPUT = "samples_per_s"  # a column of StepLogger's own: best highest, a speed and no result to rank by
REPORTS_METRICS_NAME = "train_reports"  # CmfTrainCallback's series of what a Train run's ranks report
# Its bookkeeping columns: which report of the run (a row's step where the loop reported none), which start
# of the workers, and whether the report carried a checkpoint
REPORT_COLUMN, WORKER_GROUP_COLUMN, CHECKPOINTED_COLUMN = "report", "worker_group", "checkpointed"
DEFAULT_SYSTEM_METRICS_SECONDS = 10.0
RANKED_BY_PROPERTY = "ranked_by"  # on each trial: the metric its sweep's CmfRayLogger ranks the trials by
RANKED_MODE_PROPERTY = "ranked_mode"  # and whether lower (min) or higher (max) of it is better
RESTARTED_FROM_PROPERTY = "restarted_from"  # on a trial that Tune's restart_errored made: the trial it replaced
REPLACED = "REPLACED"  # the status of a trial that restart_errored replaced (read from its replacement)
FLUSH_TIMEOUT_S = 10.0  # how long Cmf.flush (at a Tune checkpoint, say) waits for the store to hold the rows
ERROR_PROPERTY = "error"  # a FAILED trial's or run's error, as its last failure raised it; gone once it completes
HAND_OVER_WAIT_S = 10.0  # how long a trial's or run's end waits for its processes' samples to reach the writer

DEFAULT_FLUSH_ROWS = 10_000
DEFAULT_FLUSH_SECONDS = 30.0
STEP_FLUSH_SECONDS = 1.0  # StepLogger batches its rows for at most this long while the loop makes progress

# What users curate on an execution after the fact, under a prefix no config key can take (config_properties
# keeps such keys in config_json only).
RESERVED_PREFIX = "ray_cmf:"
TAG_PREFIX = RESERVED_PREFIX + "tag:"  # one property per tag: ray_cmf:tag:<key>
NOTE_PROPERTY = RESERVED_PREFIX + "note"
ENV_PREFIX = "env_"  # what a run ran on: env_host, env_git_commit, ... (see ray_cmf.environment)
SEED_PREFIX = "seed_"  # the seeds it logged: seed_<name>
HOLDER_HOST, HOLDER_PID = "holder_host", "holder_pid"  # the process that ends the execution, when it runs
RECOVERED = "recovered"  # set on an execution, and its series, whose spilled rows recover() committed
STOPPED_PROPERTY = RESERVED_PREFIX + "stopped"  # on a trial that Tune stopped (a scheduler, a stop criterion)
# Whether lower (min) or higher (max) of a metric is better, as its logger declared it: ray_cmf:mode:<metric>
MODE_PREFIX = RESERVED_PREFIX + "mode:"
DELETED_PROPERTY = RESERVED_PREFIX + "deleted_at"  # when it was deleted (UTC ISO 8601); absent: it is not
# An execution's own name where MLMD records it under "<pipeline>/<stage>/<name>": another stage of the
# database holds one of that name (see Lineage.execution)
NAME_PROPERTY = RESERVED_PREFIX + "name"
# Whose an execution is: "sweep:<id>" for a Tune trial, "trial:<execution id>" for a Train run inside one. A
# stage's execution of the same name but another owner is another's, never reopened (see Lineage.execution)
OWNER_PROPERTY = RESERVED_PREFIX + "owner"
STARTS_PREFIX = RESERVED_PREFIX + "starts:"  # ray_cmf:starts:<series>:<attempt> -> the step it resumed after
VALUES_JSON = RESERVED_PREFIX + "values"  # a Metrics artifact's: what log_execution_metrics logged, as JSON

GLOG_LEVEL_ENV = "GLOG_minloglevel"  # the least level of the log lines ML-Metadata's C++ library prints
CONFIG_JSON = "config_json"  # an execution property: its config as JSON, what Sweep shows as config/<key>
EXACT_FLOAT_INT = 2**53  # float64 holds every integer up to here, and not all beyond
# Execution properties that hold what ray_cmf records of a run, beside its config's keys (and ENV_PREFIX,
# SEED_PREFIX and RESERVED_PREFIX names): a config key of one of these names stays in the config's JSON only
RECORDED_PROPERTIES = frozenset(
    {
        "status",
        "trial_id",
        "in_top_n",
        "top_rank",
        "run_name",  # a Train run's, with its world_size, sync_every and steps
        "world_size",
        "sync_every",
        "steps",
        "Execution",  # cmflib's: the command, the stage and the pipeline of an execution
        "Context_Type",
        "Pipeline_Type",
        CONFIG_JSON,
        ERROR_PROPERTY,
        ATTEMPT_PROPERTY,
        TRIAL_PROPERTY,
        RANKED_BY_PROPERTY,
        RANKED_MODE_PROPERTY,
        RESTARTED_FROM_PROPERTY,
        HOLDER_HOST,
        HOLDER_PID,
        RECOVERED,
    }
)
