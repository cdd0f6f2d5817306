// ringmaster._ringmaster: the C++ client (client/ringmaster/client.h) for Python, without torch's
// C++ headers. Tensors cross as (data pointer, dtype code, shape); the Python layer
// (ringmaster/torch) makes them contiguous CPU tensors and keeps them alive until their operation
// completes. Every failure is raised as StatusError(code, message) with the daemon's or the
// coordinator's message; the Python layer turns it into HorovodInternalError.
//
// Arena memory (Client::Allocate) comes back as an ArenaBuffer that keeps its client (and so the
// arena's mapping) alive and frees the memory when it is collected: on a CPU slot a writable Python
// buffer (wrap it with torch.frombuffer), on a GPU slot device memory with the CUDA array interface
// (wrap it with torch.as_tensor); either way the tensor owns it.
//
// Blocking calls (connect, wait, join, barrier, shutdown) release the GIL; waits wake every 100 ms
// to let Python deliver signals (Ctrl-C raises KeyboardInterrupt, the operation stays in flight).
#include "python/src/binding.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "ringmaster/client.h"

namespace py = pybind11;

namespace ringmaster {
namespace {

// A non-OK absl::Status on its way to Python (translated to _ringmaster.StatusError).
struct StatusException {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusException{status};
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

DataType CheckedDataType(int code) {
  if (code < 1 || code > kMaxDataType) {
    throw py::value_error(absl::StrCat("unknown ringmaster data type code ", code));
  }
  return static_cast<DataType>(code);
}

ReduceOp CheckedReduceOp(int code) {
  if (code < 1 || code > kMaxReduceOp) {
    throw py::value_error(absl::StrCat("unknown ringmaster reduce op code ", code));
  }
  return static_cast<ReduceOp>(code);
}

void* Pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

// Memory in the shared arena, returned to the client's allocator when the last Python reference
// (typically a torch tensor's storage) goes. Holding the client keeps the arena mapped.
class ArenaBuffer {
 public:
  ArenaBuffer(std::shared_ptr<Client> client, void* data, size_t bytes)
      : client_(std::move(client)), data_(data), bytes_(bytes) {}
  bool on_device() const { return client_->topology().device >= 0; }
  ~ArenaBuffer() { client_->Free(data_); }
  ArenaBuffer(const ArenaBuffer&) = delete;
  ArenaBuffer& operator=(const ArenaBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<Client> client_;
  void* data_;
  size_t bytes_;
};

// The result of an allgather: its shape (first dimension summed over ranks) and its bytes.
class GatheredBuffer {
 public:
  explicit GatheredBuffer(AllgatherOutput output) : output_(std::move(output)) {}
  const std::vector<int64_t>& shape() const { return output_.shape; }
  std::vector<uint8_t>& data() { return output_.data; }

