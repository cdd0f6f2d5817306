"""A SageMaker-style Estimator over Ringmaster's job client (ringmaster.jobs).

    from ringmaster import Estimator
    estimator = Estimator(entry_point="train.py", source_dir="src", instance_count=2,
                          hyperparameters={"epochs": 3, "lr": 0.01},
                          distribution={"mpi": {"enabled": True, "processes_per_host": 8,
                                                "custom_mpi_options":
                                                    "-x HOROVOD_FUSION_THRESHOLD=33554432 "
                                                    "-x HOROVOD_CYCLE_TIME=5"}},
                          output_path="out")
    estimator.fit({"train": "/data/train"})

fit() ships `source_dir` with the job, starts instance_count * processes_per_host ranks (at most
processes_per_host on one host), streams their output prefixed by rank, waits for the end,
downloads the job's artifacts into `output_path` and raises JobFailedError when the job did not
succeed. docs/python-jobs.md translates a SageMaker script line by line.
"""
import json
import os
import re
import shlex
import shutil
import sys
import threading
import warnings

import ringmaster
from ringmaster.jobs import Client, RingmasterError, set_knobs

from ringmaster.v1 import job_pb2


class JobFailedError(RingmasterError):
    """The job ended FAILED or CANCELLED: `job` is the ended job (its reason says why: which rank
    exited with which status, or who cancelled it), `exit_codes` each rank's exit status (None for
    a rank that did not exit by itself)."""

    def __init__(self, job):
        codes = [r.exit_code if r.state == "EXITED" else None for r in job.ranks]
        failed = [(r, c) for r, c in enumerate(codes) if c]
        status = "".join(f"; rank {r} exit status {c}" for r, c in failed[:4])
        super().__init__(job.state, f"job {job.id} ({job.name}) {job.state}: {job.reason}{status}")
        self.job = job
        self.exit_codes = codes


# The Horovod variables mpirun's "-x" may set that are Ringmaster knobs: each to the Knobs field it
# sets and how its value reads.
def _flag(value):
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"'{value}' is not a boolean (1/0, true/false)")


def _file_name(value):
    # Horovod users write a path; the coordinator keeps the file as an artifact of this name.
    return os.path.basename(value)


def _backend(value):
    v = value.strip().lower()
    if v not in ("gloo", "nccl"):
        raise ValueError(f"'{value}' is not GLOO or NCCL")
    return v


HOROVOD_KNOBS = {
    "HOROVOD_FUSION_THRESHOLD": ("fusion_threshold_bytes", int),
    "HOROVOD_CYCLE_TIME": ("cycle_time_ms", float),
    "HOROVOD_CACHE_CAPACITY": ("cache_capacity", int),
    "HOROVOD_AUTOTUNE": ("autotune", _flag),
    "HOROVOD_AUTOTUNE_LOG": ("autotune_log", _file_name),
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": ("autotune_warmup_samples", int),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": ("autotune_steps_per_sample", int),
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": ("autotune_bayes_opt_max_samples", int),
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": ("autotune_gaussian_process_noise", float),
    "HOROVOD_TIMELINE": ("timeline", _file_name),
    "HOROVOD_TIMELINE_MARK_CYCLES": ("timeline_mark_cycles", _flag),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("stall_check_seconds", float),
    "HOROVOD_STALL_CHECK_DISABLE": ("stall_check_seconds", lambda v: 0.0 if _flag(v) else None),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("stall_shutdown_seconds", float),
    "HOROVOD_CPU_OPERATIONS": ("backend", _backend),
    "HOROVOD_GPU_OPERATIONS": ("backend", _backend),
    "RINGMASTER_SHM_ALLREDUCE": ("shm_allreduce", _flag),
    "RINGMASTER_LOCAL_NEGOTIATION": ("local_negotiation", _flag),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("hierarchical_allreduce", _flag),
    "HOROVOD_HIERARCHICAL_ALLGATHER": ("hierarchical_allgather", _flag),
    "RINGMASTER_NEGOTIATION_RELAY": ("negotiation_relay", _flag),
    "RINGMASTER_NEGOTIATION_RELAY_HOSTS": ("negotiation_relay_hosts", int),
    "RINGMASTER_STRAGGLER_ACTION": ("straggler_action", str),
}

