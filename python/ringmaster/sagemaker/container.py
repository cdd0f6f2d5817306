"""What SageMaker's training container does around the entry point, on each rank:

    python -m ringmaster.sagemaker.container -- COMMAND...

ringmaster.sagemaker's estimators run the entry point through it. It
  - compares the framework the estimator asked for (RINGMASTER_SM_FRAMEWORK, ..._VERSION,
    RINGMASTER_SM_PY_VERSION) with the one this Python imports: another major version fails the rank
    at once naming both; another minor or patch runs, and rank 0 says so once;
  - downloads each s3:// input channel (RINGMASTER_SM_S3_CHANNELS, JSON {name: uri}) once per host,
    into a directory of the job's on that host, and points SM_CHANNEL_<NAME> at it;
  - sets the training toolkit's environment (SM_HOSTS, SM_CURRENT_HOST, SM_NUM_GPUS, SM_NUM_CPUS,
    SM_HP_<NAME>, SM_USER_ARGS, SM_MODEL_DIR, SM_OUTPUT_DIR, SM_OUTPUT_DATA_DIR,
    SM_OUTPUT_INTERMEDIATE_DIR, SM_INPUT_DIR, SM_TRAINING_ENV, SM_RESOURCE_CONFIG, ...): hosts are
    named algo-1 .. algo-N by cross rank, as SageMaker names them;
  - runs COMMAND, passing SIGTERM and SIGINT on, and exits as it did (a signal death by the same
    signal); what the script wrote to /opt/ml/model (when it may) goes to SM_MODEL_DIR afterwards.
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ringmaster.sagemaker import s3

OPT_ML_MODEL = "/opt/ml/model"


def _say(text):
    print(f"ringmaster.sagemaker: {text}", file=sys.stderr, flush=True)


def framework_version_here(framework):
    """The version of `framework` ("mxnet", "pytorch") this Python imports, or None."""
    module = {"mxnet": "mxnet", "pytorch": "torch"}.get(framework)
    if module is None:
        return None
    try:
        imported = __import__(module)
    except ImportError:
        return None
    return str(getattr(imported, "__version__", "")).split("+")[0]


def check_versions(environ, rank):
    """Exits (status 2) when the framework's or Python's major version differs from what the
    estimator asked for; says once (rank 0) when only the minor differs. Returns the lines said."""
    said = []
    framework = environ.get("RINGMASTER_SM_FRAMEWORK", "")
    asked = environ.get("RINGMASTER_SM_FRAMEWORK_VERSION", "")
    names = {"mxnet": "MXNet", "pytorch": "PyTorch"}
    if framework and asked:
        here = framework_version_here(framework)
        name = names.get(framework, framework)
        if here is None:
            sys.exit(f"ringmaster.sagemaker: framework_version {asked} asks for {name}, which this "
                     f"rank's Python ({sys.executable}) cannot import")
        if asked.split(".")[0] != here.split(".")[0]:
            sys.exit(f"ringmaster.sagemaker: framework_version {asked} asks for {name} {asked}, "
                     f"but the ranks have {name} {here} (another major version): give "
                     f"framework_version='{here}' or run workers with {name} {asked}")
        if asked.split(".")[:2] != here.split(".")[:2]:
            said.append(f"framework_version {asked} asked; the ranks have {name} {here}, which "
                        f"runs it (same major version)")
    py_asked = environ.get("RINGMASTER_SM_PY_VERSION", "")
    if py_asked:
        digits = py_asked[2:] if py_asked.startswith("py") else py_asked
        here = f"{sys.version_info.major}{sys.version_info.minor}"
        if not digits.isdigit() or digits[0] != here[0]:
            sys.exit(f"ringmaster.sagemaker: py_version {py_asked} asks for Python {digits}, but "
                     f"the ranks have Python {sys.version_info.major}.{sys.version_info.minor} "
                     f"(another major version)")
        if len(digits) > 1 and digits != here:
            said.append(f"py_version {py_asked} asked; the ranks have Python "
                        f"{sys.version_info.major}.{sys.version_info.minor}")
    if rank == 0:
        for line in said:
            # A notice line: the coordinator adds it to the job's events (and it stays in the log).
            print(f"ringmaster-notice: ringmaster.sagemaker: {line}", file=sys.stderr, flush=True)
    return said


class _HostShare:
    """A directory of this job's on this host, shared by its local ranks: the first to come makes
    what is missing under a lock; the last to leave removes it."""

    def __init__(self, job_id):
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in job_id) or "job"
        self.root = os.path.join(tempfile.gettempdir(), f"ringmaster-sagemaker-{safe}")
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        self._lock_path = os.path.join(self.root, ".lock")

    def _locked(self):
        handle = open(self._lock_path, "a+")
        fcntl.flock(handle, fcntl.LOCK_EX)  # held by a sibling rank at most while it downloads
        return handle

    def _users(self, change):
        path = os.path.join(self.root, ".users")
        with self._locked():
            try:
                with open(path) as f:
                    users = int(f.read() or 0)
            except FileNotFoundError:
                users = 0
            users += change
            with open(path, "w") as f:
                f.write(str(users))
            return users

    def enter(self):
        self._users(+1)

    def leave(self):
        if self._users(-1) <= 0:
            shutil.rmtree(self.root, ignore_errors=True)

    def channel(self, name, uri):
        """The directory holding channel `name` (downloaded from `uri` by the first local rank)."""
        directory = os.path.join(self.root, "input", "data", name)
        with self._locked():
            done = os.path.join(self.root, "input", f".{name}.done")
            if not os.path.exists(done):
                shutil.rmtree(directory, ignore_errors=True)
                os.makedirs(directory)
                started = time.monotonic()
                count = s3.download_prefix(uri, directory)
                _say(f"channel '{name}': {count} objects from {uri} in "
                     f"{time.monotonic() - started:.1f}s")
                with open(done, "w") as f:
                    f.write(uri)
        return directory


def sagemaker_environment(environ, channels, input_dir):
    """The training toolkit's variables for this rank: {name: value}."""
    rank = int(environ.get("RINGMASTER_RANK", "0"))
    cross_rank = int(environ.get("RINGMASTER_CROSS_RANK", "0"))
    cross_size = int(environ.get("RINGMASTER_CROSS_SIZE", "1"))
    hosts = [f"algo-{i + 1}" for i in range(cross_size)]
    current = hosts[cross_rank] if cross_rank < len(hosts) else f"algo-{cross_rank + 1}"
    output = environ.get("RINGMASTER_OUTPUT_DIR", os.path.join(os.getcwd(), "output"))
    model_dir = os.path.join(output, "model")
    data_dir = os.path.join(output, "data")
    intermediate = os.path.join(output, "intermediate")
    for d in (model_dir, data_dir, intermediate):
        os.makedirs(d, exist_ok=True)
    hyperparameters = json.loads(environ.get("SM_HPS", "{}") or "{}")
    user_args = json.loads(environ.get("RINGMASTER_SM_USER_ARGS", "[]") or "[]")
    num_gpus = int(environ.get("RINGMASTER_SM_NUM_GPUS", "0") or 0)
    num_cpus = os.cpu_count() or 1
    resource = {"current_host": current, "hosts": hosts, "network_interface_name": "eth0"}
    env = {
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": current,
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NUM_CPUS": str(num_cpus),
        "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_MODEL_DIR": model_dir,
        "SM_OUTPUT_DIR": output,
        "SM_OUTPUT_DATA_DIR": data_dir,
        "SM_OUTPUT_INTERMEDIATE_DIR": intermediate,
        "SM_INPUT_DIR": input_dir,
        "SM_INPUT_CONFIG_DIR": os.path.join(input_dir, "config"),
        "SM_CHANNELS": json.dumps(sorted(channels)),
        "SM_HPS": json.dumps(hyperparameters, sort_keys=True),
        "SM_USER_ARGS": json.dumps(user_args),
        "SM_RESOURCE_CONFIG": json.dumps(resource),
        "SM_CURRENT_INSTANCE_TYPE": environ.get("RINGMASTER_SM_INSTANCE_TYPE", "local"),
        "SM_LOG_LEVEL": "20",
        "SM_FRAMEWORK_MODULE": environ.get("RINGMASTER_SM_FRAMEWORK_MODULE", ""),
    }
    for name, path in channels.items():
        env[f"SM_CHANNEL_{name.upper().replace('-', '_')}"] = path
    for key, value in hyperparameters.items():
        env[f"SM_HP_{key.upper().replace('-', '_')}"] = (value if isinstance(value, str)
                                                         else json.dumps(value))
    env["SM_TRAINING_ENV"] = json.dumps({
        "current_host": current, "hosts": hosts, "num_gpus": num_gpus, "num_cpus": num_cpus,
        "model_dir": model_dir, "output_dir": output, "output_data_dir": data_dir,
        "output_intermediate_dir": intermediate, "input_dir": input_dir,
        "input_data_config": {name: {} for name in channels},
        "channel_input_dirs": dict(channels), "hyperparameters": hyperparameters,
        "user_entry_point": environ.get("RINGMASTER_SM_ENTRY_POINT", ""),
        "framework_module": env["SM_FRAMEWORK_MODULE"], "network_interface_name": "eth0",
        "resource_config": resource, "log_level": 20, "is_master": rank == 0,
        "job_name": environ.get("RINGMASTER_SM_JOB_NAME", environ.get("RINGMASTER_JOB_ID", "")),
        "module_dir": environ.get("SM_MODULE_DIR", os.getcwd())}, sort_keys=True)
    return env


