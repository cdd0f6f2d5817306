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
// DLManagedTensorHandle is a void*.
static_assert(std::is_same_v<decltype(&MXNDArrayFromDLPackEx),
                             int (*)(DLManagedTensorHandle, bool, NDArrayHandle*)>);
static_assert(std::is_same_v<DLManagedTensorHandle, void*>);
static_assert(std::is_same_v<NDArrayHandle, void*>);
// DLPack's layouts, member by member.
#define RM_SAME_MEMBER(type, member)                                          \
  static_assert(offsetof(::type, member) == offsetof(rm_abi::type, member) && \
                sizeof(::type::member) == sizeof(rm_abi::type::member))
static_assert(sizeof(::DLContext) == sizeof(rm_abi::DLContext));
RM_SAME_MEMBER(DLContext, device_type);
RM_SAME_MEMBER(DLContext, device_id);
static_assert(sizeof(::DLDataType) == sizeof(rm_abi::DLDataType));
RM_SAME_MEMBER(DLDataType, code);
RM_SAME_MEMBER(DLDataType, bits);
RM_SAME_MEMBER(DLDataType, lanes);
static_assert(sizeof(::DLTensor) == sizeof(rm_abi::DLTensor));
RM_SAME_MEMBER(DLTensor, data);
RM_SAME_MEMBER(DLTensor, ctx);
RM_SAME_MEMBER(DLTensor, ndim);
RM_SAME_MEMBER(DLTensor, dtype);
RM_SAME_MEMBER(DLTensor, shape);
RM_SAME_MEMBER(DLTensor, strides);
RM_SAME_MEMBER(DLTensor, byte_offset);
static_assert(sizeof(::DLManagedTensor) == sizeof(rm_abi::DLManagedTensor));
RM_SAME_MEMBER(DLManagedTensor, dl_tensor);
RM_SAME_MEMBER(DLManagedTensor, manager_ctx);
RM_SAME_MEMBER(DLManagedTensor, deleter);
static_assert(static_cast<int>(kDLCPU) == rm_abi::kDLCPU);
static_assert(static_cast<int>(kDLInt) == rm_abi::kDLInt);
static_assert(static_cast<int>(kDLUInt) == rm_abi::kDLUInt);
static_assert(static_cast<int>(kDLFloat) == rm_abi::kDLFloat);
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