# mpirun options that only change what mpirun prints: nothing to map, so they are ignored (with a
# warning). Any other mpirun option is refused: Ringmaster has no mpirun to pass it to.
_PRINT_ONLY_MPI_OPTIONS = {"-verbose", "--verbose", "-v", "--tag-output", "-tag-output",
                           "--display-map", "-display-map", "--report-bindings"}

# What "--NAME=VALUE" in custom_mpi_options may name: an environment variable.
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

# The native form's keys besides the knobs (ringmaster.v1.Knobs field names).
_NATIVE_KEYS = {"enabled", "processes_per_host"}


def _mpi_options(text, environ):
    """The knobs and environment custom_mpi_options sets: ({knob: value}, {name: value})."""
    knobs, env = {}, {}
    words = shlex.split(text or "")
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in _PRINT_ONLY_MPI_OPTIONS:
            warnings.warn(f"custom_mpi_options: '{word}' only changes what mpirun prints; "
                          f"Ringmaster has no mpirun and ignores it")
            continue
        name, eq, value = word[2:].partition("=")
        if word.startswith("--") and eq and _ENV_NAME.fullmatch(name):
            env[name] = value  # SageMaker's container reads "--NCCL_DEBUG=INFO" as that variable
            continue
        if word != "-x":
            raise ValueError(
                f"custom_mpi_options: '{word}' is an mpirun option Ringmaster has no equivalent "
                f"of; only -x NAME=VALUE, -x NAME and --NAME=VALUE (a variable) are taken")
        if i >= len(words):
            raise ValueError("custom_mpi_options: -x needs NAME=VALUE")
        name, eq, value = words[i].partition("=")
        i += 1
        if not eq:  # "-x NAME": the caller's value, as mpirun exports it
            if name not in environ:
                raise ValueError(f"custom_mpi_options: -x {name} exports the caller's {name}, "
                                 f"which is not set")
            value = environ[name]
        if name.startswith("HOROVOD_") or name in HOROVOD_KNOBS:  # RINGMASTER_ ones too
            if name not in HOROVOD_KNOBS:
                raise ValueError(
                    f"custom_mpi_options: {name} is not a Horovod knob Ringmaster supports; "
                    f"supported: {', '.join(sorted(HOROVOD_KNOBS))}")
            field, parse = HOROVOD_KNOBS[name]
            try:
                parsed = parse(value)
            except ValueError as e:
                raise ValueError(f"custom_mpi_options: {name}={value}: {e}") from None
            if parsed is not None:
                knobs[field] = parsed
        else:
            env[name] = value
    return knobs, env


def parse_distribution(distribution, environ=None):
    """Ringmaster's form {"ringmaster": {"processes_per_host": N, KNOB: VALUE, ...}} (knobs named
    as in ringmaster.v1.Knobs) or SageMaker's {"mpi": {"enabled": True, "processes_per_host": N,
    "custom_mpi_options": "-x HOROVOD_...=..."}}, as (processes_per_host or None, knobs, env).
    ValueError names what is not understood."""
    environ = os.environ if environ is None else environ
    if not distribution:
        return None, {}, {}
    if not isinstance(distribution, dict) or len(distribution) != 1:
        raise ValueError("distribution takes one form: {'ringmaster': {...}} or SageMaker's "
                         "{'mpi': {...}}")
    (kind, options), = distribution.items()
    options = dict(options or {})
    if kind == "mpi":
        unknown = set(options) - {"enabled", "processes_per_host", "custom_mpi_options"}
        if unknown:
            raise ValueError(f"distribution['mpi'] has {', '.join(sorted(unknown))}; it takes "
                             f"enabled, processes_per_host and custom_mpi_options")
        if not options.get("enabled", False):
            return None, {}, {}
        knobs, env = _mpi_options(options.get("custom_mpi_options", ""), environ)
        return options.get("processes_per_host"), knobs, env
    if kind == "ringmaster":
        if options.get("enabled", True) is False:
            return None, {}, {}
        knobs = {k: v for k, v in options.items() if k not in _NATIVE_KEYS}
        set_knobs(job_pb2.Knobs(), knobs)  # ValueError names an unknown knob
        return options.get("processes_per_host"), knobs, {}
    raise ValueError(f"distribution '{kind}' is not supported: use {{'ringmaster': {{...}}}} or "
                     f"SageMaker's {{'mpi': {{...}}}}")


