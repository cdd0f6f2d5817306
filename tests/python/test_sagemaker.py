"""ringmaster.sagemaker: SageMaker's notebook cell with only its import changed. Its arguments under
the SDK's v1 and v2 names, the instance types, custom_mpi_options, max_run, the training
container's environment on the ranks, and, end to end against a coordinator and workers on
loopback and an S3-compatible server (moto, scripts/s3-venv.sh) on loopback: the MXNet and the
PyTorch cells, their s3:// channel read on every rank, the knobs in effect, and the model, timeline
and autotune log back in S3 in SageMaker's layout.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_sagemaker.py
"""
import io
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import Cluster, wait_for  # noqa: E402

from ringmaster.sagemaker import container  # noqa: E402
from ringmaster.sagemaker.estimator import _pack  # noqa: E402
from ringmaster.sagemaker.mxnet import MXNet  # noqa: E402
from ringmaster.sagemaker.pytorch import PyTorch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_PYTHON = ROOT / "build" / "python"
S3_BIN = pathlib.Path(os.environ.get("RINGMASTER_S3_VENV", ROOT / "build" / "s3-venv")) / "bin"
MXNET_PYTHON = pathlib.Path(os.environ.get("RINGMASTER_MXNET_VENV",
                                           ROOT / "build" / "mxnet-venv")) / "bin" / "python"

# The reference notebook's distribution, its four tuning knobs together.
KNOBS = ("-x HOROVOD_AUTOTUNE=1 -x HOROVOD_AUTOTUNE_LOG=/opt/ml/output/autotune_log.csv "
         "-x HOROVOD_TIMELINE=/opt/ml/output/timeline.json "
         "-x HOROVOD_FUSION_THRESHOLD=33554432 -x HOROVOD_CYCLE_TIME=5")


def notebook_arguments(v1, **over):
    """The reference cell's arguments, under the SDK's v1 or v2 names."""
    names = {"instance_type": "train_instance_type", "instance_count": "train_instance_count",
             "volume_size": "train_volume_size", "distribution": "distributions"}
    args = dict(entry_point="train.py", source_dir=str(ROOT / "examples"), role="arn:aws:iam::1:r",
                instance_type="ml.p3dn.24xlarge", instance_count=2, framework_version="1.6.0",
                volume_size=100, py_version="py3", hyperparameters={"epochs": 2, "lr": 0.01},
                distribution={"mpi": {"enabled": True, "processes_per_host": 8,
                                      "custom_mpi_options": "-verbose --NCCL_DEBUG=INFO"}})
    args.update(over)
    if v1:
        args = {names.get(k, k): v for k, v in args.items()}
    return args


def test_the_cells_v1_and_v2_arguments_give_one_job_spec():
    v1 = MXNet(**notebook_arguments(v1=True)).job_spec({"data": "/data"}, "cell")
    v2 = MXNet(**notebook_arguments(v1=False)).job_spec({"data": "/data"}, "cell")
    assert v1 == v2
    assert (v1.np, v1.processes_per_host, v1.name) == (16, 8, "cell")
    assert list(v1.command) == [sys.executable, "-m", "ringmaster.sagemaker.container", "--",
                                sys.executable, "train.py", "--epochs", "2", "--lr", "0.01"]
    env = dict(v1.env)
    assert env["NCCL_DEBUG"] == "INFO"  # --NCCL_DEBUG=INFO, as SageMaker's container reads it
    assert {k: env[k] for k in env if k.startswith("RINGMASTER_SM_")} == {
        "RINGMASTER_SM_LOCAL_CHANNELS": '{"data": "/data"}',
        "RINGMASTER_SM_S3_CHANNELS": "{}",
        "RINGMASTER_SM_NUM_GPUS": "8",
        "RINGMASTER_SM_INSTANCE_TYPE": "ml.p3dn.24xlarge",
        "RINGMASTER_SM_ENTRY_POINT": "train.py",
        "RINGMASTER_SM_JOB_NAME": "cell",
        "RINGMASTER_SM_USER_ARGS": '["--epochs", "2", "--lr", "0.01"]',
        "RINGMASTER_SM_FRAMEWORK": "mxnet",
        "RINGMASTER_SM_FRAMEWORK_MODULE": "sagemaker_mxnet_container",
        "RINGMASTER_SM_FRAMEWORK_VERSION": "1.6.0",
        "RINGMASTER_SM_PY_VERSION": "py3",
    }
    assert dict(v1.labels) == {"sagemaker.instance_type": "ml.p3dn.24xlarge",
                               "sagemaker.framework": "mxnet"}
    from ringmaster.v1 import common_pb2
    assert v1.knobs.backend == common_pb2.BACKEND_NCCL  # a GPU type: GPU slots, NCCL


