// The median of a handful of values (who is slow: lateness per step, link rates, shares of time).
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

namespace ringmaster {

// The median of `v` (for an even count, the mean of the two middle values: for integers, rounded
// toward the lower); reorders `v`. REQUIRES: `v` is not empty.
template <typename T>
T Median(std::vector<T>& v) {
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  const T upper = v[n / 2];
  if (n % 2 == 1) return upper;
  const T lower = *std::max_element(v.begin(), v.begin() + n / 2);
  if constexpr (std::is_integral_v<T>) {
    return lower + (upper - lower) / 2;
  } else {
    return (lower + upper) / 2;
  }
}

}  // namespace ringmaster
