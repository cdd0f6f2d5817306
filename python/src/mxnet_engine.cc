// ringmaster._ringmaster.MxnetEngine: Ringmaster's collectives as operations of MXNet's dependency
// engine, as Horovod's horovod/mxnet/mpi_ops.cc pushes its own.
//
// Each collective is pushed (MXEnginePushAsyncND) with its inputs as read dependencies and its
// outputs as write dependencies: the push returns at once; the engine runs the operation once
// whatever writes its inputs (backward) is done; the operation enqueues with the rank's daemon and
// returns; the client's completion (Client::Then) tells the engine, which then runs what reads the
// outputs (wait_to_read(), asnumpy(), the optimizer's update). A failure goes to the engine as its
// exception: MXNet raises it as MXNetError where the output is waited for. Each operation holds
// handles of its own to its arrays (MXNDArrayDetach: the same memory), so an NDArray that Python
// drops while its operation is in flight stays alive; where the memory is, is read when the
// operation runs (an array an earlier operation writes is allocated by that operation).
//
// MXNet is not linked: ringmaster.mxnet passes the addresses of the C functions in the libmxnet.so
// its Python package loaded (mxnet_abi.h).
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "python/src/binding.h"
#include "python/src/mxnet_abi.h"

namespace py = pybind11;

namespace ringmaster::python {
namespace {

enum class Kind { kAllreduce, kBroadcast };

// MXNet's functions, from the libmxnet.so that MXNet's Python package loaded.
struct MxnetApi {
  mxnet_abi::PushAsyncNDFn push;
  mxnet_abi::NDArrayGetDataFn get_data;
  mxnet_abi::NDArrayDetachFn detach;
  mxnet_abi::NDArrayFreeFn free;
  mxnet_abi::GetLastErrorFn last_error;
};

// One pushed operation: what the engine hands back to Run(), deleted by the engine after it (its
// handles go with it: the memory too if Python dropped the arrays meanwhile).
struct EngineOp {
  EngineOp() = default;
  EngineOp(const EngineOp&) = delete;
  EngineOp& operator=(const EngineOp&) = delete;
  ~EngineOp() {
    for (size_t i = 0; i < output_arrays.size(); ++i) {
      if (output_arrays[i] != input_arrays[i]) api.free(output_arrays[i]);
    }
    for (void* array : input_arrays) api.free(array);
  }

  std::shared_ptr<Client> client;
  MxnetApi api;
  Kind kind = Kind::kAllreduce;
  std::vector<std::string> names;
  std::vector<void*> input_arrays;   // the operation's own NDArray handles (MXNDArrayDetach)
  std::vector<void*> output_arrays;  // the same handle as the input's: in place
  std::vector<void*> inputs;         // their memory, once the operation runs
  std::vector<void*> outputs;
  std::vector<size_t> bytes;
  std::vector<std::vector<int64_t>> shapes;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;
  int32_t group = 0;  // a grouped allreduce's, reserved at the push (ranks push in one order)
  int32_t set_id = 0;
  std::vector<int32_t> set_ranks;
  bool synchronous = false;  // MXNet's NaiveEngine: complete before Run() returns
};

// Tells the engine that an operation is done, with its error if it failed (a dmlc::Error is a
// std::runtime_error, which the engine copies and rethrows where the output is waited for).
void Complete(const mxnet_abi::CallbackOnComplete& done, const absl::Status& status) {
  if (status.ok()) {
    done.callback(done.engine, done.param, nullptr);
    return;
  }
  const std::runtime_error error(std::string(status.message()));
  done.callback(done.engine, done.param, &error);
}

// The client's handles of one pushed operation: the engine hears once all of them are done.
class Pending {
 public:
  Pending(mxnet_abi::CallbackOnComplete done, size_t count) : done_(done), left_(count) {}

  void One(absl::Status status) {
    absl::Status first;
    {
      absl::MutexLock lock(&mu_);
      if (status_.ok() && !status.ok()) status_ = std::move(status);
      if (--left_ > 0) return;
      first = status_;
    }
    Complete(done_, first);
  }