def test_bad_arguments_are_refused_as_the_sdk_refuses_them():
    with pytest.raises(TypeError) as e:
        MXNet(**notebook_arguments(v1=True), train_instance_typo="ml.c5.xlarge")
    assert str(e.value) == "MXNet.__init__() got an unexpected keyword argument 'train_instance_typo'"
    with pytest.raises(ValueError) as e:
        PyTorch(**notebook_arguments(v1=False), train_instance_count=3)
    assert str(e.value) == ("train_instance_count=3 and instance_count=2 are both given: they are "
                            "one argument (SageMaker SDK v1 and v2 names); give one")
    with pytest.raises(ValueError) as e:
        MXNet(**notebook_arguments(v1=False, distribution={"mpi": {
            "enabled": True, "custom_mpi_options": "--bind-to none"}}))
    assert str(e.value) == ("custom_mpi_options: '--bind-to' is an mpirun option Ringmaster has no "
                            "equivalent of; only -x NAME=VALUE, -x NAME and --NAME=VALUE (a "
                            "variable) are taken")
    with pytest.raises(ValueError) as e:
        MXNet(**notebook_arguments(v1=False, instance_type="ml.z9.huge"))
    assert str(e.value).startswith("instance_type 'ml.z9.huge' is not a SageMaker training "
                                   "instance type Ringmaster knows (ml.<family>.<size> of ")
    with pytest.raises(ValueError) as e:
        MXNet(**notebook_arguments(v1=False, max_run=-5))
    assert str(e.value) == "max_run = -5 must be whole seconds in [0, 2592000] (30 days)"


@pytest.mark.parametrize("instance_type, processes", [
    ("ml.p3.16xlarge", 8), ("ml.p3.2xlarge", 1), ("ml.g4dn.12xlarge", 4), ("ml.c5.xlarge", 1),
    ("ml.m5.24xlarge", 1), ("local", 1)])
def test_the_instance_type_gives_the_processes_per_host_without_a_distribution(instance_type,
                                                                               processes):
    spec = PyTorch(entry_point="train.py", source_dir=str(ROOT / "examples"),
                   instance_type=instance_type, instance_count=2).job_spec(None, "t")
    assert (spec.np, spec.processes_per_host) == (2 * processes, processes)
    # custom_mpi_options applies without processes_per_host (SageMaker's SDK drops it then).
    spec = PyTorch(entry_point="train.py", source_dir=str(ROOT / "examples"),
                   instance_type=instance_type, instance_count=1, max_run=3600,
                   distribution={"mpi": {"enabled": True, "custom_mpi_options": KNOBS}}
                   ).job_spec(None, "t")
    assert spec.processes_per_host == processes
    assert spec.max_run_seconds == 3600
    k = spec.knobs
    assert (k.autotune, k.autotune_log, k.timeline, k.fusion_threshold_bytes, k.cycle_time_ms) == (
        True, "autotune_log.csv", "timeline.json", 33554432, 5.0)


def test_arguments_without_effect_are_said_once(caplog):
    caplog.set_level(logging.WARNING, logger="ringmaster.sagemaker")
    estimator = MXNet(**notebook_arguments(v1=True), train_use_spot_instances=True,
                      train_max_wait=7200, image_name="my-image")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith("ringmaster.sagemaker: image_uri, max_wait, role, "
                              "use_spot_instances, volume_size: no effect on Ringmaster (")
    assert estimator.no_effect == ["image_uri", "max_wait", "role", "use_spot_instances",
                                   "volume_size"]