 private:
  AllgatherOutput output_;
};

// The Python-facing client. Thread-safe as the C++ client is.
class PyClient {
 public:
  // Connects on a thread of its own while this one waits in 100 ms slices, so a signal handler
  // (Ctrl-C, a test runner's SIGALRM) runs during a long connect; a connect given up that way
  // ends on its own deadline and its client is closed.
  static std::unique_ptr<PyClient> Connect(const std::string& socket, double timeout_seconds,
                                           int64_t after_epoch) {
    struct Attempt {
      absl::Mutex mu;
      bool done ABSL_GUARDED_BY(mu) = false;
      absl::StatusOr<std::unique_ptr<Client>> client ABSL_GUARDED_BY(mu);
    };
    auto attempt = std::make_shared<Attempt>();
    std::thread([attempt, socket, timeout_seconds, after_epoch] {
      absl::StatusOr<std::unique_ptr<Client>> client =
          Client::Connect(socket, absl::Seconds(timeout_seconds), after_epoch);
      absl::MutexLock lock(&attempt->mu);
      attempt->client = std::move(client);
      attempt->done = true;
    }).detach();
    while (true) {
      {
        py::gil_scoped_release release;
        absl::MutexLock lock(&attempt->mu);
        auto done = [&attempt]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(attempt->mu) { return attempt->done; };
        if (attempt->mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100))) {
          absl::StatusOr<std::unique_ptr<Client>> client = std::move(attempt->client);
          attempt->client = absl::CancelledError("taken");
          return std::make_unique<PyClient>(
              std::shared_ptr<Client>(ValueOrThrow(std::move(client))));
        }
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  explicit PyClient(std::shared_ptr<Client> client) : client_(std::move(client)) {}

  const std::shared_ptr<Client>& shared() const { return client_; }

  const Topology& topology() const { return client_->topology(); }
  bool hosts_updated() const { return client_->hosts_updated(); }

  void SetCudaStream(uintptr_t stream) { client_->SetCudaStream(reinterpret_cast<void*>(stream)); }
  void SetProcessSet(int32_t id, std::vector<int32_t> ranks) {
    client_->SetProcessSet(id, std::move(ranks));
  }

  // An ArenaBuffer of `bytes`, or None when the arena is full.
  py::object Allocate(size_t bytes) {
    void* data = client_->Allocate(bytes == 0 ? 1 : bytes);
    if (data == nullptr) return py::none();
    return py::cast(std::make_unique<ArenaBuffer>(client_, data, bytes));
  }

  Handle Allreduce(const std::string& name, uintptr_t data, int dtype,
                   const std::vector<int64_t>& shape, int op, double prescale, double postscale) {
    py::gil_scoped_release release;
    return ValueOrThrow(client_->AllreduceAsync(name, Pointer(data), CheckedDataType(dtype), shape,
                                                CheckedReduceOp(op), prescale, postscale));
  }

  std::vector<Handle> GroupedAllreduce(const std::vector<std::string>& names,
                                       const std::vector<uintptr_t>& data, int dtype,
                                       const std::vector<std::vector<int64_t>>& shapes, int op,
                                       double prescale, double postscale) {
    std::vector<void*> pointers;
    pointers.reserve(data.size());
    for (uintptr_t d : data) pointers.push_back(Pointer(d));
    const DataType type = CheckedDataType(dtype);
    const ReduceOp reduce = CheckedReduceOp(op);
    py::gil_scoped_release release;
    return ValueOrThrow(
        client_->GroupedAllreduceAsync(names, pointers, type, shapes, reduce, prescale, postscale));
  }

  Handle Broadcast(const std::string& name, uintptr_t data, int dtype,
                   const std::vector<int64_t>& shape, int root) {
    py::gil_scoped_release release;
    return ValueOrThrow(
        client_->BroadcastAsync(name, Pointer(data), CheckedDataType(dtype), shape, root));
  }

  Handle Allgather(const std::string& name, uintptr_t data, int dtype,
                   const std::vector<int64_t>& shape) {
    py::gil_scoped_release release;
    return ValueOrThrow(
        client_->AllgatherAsync(name, Pointer(data), CheckedDataType(dtype), shape));
  }

  bool Poll(Handle handle) { return client_->Poll(handle); }

  // Waits for the operation (forever when timeout_seconds is None); raises its error. Waits in
  // 100 ms slices with the GIL released, running Python's signal handlers between them.
  void Wait(Handle handle, std::optional<double> timeout_seconds) {
    const absl::Time deadline = timeout_seconds.has_value()
                                    ? absl::Now() + absl::Seconds(*timeout_seconds)
                                    : absl::InfiniteFuture();
    WaitUntil(handle, deadline);
  }

  void WaitUntil(Handle handle, absl::Time deadline) {
    while (true) {
      absl::Status status;
      {
        py::gil_scoped_release release;
        const absl::Duration slice = std::min(absl::Milliseconds(100), deadline - absl::Now());
        status = client_->Wait(handle, std::max(slice, absl::ZeroDuration()));
      }
      if (status.code() != absl::StatusCode::kDeadlineExceeded) {
        ThrowIfError(status);
        return;
      }
      // DEADLINE_EXCEEDED is either the slice running out or the operation's own error (a
      // collective timeout). In the second case Wait() consumed the handle: it is no longer known.
      if (client_->Poll(handle)) {
        absl::Status again = client_->Wait(handle, absl::ZeroDuration());
        ThrowIfError(again.code() == absl::StatusCode::kNotFound ? status : again);
        return;
      }
      if (absl::Now() >= deadline) ThrowIfError(status);
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  std::unique_ptr<GatheredBuffer> TakeAllgather(Handle handle) {
    return std::make_unique<GatheredBuffer>(ValueOrThrow(client_->TakeAllgather(handle)));
  }

  // Join, barrier and a process set's release wait as Wait() does: a signal handler runs while
  // they wait, and KeyboardInterrupt interrupts them (the operation stays in flight).
  int Join() {
    WaitUntil(ValueOrThrow(client_->JoinAsync()), absl::InfiniteFuture());
    return client_->last_joined_rank();
  }

  void Barrier() { WaitUntil(ValueOrThrow(client_->BarrierAsync()), absl::InfiniteFuture()); }

  void ReleaseProcessSet(int32_t id) {
    WaitUntil(ValueOrThrow(client_->ReleaseProcessSetAsync(id)), absl::InfiniteFuture());
  }

  void Shutdown() {
    py::gil_scoped_release release;
    client_->Shutdown();
  }

 private:
  std::shared_ptr<Client> client_;
};

}  // namespace

namespace python {
std::shared_ptr<Client> ClientOf(py::handle py_client) {
  return py::cast<const PyClient&>(py_client).shared();
}
}  // namespace python

}  // namespace ringmaster

PYBIND11_MODULE(_ringmaster, m) {
  using namespace ringmaster;
  m.doc() = "Ringmaster's C++ client (ringmaster/client.h); use ringmaster.torch instead.";

  static py::exception<StatusException> status_error(m, "StatusError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusException& e) {
      const std::string code = absl::StatusCodeToString(e.status.code());
      py::object type = status_error;
      py::object error = type(code, std::string(e.status.message()));
      PyErr_SetObject(status_error.ptr(), error.ptr());
    }
  });