 private:
  const mxnet_abi::CallbackOnComplete done_;
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::vector<Handle>> Enqueue(const EngineOp& op) {
  Client& client = *op.client;
  if (op.kind == Kind::kBroadcast) {
    absl::StatusOr<Handle> h =
        client.BroadcastAsync(op.names[0], op.outputs[0], op.dtype, op.shapes[0], op.root);
    if (!h.ok()) return h.status();
    return std::vector<Handle>{*h};
  }
  if (op.names.size() == 1) {
    absl::StatusOr<Handle> h = client.AllreduceAsync(
        op.names[0], op.outputs[0], op.dtype, op.shapes[0], op.op, op.prescale, op.postscale);
    if (!h.ok()) return h.status();
    return std::vector<Handle>{*h};
  }
  return client.GroupedAllreduceAsync(op.names, op.outputs, op.dtype, op.shapes, op.op, op.prescale,
                                      op.postscale, op.group);
}

// Where an array's memory is (allocated now if nothing wrote it yet).
absl::StatusOr<void*> DataOf(const MxnetApi& api, void* array) {
  void* data = nullptr;
  if (api.get_data(array, &data) != 0) {
    return absl::InternalError(absl::StrCat("MXNDArrayGetData: ", api.last_error()));
  }
  return data;
}

// The engine runs this on one of its CPU threads once the inputs are ready.
void Run(void* /*run_context*/, void* on_complete, void* param) {
  const auto done = *static_cast<const mxnet_abi::CallbackOnComplete*>(on_complete);
  EngineOp& op = *static_cast<EngineOp*>(param);
  for (size_t i = 0; i < op.input_arrays.size(); ++i) {
    absl::StatusOr<void*> in = DataOf(op.api, op.input_arrays[i]);
    absl::StatusOr<void*> out =
        op.output_arrays[i] == op.input_arrays[i] ? in : DataOf(op.api, op.output_arrays[i]);
    if (!in.ok() || !out.ok()) {
      Complete(done, in.ok() ? out.status() : in.status());
      return;
    }
    op.inputs.push_back(*in);
    op.outputs.push_back(*out);
  }
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    if (op.inputs[i] != op.outputs[i]) std::memcpy(op.outputs[i], op.inputs[i], op.bytes[i]);
  }
  // Process sets are per submitting thread, and the engine's threads serve every operation.
  op.client->SetProcessSet(op.set_id, op.set_ranks);
  absl::StatusOr<std::vector<Handle>> handles = Enqueue(op);
  op.client->SetProcessSet(0, {});
  if (!handles.ok()) {
    Complete(done, handles.status());
    return;
  }
  if (op.synchronous) {
    absl::Status first;
    for (Handle h : *handles) {
      absl::Status s = op.client->Wait(h);
      if (first.ok()) first = s;
    }
    Complete(done, first);
    return;
  }
  auto pending = std::make_shared<Pending>(done, handles->size());
  for (Handle h : *handles) {
    absl::Status registered =
        op.client->Then(h, [pending](absl::Status s) { pending->One(std::move(s)); });
    if (!registered.ok()) pending->One(std::move(registered));
  }
}

void Delete(void* param) { delete static_cast<EngineOp*>(param); }

// An NDArray's memory in the shared arena: MXNet keeps the DLManagedTensor and calls its deleter
// when the NDArray's memory goes, which returns it to the client's allocator (holding the client
// keeps the arena mapped, so the array stays valid after shutdown()).
struct ArenaTensor {
  mxnet_abi::DLManagedTensor managed;  // first: MXNet hands back its address
  std::vector<int64_t> shape;
  std::shared_ptr<Client> client;
  void* data = nullptr;

  static void Release(mxnet_abi::DLManagedTensor* self) {
    auto* tensor = reinterpret_cast<ArenaTensor*>(self);
    tensor->client->Free(tensor->data);
    delete tensor;
  }
};
static_assert(std::is_standard_layout_v<mxnet_abi::DLManagedTensor>);

// DLPack's name of a Ringmaster data type.
std::optional<mxnet_abi::DLDataType> DLTypeOf(DataType dtype) {
  const auto bits = static_cast<uint8_t>(8 * DataTypeSize(dtype));
  switch (dtype) {
    case DataType::kUint8:
      return mxnet_abi::DLDataType{mxnet_abi::kDLUInt, bits, 1};
    case DataType::kInt8:
    case DataType::kInt32:
    case DataType::kInt64:
      return mxnet_abi::DLDataType{mxnet_abi::kDLInt, bits, 1};
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
      return mxnet_abi::DLDataType{mxnet_abi::kDLFloat, bits, 1};
    default:
      return std::nullopt;
  }
}

size_t Elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

class MxnetEngine {
 public:
  MxnetEngine(py::handle client, uintptr_t push_async_nd, uintptr_t get_data, uintptr_t detach,
              uintptr_t free, uintptr_t get_last_error, bool synchronous, uintptr_t from_dlpack)
      : client_(ClientOf(client)),
        from_dlpack_(reinterpret_cast<mxnet_abi::NDArrayFromDLPackFn>(from_dlpack)),
        api_{reinterpret_cast<mxnet_abi::PushAsyncNDFn>(push_async_nd),
             reinterpret_cast<mxnet_abi::NDArrayGetDataFn>(get_data),
             reinterpret_cast<mxnet_abi::NDArrayDetachFn>(detach),
             reinterpret_cast<mxnet_abi::NDArrayFreeFn>(free),
             reinterpret_cast<mxnet_abi::GetLastErrorFn>(get_last_error)},
        synchronous_(synchronous) {}

