"""SageMaker's framework estimators (sagemaker.mxnet.MXNet, sagemaker.pytorch.PyTorch) over
ringmaster.Estimator: SageMaker's arguments under their v1 and v2 names, s3:// channels and output
paths, and the training container's environment on every rank (ringmaster.sagemaker.container)."""
import datetime
import json
import logging
import os
import shutil
import tarfile
import tempfile

from ringmaster.estimator import Estimator, parse_distribution
from ringmaster.sagemaker import s3
from ringmaster.sagemaker.instances import gpus_of

_log = logging.getLogger("ringmaster.sagemaker")

# SageMaker Python SDK v1's argument names, each to its v2 name.
V1_NAMES = {
    "train_instance_type": "instance_type",
    "train_instance_count": "instance_count",
    "distributions": "distribution",
    "train_volume_size": "volume_size",
    "train_max_run": "max_run",
    "train_max_wait": "max_wait",
    "image_name": "image_uri",
    "train_use_spot_instances": "use_spot_instances",
}
# Arguments SageMaker takes that mean nothing on a Ringmaster cluster: accepted, and said once.
NO_EFFECT = {
    "role": "the workers run under their own identity",
    "volume_size": "the workers' disks are theirs",
    "max_wait": "there are no spot instances to wait for",
    "use_spot_instances": "there are no spot instances",
    "image_uri": "the workers' image (or host) has the framework",
    "volume_kms_key": "no SageMaker volumes",
    "output_kms_key": "S3 encryption is the bucket's",
    "subnets": "the cluster's network is its own",
    "security_group_ids": "the cluster's network is its own",
    "tags": "use labels= for job labels",
    "sagemaker_session": "the coordinator is RINGMASTER_COORDINATOR (or coordinator=)",
    "metric_definitions": "Ringmaster's metrics are Prometheus's (docs/metrics.md)",
    "enable_sagemaker_metrics": "Ringmaster's metrics are Prometheus's (docs/metrics.md)",
    "enable_network_isolation": "the cluster's network is its own",
    "encrypt_inter_container_traffic": "use the coordinator's TLS (docs/security.md)",
    "input_mode": "channels are downloaded (File mode)",
    "checkpoint_s3_uri": "write checkpoints to SM_MODEL_DIR or SM_OUTPUT_DATA_DIR",
    "checkpoint_local_path": "write checkpoints to SM_MODEL_DIR or SM_OUTPUT_DATA_DIR",
    "debugger_hook_config": "no SageMaker Debugger",
    "rules": "no SageMaker Debugger",
    "disable_profiler": "no SageMaker profiler (the Horovod timeline is there)",
    "profiler_config": "no SageMaker profiler (the Horovod timeline is there)",
    "container_log_level": "the ranks' output streams back as it is",
    "code_location": "the code travels with the job",
    "max_retry_attempts": "a failed job is not retried",
    "keep_alive_period_in_seconds": "the workers are long-lived already",
    "model_uri": "no model channel",
    "model_channel_name": "no model channel",
}
# Ringmaster's own arguments (ringmaster.Estimator's), passed on as they are.
RINGMASTER_ARGS = ("interpreter", "coordinator", "tls", "token", "labels", "inherit_env", "client",
                   "processes_per_host")