def test_the_framework_version_is_compared_with_the_ranks(monkeypatch, capsys):
    monkeypatch.setattr(container, "framework_version_here", lambda framework: "1.9.1")
    env = {"RINGMASTER_SM_FRAMEWORK": "mxnet", "RINGMASTER_SM_FRAMEWORK_VERSION": "1.6.0",
           "RINGMASTER_SM_PY_VERSION": "py3"}
    assert container.check_versions(env, rank=0) == [
        "framework_version 1.6.0 asked; the ranks have MXNet 1.9.1, which runs it (same major "
        "version)"]
    assert capsys.readouterr().err == (  # a notice line: the job's events get it
        "ringmaster-notice: ringmaster.sagemaker: framework_version 1.6.0 asked; the ranks have "
        "MXNet 1.9.1, which runs it (same major version)\n")
    container.check_versions(env, rank=1)  # said once: by rank 0
    assert capsys.readouterr().err == ""
    assert container.check_versions(dict(env, RINGMASTER_SM_FRAMEWORK_VERSION="1.9"), 0) == []
    with pytest.raises(SystemExit) as e:
        container.check_versions(dict(env, RINGMASTER_SM_FRAMEWORK_VERSION="2.0.0"), 0)
    assert str(e.value) == (
        "ringmaster.sagemaker: framework_version 2.0.0 asks for MXNet 2.0.0, but the ranks have "
        "MXNet 1.9.1 (another major version): give framework_version='1.9.1' or run workers with "
        "MXNet 2.0.0")
    with pytest.raises(SystemExit) as e:
        container.check_versions(dict(env, RINGMASTER_SM_PY_VERSION="py27"), 0)
    assert str(e.value).startswith("ringmaster.sagemaker: py_version py27 asks for Python 27, but "
                                   "the ranks have Python 3.")


def test_the_container_environment_is_sagemakers(tmp_path):
    environ = {"RINGMASTER_RANK": "3", "RINGMASTER_CROSS_RANK": "1", "RINGMASTER_CROSS_SIZE": "2",
               "RINGMASTER_OUTPUT_DIR": str(tmp_path / "out"), "SM_HPS": '{"epochs": 2, "lr": "x"}',
               "RINGMASTER_SM_USER_ARGS": '["--epochs", "2", "--lr", "x"]',
               "RINGMASTER_SM_NUM_GPUS": "8", "RINGMASTER_SM_INSTANCE_TYPE": "ml.p3.16xlarge",
               "RINGMASTER_SM_JOB_NAME": "cell", "RINGMASTER_SM_ENTRY_POINT": "train.py"}
    env = container.sagemaker_environment(environ, {"data": "/d"}, str(tmp_path / "in"))
    out = tmp_path / "out"
    assert {k: v for k, v in env.items() if k != "SM_TRAINING_ENV"} == {
        "SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "8",
        "SM_NUM_CPUS": str(os.cpu_count()), "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_MODEL_DIR": str(out / "model"), "SM_OUTPUT_DIR": str(out),
        "SM_OUTPUT_DATA_DIR": str(out / "data"),
        "SM_OUTPUT_INTERMEDIATE_DIR": str(out / "intermediate"),
        "SM_INPUT_DIR": str(tmp_path / "in"),
        "SM_INPUT_CONFIG_DIR": str(tmp_path / "in" / "config"), "SM_CHANNELS": '["data"]',
        "SM_CHANNEL_DATA": "/d", "SM_HPS": '{"epochs": 2, "lr": "x"}', "SM_HP_EPOCHS": "2",
        "SM_HP_LR": "x", "SM_USER_ARGS": '["--epochs", "2", "--lr", "x"]',
        "SM_RESOURCE_CONFIG": json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"],
                                          "network_interface_name": "eth0"}),
        "SM_CURRENT_INSTANCE_TYPE": "ml.p3.16xlarge", "SM_LOG_LEVEL": "20",
        "SM_FRAMEWORK_MODULE": ""}
    training = json.loads(env["SM_TRAINING_ENV"])
    assert (training["current_host"], training["is_master"], training["job_name"],
            training["channel_input_dirs"], training["user_entry_point"]) == (
        "algo-2", False, "cell", {"data": "/d"}, "train.py")
    assert all((out / d).is_dir() for d in ("model", "data", "intermediate"))