  py::module_ dtypes = m.def_submodule("dtype", "DataType codes (common/tensor.h)");
  dtypes.attr("uint8") = static_cast<int>(DataType::kUint8);
  dtypes.attr("int8") = static_cast<int>(DataType::kInt8);
  dtypes.attr("int32") = static_cast<int>(DataType::kInt32);
  dtypes.attr("int64") = static_cast<int>(DataType::kInt64);
  dtypes.attr("float16") = static_cast<int>(DataType::kFloat16);
  dtypes.attr("bfloat16") = static_cast<int>(DataType::kBfloat16);
  dtypes.attr("float32") = static_cast<int>(DataType::kFloat32);
  dtypes.attr("float64") = static_cast<int>(DataType::kFloat64);

  py::module_ ops = m.def_submodule("op", "ReduceOp codes (common/tensor.h)");
  ops.attr("average") = static_cast<int>(ReduceOp::kAverage);
  ops.attr("sum") = static_cast<int>(ReduceOp::kSum);
  ops.attr("min") = static_cast<int>(ReduceOp::kMin);
  ops.attr("max") = static_cast<int>(ReduceOp::kMax);
  ops.attr("product") = static_cast<int>(ReduceOp::kProduct);

  py::class_<Topology>(m, "Topology")
      .def_readonly("job_id", &Topology::job_id)
      .def_readonly("epoch", &Topology::epoch)
      .def_readonly("rank", &Topology::rank)
      .def_readonly("size", &Topology::size)
      .def_readonly("local_rank", &Topology::local_rank)
      .def_readonly("local_size", &Topology::local_size)
      .def_readonly("cross_rank", &Topology::cross_rank)
      .def_readonly("cross_size", &Topology::cross_size)
      .def_readonly("host", &Topology::host)
      .def_readonly("device", &Topology::device)
      .def_readonly("arena_bytes", &Topology::arena_bytes)
      .def_readonly("direct_access", &Topology::direct_access);

