"""Jobs from Python: a client of the coordinator's JobService (proto/ringmaster/v1), over the
ringmaster.v1 stubs built and shipped with this package.

    from ringmaster.jobs import Client
    client = Client("coordinator.example.com:50051", tls={"ca": "ca.crt"}, token="...")
    job = client.submit(["python3", "train.py"], np=4, processes_per_host=2)
    for chunk in client.logs(job.id, follow=True):
        print(f"[{chunk.rank}] {chunk.text}", end="")
    print(client.wait(job.id).state)        # "SUCCEEDED", "FAILED" or "CANCELLED"

Defaults come from the environment as for the `ringmaster` command: RINGMASTER_COORDINATOR (else
localhost:50051; several replicas' addresses, comma-separated, are asked in turn for the leader),
RINGMASTER_TOKEN, RINGMASTER_TLS_CA / RINGMASTER_TLS_CERT / RINGMASTER_TLS_KEY. Errors the coordinator
returns are raised as RingmasterError, keeping its status code and message.
"""
import dataclasses
import os
import tarfile
import tempfile
import time

import grpc

try:
    from ringmaster.v1 import common_pb2, job_pb2, job_pb2_grpc
except ImportError as e:  # a build without grpc_python_plugin
    raise ImportError(f"ringmaster.jobs needs the ringmaster.v1 stubs built with the package "
                      f"(Debian's protobuf-compiler-grpc provides grpc_python_plugin): {e}") from e

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

# The coordinator's default bound on a job's code archive (its --max-source-bytes).
DEFAULT_MAX_SOURCE_BYTES = 64 << 20
_CHUNK = 1 << 20
# Packed on disk up to this much before the coordinator's own limit is even asked.
_MAX_PACKED_BYTES = 1 << 30


