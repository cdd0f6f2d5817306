"""ringmaster.Estimator and code shipped with jobs, against a real coordinator and worker daemons
on loopback: the small CNN example trained from a source directory with autotune and the timeline
on, its model and the job's artifacts downloaded into output_path; a failing entry point raising
with its reason and exit status; an oversized source directory refused naming the limit; the
SageMaker distribution form mapped to the same job spec as Ringmaster's; `ringmaster submit
--source-dir --hyperparameter --channel` and `ringmaster artifacts` from the command line.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_estimator.py
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import RM, Cluster, wait_for  # noqa: E402

from ringmaster import Estimator, JobFailedError  # noqa: E402
from ringmaster.jobs import Client, RingmasterError  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

# The job's view of its directories and arguments, written where its files come back.
PROBE = r'''
import json, os, sys
out = os.environ["RINGMASTER_OUTPUT_DIR"]
rank = os.environ["RINGMASTER_RANK"]
os.makedirs(os.path.join(out, "sub"), exist_ok=True)
with open(os.path.join(out, "sub", "seen.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(),
               "code_dir": os.environ.get("RINGMASTER_CODE_DIR"),
               "sm_output": os.environ.get("SM_OUTPUT_DATA_DIR") == out,
               "train": os.environ.get("RINGMASTER_CHANNEL_TRAIN"),
               "sm_train": os.environ.get("SM_CHANNEL_TRAIN"),
               "helper": open("pkg/helper.txt").read(),
               "rank": rank}, f)
print("probe rank", rank, "done", flush=True)
'''


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def start(cluster, workers=2, *extra):
    coordinator = cluster.coordinator(*extra)
    for _ in range(workers):
        cluster.worker(coordinator, host="h0")
    wait_for(lambda: len(cluster.idle_workers(coordinator)) == workers, 20, "the workers")
    return coordinator


def test_an_estimator_trains_the_cnn_from_its_source_dir_and_its_output_comes_back(
        cluster, tmp_path, capsys):
    coordinator = start(cluster)
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(EXAMPLES / "pytorch_train_cnn.py", source / "train.py")
    out = tmp_path / "out"
    estimator = Estimator(
        entry_point="train.py", source_dir=str(source), instance_count=1, processes_per_host=2,
        hyperparameters={"epochs": 1, "samples": 256, "batch-size": 32},
        distribution={"ringmaster": {"autotune": True, "autotune_log": "autotune.csv",
                                     "autotune_warmup_samples": 0,
                                     "autotune_steps_per_sample": 1,
                                     "timeline": "timeline.json"}},
        output_path=str(out), coordinator=coordinator.address)
    job = estimator.fit(timeout=240)
    assert job.get().state == "SUCCEEDED"
    assert job.job.reason == "all 2 ranks exited 0"
    # Logs streamed to the caller, each line prefixed by its rank.
    printed = capsys.readouterr().out
    assert re.search(r"^\[0\] epoch 1: loss \d+\.\d{4} accuracy \d\.\d{3}$", printed, re.M), printed
    assert re.search(r"^\[0\] saved .*/output/model\.pt$", printed, re.M), printed
    # What the script wrote to its output directory, the timeline and the autotune log.
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["autotune.csv", "rank-0/model.pt", "timeline.json"], files
    import torch
    state = torch.load(out / "rank-0" / "model.pt")
    assert sorted(state) == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight",
                             "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert list(state["fc2.weight"].shape) == [4, 32]
    assert json.loads((out / "timeline.json").read_text())  # Chrome trace JSON
    assert (out / "autotune.csv").read_text().splitlines()[0] == (
        "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,"
        "tensor_fusion_threshold,score")
    spec = job.job.proto.spec
    assert spec.np == 2 and spec.processes_per_host == 2
    assert list(spec.command[1:]) == ["train.py", "--epochs", "1", "--samples", "256",
                                      "--batch-size", "32"]
    assert spec.source.files == 1 and len(spec.source.sha256) == 64
    assert spec.source.unpacked_bytes == (source / "train.py").stat().st_size
    # The ranks' copies of the code are gone with the job.
    wait_for(lambda: not list(tmp_path.glob("ringmaster-ranks-*/*")), 10, "the ranks' dirs")


def test_each_rank_runs_in_its_unpacked_code_with_its_arguments_channels_and_output(
        cluster, tmp_path):
    coordinator = start(cluster)
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "probe.py").write_text(PROBE)
    (source / "pkg" / "helper.txt").write_text("shipped")
    os.symlink("pkg/helper.txt", source / "link.txt")  # a link inside the tree travels
    out = tmp_path / "out"
    estimator = Estimator(entry_point="probe.py", source_dir=str(source), processes_per_host=2,
                          hyperparameters={"lr": 0.5, "name": "x y", "flag": True},
                          output_path=str(out), coordinator=coordinator.address)
    job = estimator.fit({"train": "/data/train"}, wait=False)  # a handle at once
    assert job.id == estimator.latest_training_job.id
    assert job.wait(logs=False, timeout=60).state == "SUCCEEDED"
    for rank in (0, 1):
        seen = json.loads((out / f"rank-{rank}" / "sub" / "seen.json").read_text())
        assert seen["argv"] == ["--lr", "0.5", "--name", "x y", "--flag", "true"]
        assert seen["cwd"] == seen["code_dir"] and seen["cwd"].endswith("/code")
        assert seen["helper"] == "shipped" and seen["sm_output"] is True
        assert (seen["train"], seen["sm_train"]) == ("/data/train", "/data/train")
        assert seen["rank"] == str(rank)
    assert set(job.job.proto.spec.env.values()) == {"<redacted>"}  # replies hide the values
    env = estimator.job_spec({"train": "/data/train"}).env
    assert json.loads(env["SM_CHANNELS"]) == ["train"]
    assert json.loads(env["SM_HPS"]) == {"flag": True, "lr": 0.5, "name": "x y"}
    # The rank files are listed beside the job's other artifacts, as the CLI fetches them too.
    assert sorted(n for n, _ in job.artifacts()) == ["rank-0/sub/seen.json",
                                                     "rank-1/sub/seen.json"]
    r = cluster.cli(coordinator, "artifacts", job.id, "--output", str(tmp_path / "cli"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "cli" / "rank-1" / "sub" / "seen.json").read_text())[
        "rank"] == "1"


def test_a_failing_entry_point_raises_with_its_reason_and_exit_status(cluster, tmp_path):
    coordinator = start(cluster, 1)
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    out = tmp_path / "out"
    estimator = Estimator(entry_point=str(script), output_path=str(out),
                          coordinator=coordinator.address)  # the entry point shipped alone
    with pytest.raises(JobFailedError) as e:
        estimator.fit(logs=False, timeout=60)
    assert e.value.code == "FAILED" and e.value.exit_codes == [3]
    assert e.value.job.state == "FAILED"
    assert "rank 0" in e.value.job.reason and "3" in e.value.job.reason
    assert "about to fail" in e.value.job.reason  # the rank's last words
    assert str(e.value).startswith(f"FAILED: job {e.value.job.id} (fail) FAILED: ")
    assert str(e.value).endswith("; rank 0 exit status 3")


def test_an_oversized_source_dir_is_refused_naming_the_limit(cluster, tmp_path):
    coordinator = start(cluster, 1, "--max-source-bytes", str(1 << 20))
    source = tmp_path / "big"
    source.mkdir()
    (source / "train.py").write_text("print('never')\n")
    (source / "data.bin").write_bytes(os.urandom(3 << 20))  # incompressible
    estimator = Estimator(entry_point="train.py", source_dir=str(source),
                          coordinator=coordinator.address)
    with pytest.raises(RingmasterError) as e:
        estimator.fit(timeout=30)
    assert e.value.code == "INVALID_ARGUMENT"
    assert e.value.message == (
        "the source archive is larger than the coordinator's limit of 1048576 bytes "
        "(--max-source-bytes): leave data and outputs out of the source directory")
    # Nothing registered, nothing left behind.
    assert Client(coordinator.address).list() == []
    sources = [p for p in tmp_path.rglob(".sources/*")]
    assert sources == [], sources


def test_output_past_the_per_rank_limit_is_dropped_and_the_job_still_succeeds(cluster, tmp_path):
    coordinator = start(cluster, 1, "--max-output-bytes", "1000")
    script = tmp_path / "write.py"
    script.write_text("import os\nd = os.environ['RINGMASTER_OUTPUT_DIR']\n"
                      "open(os.path.join(d, 'a.bin'), 'wb').write(b'a' * 600)\n"
                      "open(os.path.join(d, 'b.bin'), 'wb').write(b'b' * 600)\n")
    estimator = Estimator(entry_point=str(script), coordinator=coordinator.address)
    job = estimator.fit(logs=False, timeout=60)
    assert job.job.state == "SUCCEEDED"
    # Files go in name order; the one that crossed the limit is not kept.
    assert job.artifacts() == [("rank-0/a.bin", 600)]
    log = "\n".join(p.read_text() for p in tmp_path.glob("worker*.err"))
    assert "its output files were not all kept: RESOURCE_EXHAUSTED: the output of rank 0 of job " \
           f"{job.id} is larger than the coordinator's limit of 1000 bytes per rank " \
           "(--max-output-bytes); 'b.bin' and what follows it were not kept" in log, log


def test_an_archive_reaching_outside_its_directory_is_refused(cluster, tmp_path):
    coordinator = start(cluster, 0)
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('never')\n")
    os.symlink("/etc/passwd", source / "escape")
    with pytest.raises(RingmasterError) as e:
        Client(coordinator.address).submit(["python3", "train.py"], source_dir=str(source))
    assert e.value.code == "INVALID_ARGUMENT"
    assert e.value.message == ("source archive member 'escape' is a symbolic link to "
                               "'/etc/passwd', outside the archive")
    os.unlink(source / "escape")
    with pytest.raises(RingmasterError) as e:
        Client(coordinator.address).submit(["python3", "train.py"], source_dir=str(source),
                                           working_dir="/tmp")
    assert e.value.code == "INVALID_ARGUMENT" and e.value.message.startswith(
        "spec.working_dir must be empty for a job with a source archive")


def test_the_sagemaker_distribution_form_maps_to_the_native_spec(tmp_path):
    (tmp_path / "train.py").write_text("")
    common = dict(entry_point="train.py", source_dir=str(tmp_path), instance_count=2,
                  hyperparameters={"epochs": 3}, coordinator="127.0.0.1:1", inherit_env=False)
    sagemaker = Estimator(**common, distribution={"mpi": {
        "enabled": True, "processes_per_host": 8,
        "custom_mpi_options": "-x HOROVOD_FUSION_THRESHOLD=33554432 -x HOROVOD_CYCLE_TIME=5 "
                              "-x HOROVOD_TIMELINE=/opt/ml/output/timeline.json "
                              "-x HOROVOD_AUTOTUNE=1 -x HOROVOD_HIERARCHICAL_ALLREDUCE=0 "
                              "-x HOROVOD_HIERARCHICAL_ALLGATHER=1 -x NCCL_DEBUG=INFO "
                              "-x RINGMASTER_NEGOTIATION_RELAY=1 "
                              "-x RINGMASTER_NEGOTIATION_RELAY_HOSTS=4"}})
    native = Estimator(**common, environment={"NCCL_DEBUG": "INFO"}, distribution={
        "ringmaster": {"processes_per_host": 8, "fusion_threshold_bytes": 33554432,
                       "cycle_time_ms": 5.0, "timeline": "timeline.json", "autotune": True,
                       "hierarchical_allreduce": False, "hierarchical_allgather": True,
                       "negotiation_relay": True, "negotiation_relay_hosts": 4}})
    a, b = sagemaker.job_spec({"train": "/d"}), native.job_spec({"train": "/d"})
    assert a == b
    assert (a.np, a.processes_per_host) == (16, 8)
    assert (a.knobs.fusion_threshold_bytes, a.knobs.cycle_time_ms) == (33554432, 5.0)
    assert a.knobs.timeline == "timeline.json" and a.knobs.autotune
    assert a.knobs.HasField("hierarchical_allreduce") and not a.knobs.hierarchical_allreduce
    assert a.knobs.hierarchical_allgather
    assert a.knobs.negotiation_relay and a.knobs.negotiation_relay_hosts == 4
    assert dict(a.env) == {"NCCL_DEBUG": "INFO", "RINGMASTER_CHANNEL_TRAIN": "/d",
                           "SM_CHANNEL_TRAIN": "/d", "SM_CHANNELS": '["train"]',
                           "SM_HPS": '{"epochs": 3}'}
    assert list(a.command[1:]) == ["train.py", "--epochs", "3"]
    with pytest.raises(ValueError) as e:
        Estimator(**common, distribution={"mpi": {
            "enabled": True, "custom_mpi_options": "-x HOROVOD_MPI_THREADS_DISABLE=1"}})
    assert str(e.value).startswith("custom_mpi_options: HOROVOD_MPI_THREADS_DISABLE is not a "
                                   "Horovod knob Ringmaster supports; supported: ")
    with pytest.raises(ValueError) as e:
        Estimator(**common, distribution={"mpi": {"enabled": True,
                                                  "custom_mpi_options": "--bind-to none"}})
    assert str(e.value) == ("custom_mpi_options: '--bind-to' is an mpirun option Ringmaster has "
                            "no equivalent of; only -x NAME=VALUE, -x NAME and --NAME=VALUE (a "
                            "variable) are taken")
    with pytest.raises(ValueError) as e:
        Estimator(**common, distribution={"ringmaster": {"fusion_threshold": 1}})
    assert str(e.value).startswith("'fusion_threshold' is not a Ringmaster knob; knobs are: ")
    with pytest.raises(ValueError) as e:
        Estimator(**common, processes_per_host=2,
                  distribution={"mpi": {"enabled": True, "processes_per_host": 8}})
    assert str(e.value) == "processes_per_host = 2 but the distribution says 8"


def test_the_cli_submits_a_source_dir_with_hyperparameters_and_channels(cluster, tmp_path):
    coordinator = start(cluster, 1)
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "probe.py").write_text(PROBE)
    (source / "pkg" / "helper.txt").write_text("shipped")
    r = cluster.cli(coordinator, "--json", "submit", "--np", "1", "--source-dir", str(source),
                    "--hyperparameter", "lr=0.1", "--hyperparameter", "epochs=2",
                    "--channel", "train=/data/t", "--", "/usr/bin/python3", "probe.py",
                    cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    job = cluster.wait_state(coordinator, job_id, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], 60)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    r = cluster.cli(coordinator, "artifacts", job_id, "--output", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "a" / "rank-0" / "sub" / "seen.json").read_text())
    assert seen["argv"] == ["--lr", "0.1", "--epochs", "2"]
    assert seen["helper"] == "shipped" and seen["train"] == "/data/t"
    r = cluster.cli(coordinator, "submit", "--np", "1", "--source-dir", str(source),
                    "--working-dir", "/tmp", "--", "python3", "probe.py")
    assert r.returncode == 2 and "--source-dir and --working-dir exclude each other" in r.stderr