def _hyperparameter_value(value):
    # As SageMaker passes them: strings as they are, anything else as JSON.
    return value if isinstance(value, str) else json.dumps(value)


def _inherited_environment():
    """What `ringmaster submit` passes on from the caller: PATH, PYTHONPATH (this ringmaster
    package's directory first), HOME, LANG, LC_ALL, HOROVOD_*, RINGMASTER_* (but not the
    coordinator's address or the caller's token), NCCL_* and MXNET_*."""
    env = {}
    for key, value in os.environ.items():
        if key in ("PATH", "PYTHONPATH", "HOME", "LANG", "LC_ALL") or key.startswith(
                ("HOROVOD_", "RINGMASTER_", "NCCL_", "MXNET_")):
            env[key] = value
    for key in ("RINGMASTER_COORDINATOR", "RINGMASTER_TOKEN"):
        env.pop(key, None)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(ringmaster.__file__)))
    paths = [package_parent] + [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(paths))
    return env


class TrainingJob:
    """A submitted job: the client's calls bound to it."""

    def __init__(self, client, job, output_path=None):
        self.client = client
        self.job = job
        self.id = job.id
        self.output_path = output_path

    def __repr__(self):
        return f"TrainingJob({self.id!r})"

    def get(self):
        self.job = self.client.get(self.id)
        return self.job

    describe = get

    def watch(self):
        return self.client.watch(self.id)

    def cancel(self, reason=""):
        self.job = self.client.cancel(self.id, reason)
        return self.job

    def logs(self, follow=False, rank=None):
        return self.client.logs(self.id, follow=follow, rank=rank)

    def artifacts(self):
        return self.client.artifacts(self.id)

    def download(self, path=None):
        path = path or self.output_path
        if path is None:
            raise ValueError("download needs a directory (the estimator had no output_path)")
        return self.client.download(self.id, path)

    def wait(self, logs=True, timeout=None, out=None):
        """Waits for the end (printing the ranks' output to `out`, default sys.stdout, each line
        prefixed "[RANK] ", when `logs`), downloads the artifacts into output_path when one was
        given, and returns the job; JobFailedError when it did not succeed."""
        if logs:
            out = out or sys.stdout
            printer = _RankPrinter(out)
            done = threading.Event()

            def follow():
                try:
                    for chunk in self.client.logs(self.id, follow=True):
                        printer.write(chunk.rank, chunk.text)
                except RingmasterError as e:
                    if not done.is_set():
                        print(f"[ringmaster] log stream ended: {e}", file=sys.stderr)
                printer.flush()

            # The stream ends with the job; the wait below bounds it in time.
            thread = threading.Thread(target=follow, daemon=True)
            thread.start()
            job = self.client.wait(self.id, timeout=timeout)
            thread.join(timeout=10)
            done.set()
        else:
            job = self.client.wait(self.id, timeout=timeout)
        self.job = job
        if self.output_path is not None:
            self.client.download(self.id, self.output_path)
        if job.state != "SUCCEEDED":
            raise JobFailedError(job)
        return job