def test_the_artifacts_are_packed_in_sagemakers_layout(tmp_path):
    a = tmp_path / "a"
    for path, text in {"timeline.json": "T", "autotune_log.csv": "A",
                       "rank-0/model/model.params": "M0", "rank-1/model/model.params": "M1",
                       "rank-1/model/extra.txt": "E", "rank-0/data/seen.json": "S0",
                       "rank-10/data/seen.json": "S10", "rank-1/notes.txt": "N"}.items():
        (a / path).parent.mkdir(parents=True, exist_ok=True)
        (a / path).write_text(text)
    _pack(str(a), str(tmp_path / "model.tar.gz"), str(tmp_path / "output.tar.gz"))
    assert read_tar(tmp_path / "model.tar.gz") == {"model.params": "M0", "extra.txt": "E"}
    assert read_tar(tmp_path / "output.tar.gz") == {
        "timeline.json": "T", "autotune_log.csv": "A", "seen.json": "S0", "notes.txt": "N"}


def read_tar(path_or_bytes):
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else pathlib.Path(
        path_or_bytes).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    out = {}
    for name, data in files.items():
        try:
            out[name] = data.decode()
        except UnicodeDecodeError:
            out[name] = data  # a model's bytes
    return out


# End to end: a coordinator, workers on two hosts, an S3 server on loopback.

s3_missing = pytest.mark.skipif(
    not (S3_BIN / "moto_server").exists(),
    reason=f"no S3 server: {S3_BIN}/moto_server is missing (scripts/s3-venv.sh makes it; it needs "
           f"PyPI)")

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
               "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}


