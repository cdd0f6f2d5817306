#include "worker/gpu/gpu_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ringmaster {

namespace {

// A job rank's place in the collective's process set (the job rank itself outside a set).
int PlaceInSet(const Collective& c, int job_rank) {
  if (c.process_set_ranks.empty()) return job_rank;
  return static_cast<int>(
      std::lower_bound(c.process_set_ranks.begin(), c.process_set_ranks.end(), job_rank) -
      c.process_set_ranks.begin());
}

// Tensor `i` of the collective as the device side takes it (none of this rank's: no offset).
DeviceExecutor::Tensor TensorOf(const Collective& c, size_t i, int64_t count) {
  DeviceExecutor::Tensor t;
  t.count = count;
  if (i < c.tensors.size() && c.tensors[i].offset >= 0) {
    t.offset = c.tensors[i].offset;
    t.ready_event = c.tensors[i].ready_event;
  }
  return t;
}

}  // namespace

absl::StatusOr<int32_t> GpuExecutor::Allgather(const Collective& c, Executed& executed) {
  const int size =
      c.process_set_ranks.empty() ? size_ : static_cast<int>(c.process_set_ranks.size());
  const int64_t elem = DataTypeSize(c.dtype);
  absl::StatusOr<std::vector<AllgatherPart>> parts = PlanAllgather(c, size);
  if (!parts.ok()) return parts.status();
  executed.outputs.resize(c.tensors.size());
  // An output that does not fit the arena fails this allgather alone: the rank still makes its
  // NCCL call (gathering into device scratch), so its peers stay in step.
  absl::Status no_room;
  absl::StatusOr<int32_t> done = 0;
  for (size_t t = 0; t < c.tensors.size() && done.ok(); ++t) {
    const AllgatherPart& part = (*parts)[t];
    absl::StatusOr<size_t> out = outputs_.Allocate(part.total);
    if (!out.ok() && no_room.ok()) {
      no_room = FailedAlone(absl::ResourceExhaustedError(
          AllgatherOutputTooLarge(part.total, out.status().message())));
    }
    const int64_t offset = out.ok() ? static_cast<int64_t>(*out) : -1;
    done = device_.Allgather(TensorOf(c, t, part.bytes[PlaceInSet(c, rank_)] / elem), offset,
                             part.bytes);
    if (offset < 0) continue;
    if (!done.ok() || c.tensors[t].offset < 0) {
      outputs_.Free(*out).IgnoreError();
      continue;
    }
    executed.outputs[t] = GatheredOutput(part, offset);
  }
  if (done.ok() && !no_room.ok()) return no_room;
  return done;
}

absl::StatusOr<Executed> GpuExecutor::Execute(const Collective& c, ExecutionTrace& trace) {
  // A process set runs on its own communicator, among its members: a broadcast's root and an
  // allgather's parts are by place in the set.
  if (absl::Status s = device_.UseProcessSet(c.process_set_id, c.process_set_ranks); !s.ok()) {
    return s;
  }
  const int64_t elem = DataTypeSize(c.dtype);
  Executed executed;
  absl::StatusOr<int32_t> done = 0;
  switch (c.type) {
    case Collective::Type::kAllreduce: {
      std::vector<DeviceExecutor::Tensor> tensors;
      for (size_t i = 0; i < c.tensors.size(); ++i) {
        tensors.push_back(TensorOf(c, i, i < c.sizes.size() ? c.sizes[i] : 0));
      }
      done = device_.Allreduce(tensors, c.dtype, c.op, c.prescale, c.postscale);
      trace.End("NCCL_ALLREDUCE");
      break;
    }
    case Collective::Type::kBroadcast: {
      const int64_t count = c.sizes.empty() ? 0 : c.sizes[0];
      done = device_.Broadcast(TensorOf(c, 0, count), count * elem, PlaceInSet(c, c.root));
      trace.End("NCCL_BCAST");
      break;
    }
    case Collective::Type::kAllgather:
      done = Allgather(c, executed);
      trace.End("NCCL_ALLGATHER");
      break;
    case Collective::Type::kBarrier: {
      absl::Status s = device_.Barrier();
      trace.End("NCCL_BARRIER");
      if (!s.ok()) return s;
      break;
    }
  }
  if (!done.ok()) {
    // Outputs allocated for earlier tensors go back to the arena.
    for (const Executed::Output& out : executed.outputs) {
      if (out.offset >= 0) outputs_.Free(out.offset).IgnoreError();
    }
    return done.status();
  }
  executed.done_event = *done;
  return executed;
}

}  // namespace ringmaster