class _RankPrinter:
    """Whole lines, each prefixed by its rank."""

    def __init__(self, out):
        self.out = out
        self.partial = {}

    def write(self, rank, text):
        text = self.partial.pop(rank, "") + text
        lines = text.split("\n")
        for line in lines[:-1]:
            self.out.write(f"[{rank}] {line}\n")
        if lines[-1]:
            self.partial[rank] = lines[-1]
        self.out.flush()

    def flush(self):
        for rank, line in sorted(self.partial.items()):
            self.out.write(f"[{rank}] {line}\n")
        self.partial.clear()
        self.out.flush()


class Estimator:
    """A training script run as a Ringmaster job, as SageMaker's framework estimators run one.

    entry_point: the script (a path inside source_dir; without source_dir, a local file shipped
      alone). A ".py" runs with `interpreter` (default: this Python, sys.executable), a ".sh" with
      /bin/sh, anything else as a program.
    source_dir: a directory shipped with the job (tar.gz, at most the coordinator's
      --max-source-bytes, default 64 MiB); each rank runs in its own unpacked copy.
    instance_count: hosts; processes_per_host: ranks on each (default 1, or the distribution's).
      The job has instance_count * processes_per_host ranks, at most processes_per_host per host.
    hyperparameters: passed to the entry point as "--KEY VALUE" (non-strings as JSON), and as JSON
      in SM_HPS.
    distribution: {"ringmaster": {"processes_per_host": N, KNOB: VALUE, ...}} or SageMaker's
      {"mpi": {"enabled": True, "processes_per_host": N, "custom_mpi_options": "-x HOROVOD_...=V"}}:
      every HOROVOD_* knob Ringmaster supports maps to the job's knob (HOROVOD_KNOBS), an unknown
      one is refused (ValueError), and -x NAME=VALUE of any other variable sets the ranks'
      environment.
    environment: more variables for the ranks (win over the rest).
    output_path: a local directory fit() downloads the job's artifacts into (the timeline, the
      autotune log, and each rank's RINGMASTER_OUTPUT_DIR under rank-<rank>/); None: they stay with
      the coordinator (TrainingJob.download fetches them later).
    coordinator, tls, token: as ringmaster.jobs.Client (default RINGMASTER_COORDINATOR, ...).
    inherit_env: pass the caller's PATH, PYTHONPATH, HOME, LANG, LC_ALL, HOROVOD_*, RINGMASTER_*,
      NCCL_* and MXNET_* on, as `ringmaster submit` does (default True).
    max_run: the job's time limit in seconds (SageMaker's max_run): a job still running that long
      after its ranks were assigned is stopped and FAILED, saying so. None: no limit.
    """

    def __init__(self, entry_point, source_dir=None, instance_count=1, processes_per_host=None,
                 hyperparameters=None, distribution=None, environment=None, output_path=None,
                 base_job_name=None, interpreter=None, coordinator=None, tls=None, token=None,
                 labels=None, inherit_env=True, client=None, max_run=None):
        if not entry_point:
            raise ValueError("entry_point names the script to run")
        if source_dir is not None and not os.path.isdir(source_dir):
            raise ValueError(f"source_dir {source_dir} is not a directory")
        if source_dir is None and not os.path.isfile(entry_point):
            raise ValueError(f"entry_point {entry_point} is not a file (without source_dir the "
                             f"entry point is shipped alone)")
        if not isinstance(instance_count, int) or instance_count < 1:
            raise ValueError(f"instance_count = {instance_count!r} must be a positive integer")
        self.entry_point = entry_point
        self.source_dir = source_dir
        self.instance_count = instance_count
        self.hyperparameters = dict(hyperparameters or {})
        self.environment = dict(environment or {})
        self.output_path = output_path
        self.base_job_name = base_job_name
        self.interpreter = interpreter or sys.executable or "python3"
        self.labels = dict(labels or {})
        self.inherit_env = inherit_env
        self._client = client
        self._client_args = dict(address=coordinator, tls=tls, token=token)
        distributed_pph, self.knobs, self.mpi_env = parse_distribution(distribution)
        if (processes_per_host is not None and distributed_pph is not None
                and processes_per_host != distributed_pph):
            raise ValueError(f"processes_per_host = {processes_per_host} but the distribution "
                             f"says {distributed_pph}")
        pph = processes_per_host if processes_per_host is not None else distributed_pph
        pph = 1 if pph is None else pph
        if not isinstance(pph, int) or pph < 1:
            raise ValueError(f"processes_per_host = {pph!r} must be a positive integer")
        self.processes_per_host = pph
        if max_run is not None and (not isinstance(max_run, int) or isinstance(max_run, bool)
                                    or not 0 <= max_run <= 30 * 86400):
            raise ValueError(f"max_run = {max_run!r} must be whole seconds in [0, 2592000] "
                             f"(30 days)")
        self.max_run = max_run
        self.latest_training_job = None

    @property
    def client(self):
        if self._client is None:
            self._client = Client(**self._client_args)
        return self._client

    def command(self):
        """The entry point's command line, hyperparameters included."""
        script = self.entry_point if self.source_dir is not None else os.path.basename(
            self.entry_point)
        if script.endswith(".py"):
            argv = [self.interpreter, script]
        elif script.endswith(".sh"):
            argv = ["/bin/sh", script]
        else:
            argv = [script if "/" in script else f"./{script}"]
        for key, value in self.hyperparameters.items():
            argv += [f"--{key}", _hyperparameter_value(value)]
        return argv

    def job_spec(self, inputs=None, job_name=None):
        """The ringmaster.v1.JobSpec fit(inputs) submits (its code travels beside it)."""
        env = _inherited_environment() if self.inherit_env else {}
        env.update(self.mpi_env)
        channels = {"training": inputs} if isinstance(inputs, str) else dict(inputs or {})
        for name, path in channels.items():
            if not name or not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"channel name '{name}' is not letters, digits, '_' or '-'")
            upper = name.upper().replace("-", "_")
            env[f"RINGMASTER_CHANNEL_{upper}"] = str(path)
            env[f"SM_CHANNEL_{upper}"] = str(path)
        if channels:
            env["SM_CHANNELS"] = json.dumps(sorted(channels))
        if self.hyperparameters:
            env["SM_HPS"] = json.dumps(self.hyperparameters, sort_keys=True)
        env.update(self.environment)
        name = job_name or self.base_job_name or os.path.splitext(
            os.path.basename(self.entry_point))[0] or "job"
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:128]
        spec = job_pb2.JobSpec(name=name, np=self.instance_count * self.processes_per_host,
                               processes_per_host=self.processes_per_host,
                               command=self.command(), env=env, labels=self.labels,
                               max_run_seconds=self.max_run or 0)
        set_knobs(spec.knobs, self.knobs)
        return spec

    def _source(self):
        """What is shipped with the job (source_dir, or the entry point alone), and a directory
        made for it to remove once it is sent (None here)."""
        return (self.source_dir if self.source_dir is not None else self.entry_point), None

    def fit(self, inputs=None, wait=True, logs=True, job_name=None, timeout=None):
        """Submits the job with its code, then (with `wait`) streams its output, waits for its
        end, downloads its artifacts into output_path and returns the TrainingJob; JobFailedError
        (with the job's reason and its ranks' exit statuses) when it failed or was cancelled.
        Without `wait`, returns the TrainingJob at once."""
        spec = self.job_spec(inputs, job_name)
        source, staging = self._source()
        try:
            job = self.client.submit_spec(spec, source_dir=source)
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        self.latest_training_job = TrainingJob(self.client, job, self.output_path)
        if wait:
            self.latest_training_job.wait(logs=logs, timeout=timeout)
        return self.latest_training_job
