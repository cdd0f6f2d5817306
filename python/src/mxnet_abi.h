// What ringmaster._ringmaster uses of MXNet (1.6 to 1.9), declared here rather than included, so
// that the package builds without MXNet: the C API functions it calls through addresses that
// ringmaster.mxnet looks up in the libmxnet.so MXNet's Python package loaded
// (include/mxnet/c_api.h), and the layouts of the engine's completion callback and context
// (include/mxnet/engine.h, base.h). tests/python/mxnet_abi_check.cc compiles these against the
// installed wheel's own headers and fails on any difference.
#pragma once

#include <cstdint>

namespace ringmaster::mxnet_abi {

// EngineAsyncFunc: (RunContext*, CallbackOnComplete*, param).
using AsyncFunc = void (*)(void*, void*, void*);
using ParamDeleter = void (*)(void*);  // EngineFuncParamDeleter
// MXEnginePushAsyncND(async_func, param, deleter, ctx, const_nds, n, mutable_nds, n, prop,
// priority, opr_name, wait).
using PushAsyncNDFn = int (*)(AsyncFunc, void*, ParamDeleter, const void*, void**, int, void**, int,
                              const void*, int, const char*, bool);
using NDArrayGetDataFn = int (*)(void*, void**);  // MXNDArrayGetData
using NDArrayDetachFn = int (*)(void*, void**);   // MXNDArrayDetach: a handle sharing the memory
using NDArrayFreeFn = int (*)(void*);             // MXNDArrayFree
using GetLastErrorFn = const char* (*)();         // MXGetLastError

// MXNDArrayFromDLPackEx(dlpack, transient_handle, out): an NDArray over memory of our own; with
// transient_handle false MXNet keeps the DLManagedTensor and calls its deleter when the NDArray's
// memory is released.
using NDArrayFromDLPackFn = int (*)(void*, bool, void**);

// DLPack 0.2's tensor (include/dlpack/dlpack.h, as MXNet 1.x ships it).
struct DLContext {
  int32_t device_type;  // kDLCPU = 1
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLContext ctx;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // nullptr: compact, row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
inline constexpr int32_t kDLCPU = 1;
inline constexpr uint8_t kDLInt = 0;
inline constexpr uint8_t kDLUInt = 1;
inline constexpr uint8_t kDLFloat = 2;

// mxnet::engine::CallbackOnComplete: calling it is callback(engine, param, error), error a
// const dmlc::Error* (a std::runtime_error; nullptr on success).
struct CallbackOnComplete {
  void (*callback)(void* engine, void* param, const void* error);
  void* engine;
  void* param;
};

// mxnet::Context.
struct Context {
  int32_t dev_type;
  int32_t dev_id;
};
inline constexpr int32_t kCpu = 1;  // Context::kCPU

// mxnet::FnProperty::kCPUPrioritized: Horovod's choice, so collectives start before queued compute.
inline constexpr int32_t kCpuPrioritized = 3;

}  // namespace ringmaster::mxnet_abi