  py::class_<ArenaBuffer>(m, "ArenaBuffer", py::buffer_protocol())
      .def_buffer([](ArenaBuffer& b) {
        if (b.on_device()) {
          throw py::buffer_error("GPU arena memory is device memory: use __cuda_array_interface__");
        }
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes())}, {1}, /*readonly=*/false);
      })
      // GPU slots only (absent on CPU slots): bytes of device memory, for torch.as_tensor.
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const ArenaBuffer& b) -> py::dict {
            if (!b.on_device()) {
              throw py::attribute_error("CPU arena memory: use the buffer protocol");
            }
            py::dict d;
            d["shape"] = py::make_tuple(b.bytes());
            d["typestr"] = "|u1";
            d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(b.data()), false);
            d["version"] = 2;
            return d;
          })
      .def_property_readonly(
          "address", [](const ArenaBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def("__len__", &ArenaBuffer::bytes);

  py::class_<GatheredBuffer>(m, "GatheredBuffer", py::buffer_protocol())
      .def_buffer([](GatheredBuffer& b) {
        return py::buffer_info(b.data().data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.data().size())}, {1},
                               /*readonly=*/false);
      })
      .def_property_readonly("shape", &GatheredBuffer::shape)
      .def("__len__", [](GatheredBuffer& b) { return b.data().size(); });

  py::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::Connect, py::arg("socket") = "",
                  py::arg("timeout_seconds") = 60.0, py::arg("after_epoch") = 0,
                  "Connects to the rank's worker daemon ($RINGMASTER_SOCKET when socket is empty); "
                  "after_epoch > 0 waits for an elastic job's epoch after that one.")
      .def_property_readonly("topology", &PyClient::topology, py::return_value_policy::copy)
      .def_property_readonly("hosts_updated", &PyClient::hosts_updated,
                             "Whether workers were added to this elastic job (reset at commit).")
      .def("allocate", &PyClient::Allocate, py::arg("bytes"),
           "An ArenaBuffer of `bytes` in the shared arena, or None when it is full.")
      .def("allreduce", &PyClient::Allreduce, py::arg("name"), py::arg("data"), py::arg("dtype"),
           py::arg("shape"), py::arg("op"), py::arg("prescale") = 1.0, py::arg("postscale") = 1.0)
      .def("grouped_allreduce", &PyClient::GroupedAllreduce, py::arg("names"), py::arg("data"),
           py::arg("dtype"), py::arg("shapes"), py::arg("op"), py::arg("prescale") = 1.0,
           py::arg("postscale") = 1.0)
      .def("broadcast", &PyClient::Broadcast, py::arg("name"), py::arg("data"), py::arg("dtype"),
           py::arg("shape"), py::arg("root"))
      .def("allgather", &PyClient::Allgather, py::arg("name"), py::arg("data"), py::arg("dtype"),
           py::arg("shape"))
      .def("poll", &PyClient::Poll, py::arg("handle"))
      .def("wait", &PyClient::Wait, py::arg("handle"), py::arg("timeout_seconds") = py::none())
      .def("take_allgather", &PyClient::TakeAllgather, py::arg("handle"))
      .def("join", &PyClient::Join)
      .def("barrier", &PyClient::Barrier)
      .def("release_process_set", &PyClient::ReleaseProcessSet, py::arg("id"),
           "a barrier of every rank, after which the daemons release process set `id`'s "
           "communicators")
      .def("set_process_set", &PyClient::SetProcessSet, py::arg("id"), py::arg("ranks"),
           "the process set (Horovod's; 0 and no ranks: the global one) of the operations this "
           "thread submits from now on")
      .def("set_cuda_stream", &PyClient::SetCudaStream, py::arg("stream"),
           "GPU slots: the cudaStream_t (as an integer; 0: the legacy default stream) that tensors "
           "are produced and consumed on.")
      .def("shutdown", &PyClient::Shutdown);
  python::DefineMxnetEngine(m);
#ifdef RINGMASTER_HAVE_CUDA
  m.attr("CUDA_BUILT") = true;
#else
  m.attr("CUDA_BUILT") = false;
#endif
#ifdef RINGMASTER_NCCL_VERSION_CODE
  m.attr("NCCL_VERSION_CODE") = RINGMASTER_NCCL_VERSION_CODE;
#else
  m.attr("NCCL_VERSION_CODE") = 0;
#endif
}