class RingmasterError(Exception):
    """A call the coordinator refused or could not answer: `code` is the gRPC status code's name
    ("PERMISSION_DENIED", "NOT_FOUND", "UNAVAILABLE", ...), `message` the coordinator's words."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass
class Rank:
    rank: int
    host: str
    worker_id: str
    device: str
    state: str  # "ASSIGNED", "STARTED", "EXITED", "STOPPED"
    exit_code: int


@dataclasses.dataclass
class Job:
    id: str
    name: str
    state: str  # "PENDING", "STARTING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"
    reason: str
    np: int
    owner: str
    ranks: list
    events: list  # the job's event messages, oldest first
    proto: object = dataclasses.field(repr=False)  # the ringmaster.v1.Job as received

    @property
    def done(self):
        return self.state in TERMINAL


@dataclasses.dataclass
class LogChunk:
    rank: int
    stream: str  # "stdout" or "stderr"
    text: str
    time_unix_ms: int


def _state(enum_type, value, prefix):
    return enum_type.Name(value)[len(prefix):]


def _job(j):
    return Job(id=j.id, name=j.spec.name, state=_state(job_pb2.JobState, j.state, "JOB_STATE_"),
               reason=j.reason, np=j.spec.np, owner=j.owner,
               ranks=[Rank(rank=r.rank, host=r.host, worker_id=r.worker_id, device=r.device,
                           state=_state(job_pb2.RankState, r.state, "RANK_STATE_"),
                           exit_code=r.exit_code) for r in j.ranks],
               events=[e.message for e in j.events], proto=j)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def pack_source(path, out):
    """Packs `path` (a directory's contents, or one file) as a tar.gz archive into the binary file
    object `out`, symbolic links as links, sockets and devices left out. ValueError for a path that
    does not exist or an archive past 1 GiB."""
    if not os.path.exists(path):
        raise ValueError(f"source {path} does not exist")

    def keep(info):
        return info if (info.isfile() or info.isdir() or info.issym() or info.islnk()) else None

    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        if os.path.isdir(path):
            for entry in sorted(os.listdir(path)):
                tar.add(os.path.join(path, entry), arcname=entry, filter=keep)
        else:
            tar.add(path, arcname=os.path.basename(path), filter=keep)
    if out.tell() > _MAX_PACKED_BYTES:
        raise ValueError(f"source {path} packs to {out.tell()} bytes, more than 1 GiB")


class _Packed:
    """A source packed into a temporary file, read back in chunks for SubmitJob."""

    def __init__(self, path):
        self.file = tempfile.TemporaryFile()
        pack_source(path, self.file)
        self.size = self.file.tell()

    def chunks(self):
        self.file.seek(0)
        while True:
            data = self.file.read(_CHUNK)
            if not data:
                return
            yield data

    def close(self):
        self.file.close()


class Client:
    """A connection to the coordinator. `tls`: None takes RINGMASTER_TLS_* from the environment
    (plaintext when unset), False is plaintext, or a dict of file paths {"ca": ..., "cert": ...,
    "key": ...} (cert and key: a user certificate instead of a token). `token`: a bearer token from
    the coordinator's --token-file (default RINGMASTER_TOKEN). `timeout`: seconds per call."""

    def __init__(self, address=None, tls=None, token=None, timeout=10.0):
        address = address or os.environ.get("RINGMASTER_COORDINATOR") or "localhost:50051"
        self.token = token if token is not None else os.environ.get("RINGMASTER_TOKEN") or None
        self.timeout = timeout
        if tls is None:
            tls = {k: os.environ[f"RINGMASTER_TLS_{k.upper()}"] for k in ("ca", "cert", "key")
                   if os.environ.get(f"RINGMASTER_TLS_{k.upper()}")} or False
        self._credentials = None
        if tls:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls["ca"]) if tls.get("ca") else None,
                private_key=_read(tls["key"]) if tls.get("key") else None,
                certificate_chain=_read(tls["cert"]) if tls.get("cert") else None)
        addresses = [a.strip() for a in address.split(",") if a.strip()]
        if not addresses:
            raise ValueError(f"coordinator address '{address}' names no HOST:PORT")
        self.address = addresses[0] if len(addresses) == 1 else self._leader(addresses)
        self._channel = self._open(self.address)
        self._stub = job_pb2_grpc.JobServiceStub(self._channel)

    def _open(self, address):
        if self._credentials is not None:
            return grpc.secure_channel(address, self._credentials)
        return grpc.insecure_channel(address)

    def _leader(self, addresses):
        # A follower replica refuses every call UNAVAILABLE, naming the leader in a trailer.
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            for address in list(addresses):
                with self._open(address) as channel:
                    try:
                        job_pb2_grpc.JobServiceStub(channel).ListJobs(
                            job_pb2.ListJobsRequest(page_size=1), timeout=2,
                            metadata=self._metadata())
                        return address
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                            grpc.StatusCode.DEADLINE_EXCEEDED):
                            return address
                        leader = dict(e.trailing_metadata() or ()).get("x-ringmaster-leader")
                        if leader and leader not in addresses:
                            addresses.append(leader)
            time.sleep(0.2)
        return addresses[0]

    def _metadata(self):
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _call(self, method, request, timeout=True):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout else None, metadata=self._metadata())
        except grpc.RpcError as e:
            raise RingmasterError(e.code().name, e.details()) from None

    def _stream(self, method, request):
        try:
            yield from getattr(self._stub, method)(request, metadata=self._metadata())
        except grpc.RpcError as e:
            raise RingmasterError(e.code().name, e.details()) from None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def submit(self, command, np=None, processes_per_host=0, name="", env=None, working_dir="",
               labels=None, fusion_threshold_mb=None, cycle_time_ms=None, cache_capacity=None,
               autotune=False, autotune_log="", timeline="", timeline_mark_cycles=False,
               source_dir=None, attached=False, min_np=0, max_np=0, reset_limit=0,
               elastic_timeout=0, **knobs):
        """Registers a job running `command` (a list of arguments) as `np` ranks (default 1);
        returns it. `min_np`/`max_np` make it elastic (docs/elastic.md): it runs with as many ranks
        as fit in [min_np, max_np] (np then defaults to max_np), with `reset_limit` new epochs at
        most (0: no limit) and `elastic_timeout` seconds below min_np at most (0: 600).
        `attached=True` (with an empty command): the ranks are training processes started
        elsewhere that attach to their hosts' workers with RINGMASTER_ATTACH_JOB=`name` and
        RINGMASTER_ATTACH_RANK (or JOB_COMPLETION_INDEX), as `ringmaster submit --attached`.
        `name` defaults to the command's base name, as `ringmaster submit` names it. The knobs are
        Horovod's, with its defaults when left None (docs/configuration.md); any other field of
        ringmaster.v1.Knobs may be given by name (e.g. stall_check_seconds=0, backend="gloo").
        `source_dir`: a directory (or one file) shipped with the job as a tar.gz archive; each rank
        runs `command` in its own unpacked copy (at most the coordinator's --max-source-bytes,
        default 64 MiB: a larger one is refused with INVALID_ARGUMENT naming the limit)."""
        command = [str(c) for c in command]
        if not name:
            name = (os.path.basename(command[0]) if command else "") or "job"
        if np is None:
            np = 0 if (min_np or max_np) else 1
        spec = job_pb2.JobSpec(name=name[:128], np=np, processes_per_host=processes_per_host,
                               command=command, env=dict(env or {}),
                               working_dir=working_dir, labels=dict(labels or {}),
                               attached=attached, min_np=min_np, max_np=max_np,
                               reset_limit=reset_limit,
                               elastic_timeout_seconds=int(elastic_timeout))
        k = spec.knobs
        if fusion_threshold_mb is not None:
            k.fusion_threshold_bytes = int(fusion_threshold_mb * (1 << 20))
        if cycle_time_ms is not None:
            k.cycle_time_ms = cycle_time_ms
        if cache_capacity is not None:
            k.cache_capacity = cache_capacity
        k.autotune = autotune
        k.autotune_log = autotune_log
        k.timeline = timeline
        k.timeline_mark_cycles = timeline_mark_cycles
        set_knobs(k, knobs)
        return self.submit_spec(spec, source_dir=source_dir)

    def submit_spec(self, spec, source_dir=None):
        """Registers the job a ringmaster.v1.JobSpec describes, with `source_dir` (see submit)."""
        if source_dir is None:
            return _job(self._call("RegisterJob", job_pb2.RegisterJobRequest(spec=spec)).job)
        packed = _Packed(source_dir)
        try:
            def requests():
                yield job_pb2.SubmitJobRequest(spec=spec)
                for data in packed.chunks():
                    yield job_pb2.SubmitJobRequest(source_chunk=data)
            try:
                # Long enough for the archive on a slow link (at least 1 MB/s), bounded all the same.
                reply = self._stub.SubmitJob(requests(), timeout=self.timeout + packed.size / 1e6,
                                             metadata=self._metadata())
            except grpc.RpcError as e:
                raise RingmasterError(e.code().name, e.details()) from None
            return _job(reply.job)
        finally:
            packed.close()

    def get(self, job_id):
        return _job(self._call("GetJob", job_pb2.GetJobRequest(job_id=job_id)).job)

    def list(self, states=()):
        """Every job the caller may see (its own; an admin every job), newest first, all pages.
        `states`: names such as "RUNNING" to keep only those."""
        request = job_pb2.ListJobsRequest(
            states=[job_pb2.JobState.Value(f"JOB_STATE_{s}") for s in states])
        jobs = []
        while True:
            page = self._call("ListJobs", request)
            jobs += [_job(j) for j in page.jobs]
            if not page.next_page_token:
                return jobs
            request.page_token = page.next_page_token

    def cancel(self, job_id, reason=""):
        return _job(self._call("CancelJob",
                               job_pb2.CancelJobRequest(job_id=job_id, reason=reason)).job)

    def watch(self, job_id):
        """The job now, then after each of its events, until it ends."""
        for r in self._stream("WatchJob", job_pb2.WatchJobRequest(job_id=job_id)):
            yield _job(r.job)

    def wait(self, job_id, timeout=None):
        """The job once it has ended; TimeoutError after `timeout` seconds (None: no limit)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.done:
                return job
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            time.sleep(0.2)

    def logs(self, job_id, follow=False, rank=None):
        """The ranks' output kept so far (the last 4 MiB of each), and with `follow` new output
        until the job ends, as LogChunks."""
        request = job_pb2.GetLogsRequest(job_id=job_id, follow=follow,
                                         rank=-1 if rank is None else rank, all_ranks=rank is None)
        for r in self._stream("GetLogs", request):
            for c in r.chunks:
                yield LogChunk(rank=c.rank, stream="stderr" if c.stream == 2 else "stdout",
                               text=c.data.decode(errors="replace"), time_unix_ms=c.time_unix_ms)

    def artifacts(self, job_id):
        """The job's artifacts as (name, size in bytes): its timeline, its autotune log, and each
        rank's output files as "rank-<rank>/<path>"."""
        listed = self._call("ListArtifacts", job_pb2.ListArtifactsRequest(job_id=job_id))
        return [(a.name, a.size_bytes) for a in listed.artifacts]

    def download(self, job_id, directory):
        """Writes every artifact of the job into `directory` (a rank's files under rank-<rank>/);
        returns their paths."""
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, _ in self.artifacts(job_id):
            parts = name.split("/")
            # Names come from the server: none may write outside `directory`.
            if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise RingmasterError("INTERNAL", f"the coordinator listed a bad artifact '{name}'")
            path = os.path.join(directory, *parts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part = path + ".part"
            with open(part, "wb") as f:
                for r in self._stream("GetArtifact",
                                      job_pb2.GetArtifactRequest(job_id=job_id, name=name)):
                    f.write(r.data)
            os.replace(part, path)
            paths.append(path)
        return paths


def set_knobs(knobs, values):
    """Sets fields of the ringmaster.v1.Knobs `knobs` from the dict `values` (field name: value);
    backend as "auto", "gloo" or "nccl". ValueError names a field Knobs does not have."""
    fields = knobs.DESCRIPTOR.fields_by_name
    for key, value in values.items():
        if key not in fields:
            raise ValueError(f"'{key}' is not a Ringmaster knob; knobs are: "
                             f"{', '.join(sorted(fields))}")
        if key == "backend":
            if isinstance(value, str):
                value = common_pb2.Backend.Value(f"BACKEND_{value.upper()}")
            knobs.backend = value
        elif key == "autotune_fixed":
            knobs.autotune_fixed[:] = list(value)
        else:
            setattr(knobs, key, value)