def s3_server(tmp_path, unauthenticated_actions=None):
    """An S3 server (moto) on loopback, with the bucket 'bucket' holding data/ (two objects);
    yields the environment that reaches it. With `unauthenticated_actions`, the server checks
    credentials after that many actions (ours are not known to it: every later call is denied)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "moto.log", "w")
    server_env = dict(os.environ)
    if unauthenticated_actions is not None:
        server_env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(unauthenticated_actions)
    server = subprocess.Popen([str(S3_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT, env=server_env)
    env = dict(CREDENTIALS, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    try:
        def listening():
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return server.poll() is not None  # exited: the assertion below says so
        wait_for(listening, 30, "the S3 server")
        assert server.poll() is None, (tmp_path / "moto.log").read_text()
        boto3 = pytest.importorskip("boto3", reason="boto3 is missing (python3-boto3)")
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bucket")
        client.put_object(Bucket="bucket", Key="data/train.csv", Body=b"1,2\n3,4\n5,6\n")
        client.put_object(Bucket="bucket", Key="data/sub/labels.txt", Body=b"a b c\n")
        env["client"] = client
        yield env
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


@pytest.fixture
def s3(tmp_path):
    yield from s3_server(tmp_path)


@pytest.fixture
def s3_enforcing(tmp_path):
    yield from s3_server(tmp_path, unauthenticated_actions=3)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    coordinator = c.coordinator()
    for host in ("h0", "h1"):
        c.worker(coordinator, host=host)
    wait_for(lambda: len(c.idle_workers(coordinator)) == 2, 20, "the workers")
    c.address = coordinator.address
    c.coord = coordinator
    yield c
    c.close()


# The entry point: a small Gluon (or PyTorch) model trained on the channel's rows; it writes what
# it saw (SEEN), and rank 0 the model.
HEAD = r'''
import argparse, json, os
{imports}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--lr", type=float)
args = parser.parse_args()
hvd.init()
data = os.environ["SM_CHANNEL_DATA"]
rows = [list(map(float, line.split(","))) for line in open(os.path.join(data, "train.csv"))]
'''
SEEN = r'''
seen = {"rank": hvd.rank(), "files": sorted(os.path.relpath(os.path.join(d, f), data)
                                            for d, _, fs in os.walk(data) for f in fs),
        "labels": open(os.path.join(data, "sub", "labels.txt")).read(),
        "nccl_debug": os.environ.get("NCCL_DEBUG"), "host": os.environ["SM_CURRENT_HOST"],
        "hosts": json.loads(os.environ["SM_HOSTS"]), "hp_epochs": os.environ["SM_HP_EPOCHS"],
        "fusion": os.environ.get("HOROVOD_FUSION_THRESHOLD"), "args": vars(args)}
out = os.environ["SM_OUTPUT_DATA_DIR"]
with open(os.path.join(out, f"seen-{hvd.rank()}.json"), "w") as f:
    json.dump(seen, f)
'''
MXNET_ENTRY = HEAD.format(imports="import mxnet as mx\nimport ringmaster.mxnet as hvd") + r'''
net = mx.gluon.nn.Dense(1)
net.initialize()
net(mx.nd.array(rows))
hvd.broadcast_parameters(net.collect_params(), root_rank=0)
trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": args.lr})
x = mx.nd.array(rows)
for _ in range(args.epochs):
    with mx.autograd.record():
        loss = (net(x) - 1).square().mean()
    loss.backward()
    trainer.step(1)
mx.nd.waitall()
''' + SEEN + r'''
if hvd.rank() == 0:
    net.save_parameters(os.path.join(os.environ["SM_MODEL_DIR"], "model.params"))
print("trained", hvd.rank(), flush=True)
'''
PYTORCH_ENTRY = HEAD.format(imports="import torch\nimport ringmaster.torch as hvd") + r'''
x = torch.tensor(rows)
net = torch.nn.Linear(2, 1)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr),
                               named_parameters=net.named_parameters())
for _ in range(args.epochs):
    opt.zero_grad()
    loss = (net(x) - 1).square().mean()
    loss.backward()
    opt.step()
''' + SEEN + r'''
if hvd.rank() == 0:
    torch.save(net.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
print("trained", hvd.rank(), flush=True)
'''

# The notebook's cell, its import line the only change (the role and bucket are the notebook's
# variables; the instance type is a CPU one, as the workers here are CPU slots).
CELL = '''
{import_line}
role = "arn:aws:iam::123456789012:role/SageMakerRole"
bucket_name = "bucket"
hyperparameters = {{"epochs": 3, "lr": 0.05}}
distributions = {{"mpi": {{"enabled": True, "processes_per_host": 1,
                          "custom_mpi_options": "-verbose --NCCL_DEBUG=INFO {knobs}"}}}}
estimator = {cls}(entry_point="train_entry.py", source_dir="./source", role=role,
                  train_instance_type="ml.c5.xlarge", train_instance_count=2,
                  framework_version="{version}", train_volume_size=100, py_version="py3",
                  hyperparameters=hyperparameters, distributions=distributions,
                  output_path="s3://" + bucket_name + "/out")
estimator.fit({{"data": "s3://" + bucket_name + "/data"}})
print("MODEL_DATA", estimator.model_data)
print("JOB", estimator.latest_training_job.id)
'''


def run_cell(tmp_path, s3, cluster, python, import_line, cls, version, entry):
    work = tmp_path / "notebook"
    (work / "source").mkdir(parents=True)
    (work / "source" / "train_entry.py").write_text(entry)
    (work / "cell.py").write_text(CELL.format(import_line=import_line, cls=cls, version=version,
                                              knobs=KNOBS))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({k: v for k, v in s3.items() if k != "client"})
    env.update(RINGMASTER_COORDINATOR=cluster.address, PYTHONPATH=str(BUILD_PYTHON))
    started = time.monotonic()
    r = subprocess.run([str(python), "cell.py"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return r, time.monotonic() - started


def check_the_run(r, s3, model_name, version_line):
    out = r.stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines()
                 if line.startswith(("MODEL_DATA ", "JOB ")))
    prefix = lines["MODEL_DATA"].rsplit("/", 1)[0]
    assert lines["MODEL_DATA"].startswith("s3://bucket/out/") and prefix.endswith("/output")
    job_name = prefix[len("s3://bucket/out/"):-len("/output")]
    assert job_name.startswith(("mxnet-training-", "pytorch-training-")), job_name
    assert "[0] trained 0" in out and "[1] trained 1" in out, out
    # Said once, by rank 0, in the job's output; and the arguments without effect, once.
    assert out.count(f"ringmaster.sagemaker: {version_line}") == 1, out
    assert f"[0] ringmaster-notice: ringmaster.sagemaker: {version_line}" in out, out
    assert r.stderr.count("no effect on Ringmaster") == 1, r.stderr
    client = s3["client"]
    key = f"out/{job_name}/output"
    model = read_tar(client.get_object(Bucket="bucket", Key=f"{key}/model.tar.gz")["Body"].read())
    assert list(model) == [model_name]
    output = read_tar(client.get_object(Bucket="bucket", Key=f"{key}/output.tar.gz")["Body"].read())
    assert {"timeline.json", "autotune_log.csv", "seen-0.json", "seen-1.json"} <= set(output)
    assert json.loads(output["timeline.json"].rstrip().rstrip(",") + "]"
                      if not output["timeline.json"].rstrip().endswith("]")
                      else output["timeline.json"])
    assert output["autotune_log.csv"].splitlines()[0] == (  # Horovod's columns
        "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,"
        "tensor_fusion_threshold,score"), output["autotune_log.csv"][:200]
    for rank in (0, 1):
        seen = json.loads(output[f"seen-{rank}.json"])
        assert seen["rank"] == rank
        assert seen["files"] == ["sub/labels.txt", "train.csv"]
        assert seen["labels"] == "a b c\n"
        assert seen["nccl_debug"] == "INFO"
        assert seen["hosts"] == ["algo-1", "algo-2"]
        assert seen["host"] == f"algo-{rank + 1}"
        assert seen["hp_epochs"] == "3"
        assert seen["fusion"] is None or seen["fusion"] == "33554432"
        assert seen["args"] == {"epochs": 3, "lr": 0.05}
    return job_name


def events_of(cluster, r):
    job = cluster.job(cluster.coord, r.stdout.split("JOB ")[1].split()[0])
    return job, [e["message"] for e in job.get("events", [])]


@s3_missing
@pytest.mark.skipif(not MXNET_PYTHON.exists(),
                    reason=f"no MXNet environment at {MXNET_PYTHON} (scripts/mxnet-venv.sh)")
def test_the_mxnet_notebook_cell_runs_with_only_its_import_changed(tmp_path, s3, cluster):
    r, _ = run_cell(tmp_path, s3, cluster, MXNET_PYTHON,
                    "from ringmaster.sagemaker.mxnet import MXNet", "MXNet", "1.6.0", MXNET_ENTRY)
    check_the_run(r, s3, "model.params", "framework_version 1.6.0 asked; the ranks have MXNet "
                  "1.9.1, which runs it (same major version)")
    # Said once in the job's events.
    job, events = events_of(cluster, r)
    assert events.count("rank 0: ringmaster.sagemaker: framework_version 1.6.0 asked; the ranks "
                        "have MXNet 1.9.1, which runs it (same major version)") == 1, events
    # The knobs took effect: the job ran with them.
    knobs = job["spec"]["knobs"]
    assert (knobs["autotune"], knobs["timeline"], knobs["autotune_log"], knobs["cycle_time_ms"],
            int(knobs["fusion_threshold_bytes"])) == (True, "timeline.json", "autotune_log.csv",
                                                      5, 33554432)


@s3_missing
def test_the_pytorch_notebook_cell_runs_with_only_its_import_changed(tmp_path, s3, cluster):
    import torch
    version = torch.__version__.split("+")[0]
    major_minor = ".".join(version.split(".")[:2])
    asked = f"{version.split('.')[0]}.0.0"  # the ranks' major version, another minor
    assert major_minor != asked[:len(major_minor)]
    r, _ = run_cell(tmp_path, s3, cluster, "/usr/bin/python3",
                    "from ringmaster.sagemaker.pytorch import PyTorch", "PyTorch", asked,
                    PYTORCH_ENTRY)
    check_the_run(r, s3, "model.pt", f"framework_version {asked} asked; the ranks have PyTorch "
                  f"{version}, which runs it (same major version)")


@s3_missing
@pytest.mark.parametrize("problem", ["missing bucket", "no credentials", "empty prefix",
                                     "denied key"])
def test_fit_fails_before_any_job_exists_naming_the_uri(tmp_path, cluster, problem, request):
    s3 = request.getfixturevalue("s3_enforcing" if problem == "denied key" else "s3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({k: v for k, v in s3.items() if k != "client"})
    uri = "s3://nobucket/data" if problem == "missing bucket" else (
        "s3://bucket/nothing-here" if problem == "empty prefix" else "s3://bucket/data")
    if problem == "no credentials":
        env.pop("AWS_ACCESS_KEY_ID")
        env.pop("AWS_SECRET_ACCESS_KEY")
    script = textwrap.dedent(f'''
        from ringmaster.sagemaker.pytorch import PyTorch
        e = PyTorch(entry_point="train.py", source_dir=".", instance_type="ml.c5.xlarge",
                    instance_count=1)
        try:
            e.fit({{"data": "{uri}"}})
        except ValueError as err:
            print("REFUSED", err)
    ''')
    (tmp_path / "train.py").write_text("print('never')\n")
    env.update(RINGMASTER_COORDINATOR=cluster.address, PYTHONPATH=str(BUILD_PYTHON))
    r = subprocess.run(["/usr/bin/python3", "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    expected = {
        "missing bucket": "REFUSED s3://nobucket/data: the bucket 'nobucket' does not exist",
        "no credentials": "REFUSED s3://bucket/data: no AWS credentials found (the standard chain: "
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, "
                          "AWS_PROFILE, an instance role)",
        "empty prefix": "REFUSED s3://bucket/nothing-here: no objects under this prefix",
        "denied key": "REFUSED s3://bucket/data: access denied (InvalidAccessKeyId): the "
                      "credentials may not read or write it",
    }[problem]
    assert r.stdout.strip() == expected, r.stdout + r.stderr
    jobs = cluster.cli(cluster.coord, "jobs", "--json")
    assert jobs.returncode == 0 and json.loads(jobs.stdout).get("jobs", []) == [], jobs.stdout


def test_a_job_past_its_time_limit_is_stopped_and_fails_saying_so(tmp_path, cluster):
    (tmp_path / "slow.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    from ringmaster import Estimator, JobFailedError
    estimator = Estimator(entry_point=str(tmp_path / "slow.py"), instance_count=1, max_run=2,
                          coordinator=cluster.address, interpreter="/usr/bin/python3")
    started = time.monotonic()
    with pytest.raises(JobFailedError) as e:
        estimator.fit(logs=False, timeout=60)
    took = time.monotonic() - started
    assert e.value.job.state == "FAILED"
    assert e.value.job.reason.startswith(
        "the job ran past its time limit of 2 s (max_run_seconds, SageMaker's max_run) and was "
        "stopped"), e.value.job.reason
    assert took < 20, took


def test_another_major_framework_version_fails_the_job_at_start_naming_both(tmp_path, cluster):
    import torch
    version = torch.__version__.split("+")[0]
    asked = f"{int(version.split('.')[0]) + 1}.0.0"
    (tmp_path / "train.py").write_text("print('never here', flush=True)\n")
    from ringmaster import JobFailedError
    estimator = PyTorch(entry_point=str(tmp_path / "train.py"), instance_type="ml.c5.xlarge",
                        instance_count=1, framework_version=asked, py_version="py3",
                        coordinator=cluster.address, interpreter="/usr/bin/python3")
    with pytest.raises(JobFailedError) as e:
        estimator.fit(str(tmp_path), logs=False, timeout=60)
    reason = e.value.job.reason
    assert "exited with status 1" in reason, reason
    assert (f"ringmaster.sagemaker: framework_version {asked} asks for PyTorch {asked}, but the "
            f"ranks have PyTorch {version} (another major version): give framework_version="
            f"'{version}' or run workers with PyTorch {asked}") in reason, reason
    assert "never here" not in reason


def test_submit_max_run_stops_the_job(tmp_path, cluster):
    r = cluster.cli(cluster.coord, "submit", "--np", "1", "--max-run", "1", "--name", "slow", "--",
                    "/bin/sleep", "60")
    assert r.returncode == 0, r.stderr
    job_id = next(w for w in r.stdout.replace("\n", " ").split() if w.startswith("job-"))
    done = cluster.wait_state(cluster.coord, job_id, {"JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED",
                                                      "JOB_STATE_CANCELLED"}, 30)
    assert done["state"] == "JOB_STATE_FAILED"
    assert done["reason"] == ("the job ran past its time limit of 1 s (max_run_seconds, "
                              "SageMaker's max_run) and was stopped"), done["reason"]
    assert done["spec"]["max_run_seconds"] == 1
    bad = cluster.cli(cluster.coord, "submit", "--np", "1", "--max-run", "9999999", "--",
                      "/bin/true")
    assert bad.returncode != 0
    assert "spec.max_run_seconds = 9999999 is out of bounds [0, 2592000]" in bad.stderr, bad.stderr


def test_a_gpu_instance_type_waits_for_gpu_slots_naming_them(tmp_path, cluster):
    (tmp_path / "train.py").write_text("print('never here', flush=True)\n")
    estimator = PyTorch(entry_point=str(tmp_path / "train.py"), instance_type="ml.p3.2xlarge",
                        instance_count=1, coordinator=cluster.address,
                        interpreter="/usr/bin/python3")
    job = estimator.fit(wait=False)
    try:
        waiting = wait_for(lambda: (lambda j: j if j.get("waiting_reason") else None)(
            cluster.job(cluster.coord, job.id)), 20, "the waiting reason")
        assert waiting["state"] == "JOB_STATE_PENDING"
        assert waiting["waiting_reason"] == ("needs 1 idle gpu slot (at most 1 per host); 2 "
                                             "registered, 0 idle")
    finally:
        job.cancel("test over")


def test_a_file_channel_and_a_script_writing_opt_ml_model_directly(tmp_path, cluster):
    """file:// channels keep working; what a script writes to /opt/ml/model itself comes back
    with the model where the rank may write there."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.txt").write_text("7\n")
    marker = f"direct-{os.getpid()}-{time.monotonic_ns()}.txt"
    (tmp_path / "train.py").write_text(textwrap.dedent(f'''
        import os
        rows = open(os.path.join(os.environ["SM_CHANNEL_DATA"], "rows.txt")).read()
        os.makedirs("/opt/ml/model", exist_ok=True)
        with open("/opt/ml/model/{marker}", "w") as f:
            f.write("rows " + rows)
    '''))
    if not container._opt_ml_model_writable():
        pytest.skip("/opt/ml/model is not writable by this user (CI runs as root)")
    estimator = PyTorch(entry_point=str(tmp_path / "train.py"), instance_type="ml.c5.xlarge",
                        instance_count=1, coordinator=cluster.address,
                        interpreter="/usr/bin/python3", output_path=str(tmp_path / "out"))
    try:
        estimator.fit({"data": f"file://{data}"}, logs=False, timeout=60)
        assert (tmp_path / "out" / "rank-0" / "model" / marker).read_text() == "rows 7\n"
    finally:
        if os.path.exists(f"/opt/ml/model/{marker}"):
            os.remove(f"/opt/ml/model/{marker}")
