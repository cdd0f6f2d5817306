#include "worker/executor.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {

namespace {
constexpr absl::string_view kFailedAlone = "type.ringmaster/failed-alone";
}  // namespace

absl::Status FailedAlone(absl::Status status) {
  status.SetPayload(kFailedAlone, absl::Cord("1"));
  return status;
}

bool IsFailedAlone(const absl::Status& status) {
  return status.GetPayload(kFailedAlone).has_value();
}

std::string AllgatherOutputTooLarge(int64_t bytes, absl::string_view why) {
  return absl::StrCat("the allgather's output of ", bytes, " bytes does not fit the shared arena (",
                      why,
                      "): start the workers with a larger --arena-mb (ringmaster local "
                      "--arena-mb), or gather less at once");
}

absl::StatusOr<std::vector<AllgatherPart>> PlanAllgather(const Collective& c, int size) {
  const int64_t elem = DataTypeSize(c.dtype);
  if (c.sizes.size() < c.tensors.size() * size) {
    return absl::InvalidArgumentError(absl::StrCat("allgather response has ", c.sizes.size(),
                                                   " sizes for ", c.tensors.size(), " tensors on ",
                                                   size, " ranks"));
  }
  std::vector<AllgatherPart> parts(c.tensors.size());
  for (size_t t = 0; t < c.tensors.size(); ++t) {
    AllgatherPart& part = parts[t];
    part.shape = c.tensors[t].shape;
    // Row size from the response (every rank the same; a joined rank has no shape of its own),
    // else from this rank's shape.
    int64_t row = elem;
    if (t < c.row_elements.size()) {
      row *= c.row_elements[t];
    } else {
      for (size_t d = 1; d < part.shape.size(); ++d) row *= part.shape[d];
    }
    part.bytes.resize(size);
    for (int k = 0; k < size; ++k) {
      const int64_t first = c.sizes[t * size + k];
      part.bytes[k] = first * row;
      part.rows += first;
    }
    part.total = part.rows * row;
  }
  return parts;
}

Executed::Output GatheredOutput(const AllgatherPart& part, int64_t offset) {
  Executed::Output out;
  out.offset = offset;
  out.shape.push_back(part.rows);
  for (size_t d = 1; d < part.shape.size(); ++d) out.shape.push_back(part.shape[d]);
  return out;
}

}  // namespace ringmaster