  // Allreduces inputs[i] into outputs[i] (NDArray handles as integers; the same handle: in
  // place), grouped when there are several.
  void Allreduce(const std::vector<std::string>& names, const std::vector<uintptr_t>& inputs,
                 const std::vector<uintptr_t>& outputs, int dtype,
                 const std::vector<std::vector<int64_t>>& shapes, int op, double prescale,
                 double postscale, int priority, int32_t set_id, std::vector<int32_t> set_ranks) {
    auto engine_op = NewOp(Kind::kAllreduce, names, dtype, shapes, set_id, std::move(set_ranks));
    engine_op->op = static_cast<ReduceOp>(op);
    engine_op->prescale = prescale;
    engine_op->postscale = postscale;
    // The engine may run it after a grouped allreduce pushed later: its group id is taken now.
    if (names.size() > 1) engine_op->group = client_->ReserveGroup();
    Push(std::move(engine_op), inputs, outputs, priority);
  }

  // One in-place allreduce per tensor (handles[i], names[i], priorities[i]), pushed in one call:
  // what a trainer does for its gradients every step.
  void AllreduceEach(const std::vector<std::string>& names, const std::vector<uintptr_t>& handles,
                     const std::vector<int>& dtypes,
                     const std::vector<std::vector<int64_t>>& shapes, int op, double prescale,
                     double postscale, const std::vector<int>& priorities, int32_t set_id,
                     const std::vector<int32_t>& set_ranks) {
    const size_t n = names.size();
    if (handles.size() != n || dtypes.size() != n || shapes.size() != n || priorities.size() != n) {
      throw py::value_error(
          "MxnetEngine: names, handles, dtypes, shapes and priorities differ in length");
    }
    for (size_t i = 0; i < n; ++i) {
      auto engine_op =
          NewOp(Kind::kAllreduce, {names[i]}, dtypes[i], {shapes[i]}, set_id, set_ranks);
      engine_op->op = static_cast<ReduceOp>(op);
      engine_op->prescale = prescale;
      engine_op->postscale = postscale;
      Push(std::move(engine_op), {handles[i]}, {handles[i]}, priorities[i]);
    }
  }