def _timestamp():
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%d-%H-%M-%S-") + f"{now.microsecond // 1000:03d}"


def _local_path(uri):
    return uri[len("file://"):] if isinstance(uri, str) and uri.startswith("file://") else uri


class Framework(Estimator):
    """A SageMaker framework estimator. Subclasses name the framework (`FRAMEWORK`, the module
    the ranks import for the version check: "mxnet", "pytorch") and SageMaker's default job name."""

    FRAMEWORK = None
    DEFAULT_JOB_NAME = "training"

    def __init__(self, entry_point, framework_version=None, py_version=None, source_dir=None,
                 hyperparameters=None, instance_count=None, instance_type=None,
                 distribution=None, output_path=None, base_job_name=None, environment=None,
                 dependencies=None, max_run=None, **kwargs):
        v2 = {"instance_type": instance_type, "instance_count": instance_count,
              "distribution": distribution, "max_run": max_run}
        for name in ("volume_size", "max_wait", "image_uri", "use_spot_instances"):
            v2[name] = kwargs.pop(name, None)
        for old, new in V1_NAMES.items():
            if old not in kwargs:
                continue
            value = kwargs.pop(old)
            if v2[new] is not None:
                raise ValueError(f"{old}={value!r} and {new}={v2[new]!r} are both given: they are "
                                 f"one argument (SageMaker SDK v1 and v2 names); give one")
            v2[new] = value
        ringmaster_args = {k: kwargs.pop(k) for k in RINGMASTER_ARGS if k in kwargs}
        no_effect = {k: kwargs.pop(k) for k in list(kwargs) if k in NO_EFFECT}
        no_effect.update({k: v2[k] for k in ("volume_size", "max_wait", "image_uri",
                                             "use_spot_instances") if v2[k] is not None})
        if kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        if no_effect:
            _log.warning("ringmaster.sagemaker: %s: no effect on Ringmaster (%s)",
                         ", ".join(sorted(no_effect)),
                         "; ".join(f"{k}: {NO_EFFECT[k]}" for k in sorted(no_effect)))
        self.no_effect = sorted(no_effect)
        self.framework_version = framework_version
        self.py_version = py_version
        self.instance_type = v2["instance_type"] or "local"
        self.gpus = gpus_of(self.instance_type)
        instance_count = 1 if v2["instance_count"] is None else v2["instance_count"]
        distribution = v2["distribution"]
        distributed_pph, _, _ = parse_distribution(distribution)
        if distributed_pph is None and ringmaster_args.get("processes_per_host") is None:
            # SageMaker's default: a process per GPU, one on a CPU instance.
            ringmaster_args["processes_per_host"] = max(1, self.gpus)
        self.dependencies = list(dependencies or [])
        for path in self.dependencies:
            if not os.path.exists(path):
                raise ValueError(f"dependencies: {path} does not exist")
        self._s3_output = output_path if s3.is_s3(output_path) else None
        labels = dict(ringmaster_args.pop("labels", None) or {})
        labels.setdefault("sagemaker.instance_type", self.instance_type)
        if self.FRAMEWORK:
            labels.setdefault("sagemaker.framework", self.FRAMEWORK)
        super().__init__(entry_point, source_dir=source_dir, instance_count=instance_count,
                         hyperparameters=hyperparameters, distribution=distribution,
                         environment=environment,
                         output_path=None if self._s3_output else _local_path(output_path),
                         base_job_name=base_job_name, labels=labels, max_run=v2["max_run"],
                         **ringmaster_args)
        if self.gpus > 0 and "backend" not in self.knobs:
            # A GPU instance type: the job runs on GPU slots, over NCCL (the coordinator places an
            # NCCL job on GPU slots only).
            self.knobs["backend"] = "nccl"
        self.model_data = None
        self._job_name = None

    def command(self):
        """The entry point's command line, run by SageMaker's container logic on each rank."""
        return [self.interpreter, "-m", "ringmaster.sagemaker.container", "--"] + super().command()

    def job_spec(self, inputs=None, job_name=None):
        channels = {"training": inputs} if isinstance(inputs, str) else dict(inputs or {})
        local = {name: _local_path(uri) for name, uri in channels.items() if not s3.is_s3(uri)}
        remote = {name: uri for name, uri in channels.items() if s3.is_s3(uri)}
        spec = super().job_spec({**channels, **local}, job_name)
        env = spec.env
        env["RINGMASTER_SM_LOCAL_CHANNELS"] = json.dumps(local, sort_keys=True)
        env["RINGMASTER_SM_S3_CHANNELS"] = json.dumps(remote, sort_keys=True)
        env["RINGMASTER_SM_NUM_GPUS"] = str(self.gpus)
        env["RINGMASTER_SM_INSTANCE_TYPE"] = self.instance_type
        env["RINGMASTER_SM_ENTRY_POINT"] = os.path.basename(self.entry_point)
        env["RINGMASTER_SM_JOB_NAME"] = spec.name
        env["RINGMASTER_SM_USER_ARGS"] = json.dumps(super().command()[2:])
        if self.FRAMEWORK:
            env["RINGMASTER_SM_FRAMEWORK"] = self.FRAMEWORK
            env["RINGMASTER_SM_FRAMEWORK_MODULE"] = f"sagemaker_{self.FRAMEWORK}_container"
        if self.framework_version:
            env["RINGMASTER_SM_FRAMEWORK_VERSION"] = str(self.framework_version)
        if self.py_version:
            env["RINGMASTER_SM_PY_VERSION"] = str(self.py_version)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                     "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL",
                     "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            if remote and name in os.environ and name not in env:
                env[name] = os.environ[name]
        return spec

    def _source(self):
        """The directory shipped with the job: source_dir (or the entry point alone), with the
        dependencies copied beside it, as SageMaker ships them."""
        base, _ = super()._source()
        if not self.dependencies:
            return base, None
        staging = tempfile.mkdtemp(prefix="ringmaster-source-")
        if os.path.isdir(base):
            shutil.copytree(base, staging, dirs_exist_ok=True)
        else:
            shutil.copy2(base, staging)
        for path in self.dependencies:
            target = os.path.join(staging, os.path.basename(os.path.normpath(path)))
            if os.path.isdir(path):
                shutil.copytree(path, target, dirs_exist_ok=True)
            else:
                shutil.copy2(path, target)
        return staging, staging

    def fit(self, inputs=None, wait=True, logs=True, job_name=None, timeout=None):
        """SageMaker's fit(): s3:// channels and output path are checked before any job exists
        (S3Error, a ValueError, naming the URI); then the job runs; at its end (also when it
        failed) its model and output go to `<output_path>/<job name>/output/model.tar.gz` and
        `output.tar.gz`, and `model_data` names the first."""
        channels = {"training": inputs} if isinstance(inputs, str) else dict(inputs or {})
        for uri in channels.values():
            if s3.is_s3(uri):
                s3.check_readable(uri)
        if self._s3_output:
            s3.check_writable(self._s3_output)
        self._job_name = job_name or f"{self.base_job_name or self.DEFAULT_JOB_NAME}-{_timestamp()}"
        job = super().fit(inputs, wait=False, job_name=self._job_name)
        job.name = self._job_name
        if wait:
            self.wait(logs=logs, timeout=timeout)
        return job

    def wait(self, logs=True, timeout=None):
        job = self.latest_training_job
        try:
            return job.wait(logs=logs, timeout=timeout)
        finally:
            if self._s3_output:
                self._upload(job)

    def _upload(self, job):
        """The job's artifacts as SageMaker lays them out in S3."""
        prefix = f"{self._s3_output.rstrip('/')}/{self._job_name}/output"
        with tempfile.TemporaryDirectory(prefix="ringmaster-output-") as tmp:
            artifacts = os.path.join(tmp, "artifacts")
            job.client.download(job.id, artifacts)
            model = os.path.join(tmp, "model.tar.gz")
            output = os.path.join(tmp, "output.tar.gz")
            _pack(artifacts, model, output)
            s3.upload_file(model, f"{prefix}/model.tar.gz")
            s3.upload_file(output, f"{prefix}/output.tar.gz")
        self.model_data = f"{prefix}/model.tar.gz"
        _log.info("ringmaster.sagemaker: model and output uploaded under %s", prefix)


def _pack(artifacts, model_tar, output_tar):
    """model.tar.gz: every rank's model/ directory merged (a lower rank's file wins); output.tar.gz:
    the job's own artifacts (timeline, autotune log) and the rest of every rank's output (data/ at
    the top, as SageMaker's output/data), merged likewise."""
    model, output = {}, {}
    entries = sorted(os.listdir(artifacts)) if os.path.isdir(artifacts) else []
    ranks = sorted((e for e in entries if e.startswith("rank-") and e[5:].isdigit()),
                   key=lambda e: int(e[5:]))
    for name in entries:
        path = os.path.join(artifacts, name)
        if name not in ranks and os.path.isfile(path):
            output.setdefault(name, path)
    for rank in ranks:
        root = os.path.join(artifacts, rank)
        for directory, _, files in os.walk(root):
            for f in files:
                path = os.path.join(directory, f)
                relative = os.path.relpath(path, root)
                head, _, rest = relative.partition(os.sep)
                if head == "model" and rest:
                    model.setdefault(rest, path)
                elif head == "data" and rest:
                    output.setdefault(rest, path)
                else:
                    output.setdefault(relative, path)
    for target, members in ((model_tar, model), (output_tar, output)):
        with tarfile.open(target, "w:gz") as tar:
            for name, path in sorted(members.items()):
                tar.add(path, arcname=name)
