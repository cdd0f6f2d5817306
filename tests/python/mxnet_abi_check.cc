// Compiled (syntax only) by test_mxnet_api.py against the MXNet wheel's own headers: fails if what
// python/src/mxnet_abi.h declares of MXNet differs from what the installed MXNet declares.
#include <mxnet/c_api.h>
#include <mxnet/engine.h>

#include <cstddef>
#include <type_traits>

#include "python/src/mxnet_abi.h"

namespace rm_abi = ringmaster::mxnet_abi;

static_assert(std::is_same_v<decltype(&MXEnginePushAsyncND), rm_abi::PushAsyncNDFn>);
static_assert(std::is_same_v<decltype(&MXNDArrayGetData), rm_abi::NDArrayGetDataFn>);
static_assert(std::is_same_v<decltype(&MXGetLastError), rm_abi::GetLastErrorFn>);
static_assert(std::is_same_v<decltype(&MXNDArrayDetach), rm_abi::NDArrayDetachFn>);
static_assert(std::is_same_v<decltype(&MXNDArrayFree), rm_abi::NDArrayFreeFn>);
static_assert(std::is_same_v<EngineAsyncFunc, rm_abi::AsyncFunc>);
static_assert(std::is_same_v<EngineFuncParamDeleter, rm_abi::ParamDeleter>);
// CallbackOnComplete: a function pointer, the engine and the parameter, in that order (its
// members are private: the size and the one public constructor-free layout are what can be seen).
static_assert(sizeof(mxnet::engine::CallbackOnComplete) == sizeof(rm_abi::CallbackOnComplete));
static_assert(std::is_trivially_copyable_v<mxnet::engine::CallbackOnComplete>);
static_assert(sizeof(mxnet::Context) == sizeof(rm_abi::Context));
static_assert(offsetof(mxnet::Context, dev_type) == offsetof(rm_abi::Context, dev_type));
static_assert(offsetof(mxnet::Context, dev_id) == offsetof(rm_abi::Context, dev_id));
static_assert(static_cast<int>(mxnet::Context::kCPU) == rm_abi::kCpu);
static_assert(static_cast<int>(mxnet::FnProperty::kCPUPrioritized) == rm_abi::kCpuPrioritized);
static_assert(sizeof(mxnet::FnProperty) == sizeof(int32_t));
// The error the engine copies: dmlc::Error is a std::runtime_error and adds nothing.
static_assert(std::is_base_of_v<std::runtime_error, dmlc::Error>);
static_assert(sizeof(dmlc::Error) == sizeof(std::runtime_error));