def _model_dir_written_since(started):
    """Files under /opt/ml/model modified since `started` (the script wrote them)."""
    found = []
    for directory, _, files in os.walk(OPT_ML_MODEL):
        for name in files:
            path = os.path.join(directory, name)
            try:
                if os.path.getmtime(path) >= started:
                    found.append(path)
            except OSError:
                continue
    return found


def _opt_ml_model_writable():
    try:
        os.makedirs(OPT_ML_MODEL, exist_ok=True)
        return os.access(OPT_ML_MODEL, os.W_OK)
    except OSError:
        return False


def run(command, environ=None):
    """Runs `command` as SageMaker's container would; returns its exit status."""
    environ = dict(os.environ if environ is None else environ)
    rank = int(environ.get("RINGMASTER_RANK", "0"))
    check_versions(environ, rank)
    share = _HostShare(environ.get("RINGMASTER_JOB_ID", "job"))
    share.enter()
    try:
        channels = json.loads(environ.get("RINGMASTER_SM_LOCAL_CHANNELS", "{}") or "{}")
        for name, uri in json.loads(environ.get("RINGMASTER_SM_S3_CHANNELS", "{}") or "{}").items():
            channels[name] = share.channel(name, uri)
        env = dict(environ)
        env.update(sagemaker_environment(environ, channels, os.path.join(share.root, "input")))
        model_dir = env["SM_MODEL_DIR"]
        writable = _opt_ml_model_writable()
        if not writable and rank == 0:
            _say(f"{OPT_ML_MODEL} is not writable here: write the model to $SM_MODEL_DIR "
                 f"({model_dir}), which comes back as model.tar.gz")
        started = time.time() - 1
        child = subprocess.Popen(command, env=env)

        def forward(signum, _frame):
            child.send_signal(signum)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        status = child.wait()
        if writable:
            for path in _model_dir_written_since(started):
                target = os.path.join(model_dir, os.path.relpath(path, OPT_ML_MODEL))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(path, target)
        return status
    finally:
        share.leave()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.exit("usage: python -m ringmaster.sagemaker.container -- COMMAND...")
    try:
        status = run(argv)
    except s3.S3Error as e:
        sys.exit(f"ringmaster.sagemaker: {e}")
    if status < 0:  # died of a signal: die of it too, so the job reports it
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
