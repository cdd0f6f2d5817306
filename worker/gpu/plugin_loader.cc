// The daemon's side of worker/gpu/plugin.h: finds and loads libringmaster_cuda.so.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/gpu/plugin.h"

namespace ringmaster {
namespace {

std::string PluginPath() {
  if (const char* path = std::getenv("RINGMASTER_CUDA_PLUGIN"); path != nullptr && *path != '\0') {
    return path;
  }
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return (exe.parent_path().parent_path() / "lib" / "ringmaster" / "libringmaster_cuda.so")
      .string();
}

absl::StatusOr<const GpuPlugin*> Load() {
  const std::string path = PluginPath();
  // RTLD_LOCAL: the module's copies of Ringmaster's static libraries stay its own.
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "the GPU data plane (", path, ") cannot be loaded: ", why != nullptr ? why : "unknown",
        ". GPU slots need NVIDIA's CUDA runtime and NCCL (libcudart, libnccl.so.2) where the "
        "loader finds them (e.g. /usr/local/cuda/lib64, or LD_LIBRARY_PATH); without GPUs run "
        "the worker with --device cpu"));
  }
  auto entry =
      reinterpret_cast<const GpuPlugin* (*)()>(dlsym(module, RINGMASTER_GPU_PLUGIN_SYMBOL));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not Ringmaster's GPU module (no ",
                                                      RINGMASTER_GPU_PLUGIN_SYMBOL, ")"));
  }
  const GpuPlugin* plugin = entry();
  if (std::string(plugin->build_id) != RINGMASTER_BUILD_ID) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " comes from another build of Ringmaster (", plugin->build_id, "; this worker is ",
        RINGMASTER_BUILD_ID, "): install the worker and its GPU module from one package"));
  }
  return plugin;
}

}  // namespace

absl::StatusOr<const GpuPlugin*> LoadGpuPlugin() {
  // Loaded once; a failure is kept too (the files do not change under a running daemon).
  static const absl::StatusOr<const GpuPlugin*> plugin = Load();
  return plugin;
}

}  // namespace ringmaster