  // A new CPU NDArray handle (an integer) over uninitialised memory of the shared arena, which the
  // daemon reduces in place (no copy); None when the arena is full or the array is empty.
  py::object ArenaArray(const std::vector<int64_t>& shape, int dtype) {
    if (from_dlpack_ == nullptr) throw py::value_error("MxnetEngine: no MXNDArrayFromDLPackEx");
    if (dtype < 1 || dtype > kMaxDataType) {
      throw py::value_error(absl::StrCat("unknown ringmaster data type code ", dtype));
    }
    const std::optional<mxnet_abi::DLDataType> type = DLTypeOf(static_cast<DataType>(dtype));
    if (!type.has_value()) {
      throw py::value_error(absl::StrCat("no DLPack type for ringmaster data type code ", dtype));
    }
    const size_t bytes = Elements(shape) * (type->bits / 8);
    if (bytes == 0) return py::none();
    void* data = client_->Allocate(bytes);
    if (data == nullptr) return py::none();
    auto tensor = std::make_unique<ArenaTensor>();
    tensor->shape = shape;
    tensor->client = client_;
    tensor->data = data;
    mxnet_abi::DLTensor& t = tensor->managed.dl_tensor;
    t.data = data;
    t.ctx = {mxnet_abi::kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = *type;
    t.shape = tensor->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    tensor->managed.manager_ctx = nullptr;
    tensor->managed.deleter = &ArenaTensor::Release;
    void* handle = nullptr;
    if (from_dlpack_(&tensor->managed, /*transient_handle=*/false, &handle) != 0) {
      client_->Free(data);
      throw std::runtime_error(absl::StrCat("MXNDArrayFromDLPackEx: ", api_.last_error()));
    }
    tensor.release();  // MXNet's now: its deleter frees it
    return py::int_(reinterpret_cast<uintptr_t>(handle));
  }

  void Broadcast(const std::string& name, uintptr_t input, uintptr_t output, int dtype,
                 const std::vector<int64_t>& shape, int root, int priority, int32_t set_id,
                 std::vector<int32_t> set_ranks) {
    auto engine_op = NewOp(Kind::kBroadcast, {name}, dtype, {shape}, set_id, std::move(set_ranks));
    engine_op->root = root;
    Push(std::move(engine_op), {input}, {output}, priority);
  }

 private:
  std::unique_ptr<EngineOp> NewOp(Kind kind, std::vector<std::string> names, int dtype,
                                  std::vector<std::vector<int64_t>> shapes, int32_t set_id,
                                  std::vector<int32_t> set_ranks) {
    if (dtype < 1 || dtype > kMaxDataType) {
      throw py::value_error(absl::StrCat("unknown ringmaster data type code ", dtype));
    }
    auto op = std::make_unique<EngineOp>();
    op->client = client_;
    op->api = api_;
    op->kind = kind;
    op->names = std::move(names);
    op->dtype = static_cast<DataType>(dtype);
    op->shapes = std::move(shapes);
    op->set_id = set_id;
    op->set_ranks = std::move(set_ranks);
    op->synchronous = synchronous_;
    for (const auto& shape : op->shapes) {
      op->bytes.push_back(Elements(shape) * static_cast<size_t>(DataTypeSize(op->dtype)));
    }
    return op;
  }

  // A handle of the operation's own to the array `handle` (the same memory).
  void* Detach(uintptr_t handle) {
    void* own = nullptr;
    if (api_.detach(reinterpret_cast<void*>(handle), &own) != 0) {
      throw std::runtime_error(absl::StrCat("MXNDArrayDetach: ", api_.last_error()));
    }
    return own;
  }

  void Push(std::unique_ptr<EngineOp> op, const std::vector<uintptr_t>& inputs,
            const std::vector<uintptr_t>& outputs, int priority) {
    const size_t n = op->names.size();
    if (inputs.size() != n || outputs.size() != n || op->shapes.size() != n) {
      throw py::value_error("MxnetEngine: names, inputs, outputs and shapes differ in length");
    }
    std::vector<void*> reads, writes;
    for (size_t i = 0; i < n; ++i) {  // a failed Detach() leaves op to free what it holds
      op->input_arrays.push_back(Detach(inputs[i]));
      op->output_arrays.push_back(inputs[i] == outputs[i] ? op->input_arrays.back()
                                                          : Detach(outputs[i]));
      if (inputs[i] != outputs[i]) reads.push_back(op->input_arrays.back());
      writes.push_back(op->output_arrays.back());
    }
    static const mxnet_abi::Context cpu{mxnet_abi::kCpu, 0};
    static const int32_t property = mxnet_abi::kCpuPrioritized;
    const std::string label = absl::StrCat("ringmaster.", op->names[0]);
    EngineOp* param = op.release();  // the engine's now: Delete() frees it
    if (api_.push(&Run, param, &Delete, &cpu, reads.data(), static_cast<int>(reads.size()),
                  writes.data(), static_cast<int>(writes.size()), &property, priority,
                  label.c_str(), false) != 0) {
      throw std::runtime_error(absl::StrCat("MXEnginePushAsyncND: ", api_.last_error()));
    }
  }

  std::shared_ptr<Client> client_;
  mxnet_abi::NDArrayFromDLPackFn from_dlpack_;
  MxnetApi api_;
  bool synchronous_;
};

}  // namespace

void DefineMxnetEngine(py::module_& m) {
  py::class_<MxnetEngine>(m, "MxnetEngine",
                          "Collectives pushed into MXNet's dependency engine (ringmaster.mxnet).")
      .def(py::init<py::handle, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, bool,
                    uintptr_t>(),
           py::arg("client"), py::arg("push_async_nd"), py::arg("ndarray_get_data"),
           py::arg("ndarray_detach"), py::arg("ndarray_free"), py::arg("get_last_error"),
           py::arg("synchronous") = false, py::arg("ndarray_from_dlpack") = 0)
      .def("allreduce_each", &MxnetEngine::AllreduceEach, py::arg("names"), py::arg("handles"),
           py::arg("dtypes"), py::arg("shapes"), py::arg("op"), py::arg("prescale"),
           py::arg("postscale"), py::arg("priorities"), py::arg("set_id") = 0,
           py::arg("set_ranks") = std::vector<int32_t>{})
      .def("arena_array", &MxnetEngine::ArenaArray, py::arg("shape"), py::arg("dtype"),
           "A new CPU NDArray handle over the shared arena (reduced there without a copy), or "
           "None when the arena is full.")
      .def("allreduce", &MxnetEngine::Allreduce, py::arg("names"), py::arg("inputs"),
           py::arg("outputs"), py::arg("dtype"), py::arg("shapes"), py::arg("op"),
           py::arg("prescale") = 1.0, py::arg("postscale") = 1.0, py::arg("priority") = 0,
           py::arg("set_id") = 0, py::arg("set_ranks") = std::vector<int32_t>{})
      .def("broadcast", &MxnetEngine::Broadcast, py::arg("name"), py::arg("input"),
           py::arg("output"), py::arg("dtype"), py::arg("shape"), py::arg("root"),
           py::arg("priority") = 0, py::arg("set_id") = 0,
           py::arg("set_ranks") = std::vector<int32_t>{});
}

}  // namespace ringmaster::python
