// The pack/unpack kernel on a real GPU (ctest label `gpu`; skipped without one): every data type,
// scaling on the way in and out, zeros for a joined rank, integer averages, several launches.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gpu/fusion_kernels.h"
#include "worker/gpu/fusion_layout.h"
#include "worker/gpu/nccl_backend.h"

namespace ringmaster {
namespace {

class GpuKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe cuda = ProbeCuda();
    if (cuda.devices == 0 && cuda.driver_installed) FAIL() << cuda.problem;
    if (cuda.devices == 0) GTEST_SKIP() << cuda.problem;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* Device(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    allocations_.push_back(p);
    return p;
  }
  template <typename T>
  void* Upload(const std::vector<T>& v) {
    void* p = Device(v.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  template <typename T>
  std::vector<T> Download(const void* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

  // Scales `in` four ways and compares every element with `expect` (the host's arithmetic):
  // 16-byte aligned (whole 16 KiB blocks take the vector path, the rest element by element), one
  // element off 16-byte alignment (element by element throughout), in place, and from null (zeros).
  template <typename S>
  void CheckEveryPath(DataType dtype, const std::vector<S>& in, double scale, int divide_by,
                      const std::function<S(S)>& expect) {
    const int64_t n = static_cast<int64_t>(in.size());
    S* src = static_cast<S*>(Upload(in));
    S* dst = static_cast<S*>(Device(in.size() * sizeof(S)));
    ASSERT_TRUE(ScaledCopy({{src, dst, n}}, dtype, scale, divide_by, stream_).ok());
    std::vector<S> got = Download<S>(dst, in.size());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got[i], expect(in[i])) << "aligned, " << i;
    ASSERT_TRUE(ScaledCopy({{src + 1, dst + 1, n - 1}}, dtype, scale, divide_by, stream_).ok());
    got = Download<S>(dst, in.size());
    for (size_t i = 1; i < in.size(); ++i) ASSERT_EQ(got[i], expect(in[i])) << "unaligned, " << i;
    ASSERT_TRUE(ScaledCopy({{src, src, n}}, dtype, scale, divide_by, stream_).ok());
    got = Download<S>(src, in.size());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got[i], expect(in[i])) << "in place, " << i;
    ASSERT_TRUE(ScaledCopy({{nullptr, dst, n}}, dtype, scale, divide_by, stream_).ok());
    got = Download<S>(dst, in.size());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got[i], S{}) << "zeros, " << i;
  }

  // Three whole 16 KiB blocks and a tail of `S`, random values from `make`.
  template <typename S>
  static std::vector<S> Values(const std::function<S(std::mt19937&)>& make) {
    std::mt19937 rng(7);
    std::vector<S> v(3 * 16384 / sizeof(S) + 123);
    for (S& x : v) x = make(rng);
    return v;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(GpuKernelsTest, EveryTypeScalesTheSameOnTheVectorAndElementPaths) {
  auto uniform = [](double lo, double hi) {
    return
        [lo, hi](std::mt19937& rng) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  };
  auto ints = [](int64_t lo, int64_t hi) {
    return
        [lo, hi](std::mt19937& rng) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  };
  const float f = static_cast<float>(0.37 / 3);
  CheckEveryPath<float>(DataType::kFloat32, Values<float>([&](auto& r) {
                          return static_cast<float>(uniform(-1e3, 1e3)(r));
                        }),
                        0.37, 3, [f](float v) { return v * f; });
  CheckEveryPath<double>(DataType::kFloat64, Values<double>(uniform(-1e6, 1e6)), 1.1, 2,
                         [](double v) { return v * (1.1 / 2); });
  CheckEveryPath<uint16_t>(DataType::kFloat16, Values<uint16_t>([&](auto& r) {
                             return FloatToHalf(static_cast<float>(uniform(-6e4, 6e4)(r)));
                           }),
                           0.25, 1, [](uint16_t v) { return FloatToHalf(HalfToFloat(v) * 0.25f); });
  const float third = static_cast<float>(1.0 / 3);
  CheckEveryPath<uint16_t>(
      DataType::kBfloat16, Values<uint16_t>([&](auto& r) {
        return FloatToBfloat16(static_cast<float>(uniform(-1e9, 1e9)(r)));
      }),
      1.0, 3, [third](uint16_t v) { return FloatToBfloat16(Bfloat16ToFloat(v) * third); });
  CheckEveryPath<uint8_t>(DataType::kUint8, Values<uint8_t>([&](auto& r) {
                            return static_cast<uint8_t>(ints(0, 255)(r));
                          }),
                          1.0, 3, [](uint8_t v) { return static_cast<uint8_t>((1.0 / 3) * v); });
  CheckEveryPath<int8_t>(DataType::kInt8, Values<int8_t>([&](auto& r) {
                           return static_cast<int8_t>(ints(-128, 127)(r));
                         }),
                         0.5, 1, [](int8_t v) { return static_cast<int8_t>(v * 0.5); });
  CheckEveryPath<int32_t>(DataType::kInt32, Values<int32_t>([&](auto& r) {
                            return static_cast<int32_t>(ints(-1000000, 1000000)(r));
                          }),
                          1.5, 1, [](int32_t v) { return static_cast<int32_t>(v * 1.5); });
  CheckEveryPath<int64_t>(DataType::kInt64,
                          Values<int64_t>(ints(-(int64_t{1} << 50), int64_t{1} << 50)), 1.0, 4,
                          [](int64_t v) { return static_cast<int64_t>(0.25 * v); });
}

TEST_F(GpuKernelsTest, PackScalesIntoTheLayoutAndUnpackScalesBack) {
  // Three float32 tensors (one joined: zeros), packed with prescale 0.5 at aligned offsets.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-8, 8);
  std::vector<float> a(1000), b(70000);
  for (float& x : a) x = uniform(rng);
  for (float& x : b) x = uniform(rng);
  absl::StatusOr<FusionLayout> layout = PlanFusion({4000, 400, 280000}, 4);
  ASSERT_TRUE(layout.ok());
  uint8_t* fusion = static_cast<uint8_t*>(Device(layout->total_bytes));
  void* da = Upload(a);
  void* db = Upload(b);
  ASSERT_TRUE(ScaledCopy({{da, fusion + layout->offsets[0], 1000},
                          {nullptr, fusion + layout->offsets[1], 100},
                          {db, fusion + layout->offsets[2], 70000}},
                         DataType::kFloat32, 0.5, 1, stream_)
                  .ok());
  std::vector<float> packed = Download<float>(fusion, layout->total_bytes / 4);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(packed[i], a[i] * 0.5f) << i;
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(packed[layout->offsets[1] / 4 + i], 0.0f) << i;
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(packed[layout->offsets[2] / 4 + i], b[i] * 0.5f) << i;
  }
  // Unpack with postscale 3 and an average over 4 ranks: x * 3 / 4.
  ASSERT_TRUE(
      ScaledCopy({{fusion + layout->offsets[2], db, 70000}}, DataType::kFloat32, 3.0, 4, stream_)
          .ok());
  std::vector<float> out = Download<float>(db, b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(out[i], b[i] * 0.5f * static_cast<float>(3.0 / 4)) << i;
  }
}

TEST_F(GpuKernelsTest, HalfAndBfloat16AreScaledInFloatAndRoundedToNearestEven) {
  std::vector<uint16_t> h(5000), bf(5000);
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = FloatToHalf(static_cast<float>(i) * 0.37f - 900.0f);
    bf[i] = FloatToBfloat16(static_cast<float>(i) * 1.3f - 3000.0f);
  }
  void* dh = Upload(h);
  void* dbf = Upload(bf);
  ASSERT_TRUE(ScaledCopy({{dh, dh, 5000}}, DataType::kFloat16, 0.25, 1, stream_).ok());
  ASSERT_TRUE(ScaledCopy({{dbf, dbf, 5000}}, DataType::kBfloat16, 1.0, 3, stream_).ok());
  std::vector<uint16_t> oh = Download<uint16_t>(dh, h.size());
  std::vector<uint16_t> obf = Download<uint16_t>(dbf, bf.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(oh[i], FloatToHalf(HalfToFloat(h[i]) * 0.25f)) << i;
    ASSERT_EQ(obf[i], FloatToBfloat16(Bfloat16ToFloat(bf[i]) * static_cast<float>(1.0 / 3))) << i;
  }
}

TEST_F(GpuKernelsTest, IntegerAveragesTruncateTowardZero) {
  std::vector<int32_t> v = {7, -7, 8, -9, 0, 2147483647};
  std::vector<int64_t> w = {int64_t{1} << 40, -5};
  void* dv = Upload(v);
  void* dw = Upload(w);
  ASSERT_TRUE(ScaledCopy({{dv, dv, 6}}, DataType::kInt32, 1.0, 2, stream_).ok());
  ASSERT_TRUE(ScaledCopy({{dw, dw, 2}}, DataType::kInt64, 1.0, 4, stream_).ok());
  EXPECT_THAT(Download<int32_t>(dv, 6), ::testing::ElementsAre(3, -3, 4, -4, 0, 1073741823));
  EXPECT_THAT(Download<int64_t>(dw, 2), ::testing::ElementsAre(int64_t{1} << 38, -1));
}

TEST_F(GpuKernelsTest, ManySegmentsTakeSeveralLaunches) {
  // 300 tensors of 1..300 doubles each, copied (no scaling) into one buffer back to back.
  std::vector<double> all;
  std::vector<int64_t> sizes;
  for (int i = 1; i <= 300; ++i) {
    sizes.push_back(i);
    for (int k = 0; k < i; ++k) all.push_back(i * 1000.0 + k);
  }
  double* src = static_cast<double*>(Upload(all));
  double* dst = static_cast<double*>(Device(all.size() * sizeof(double)));
  std::vector<DeviceSegment> segments;
  int64_t at = 0;
  for (int64_t n : sizes) {
    segments.push_back({src + at, dst + at, n});
    at += n;
  }
  ASSERT_TRUE(ScaledCopy(segments, DataType::kFloat64, 1.0, 1, stream_).ok());
  EXPECT_EQ(Download<double>(dst, all.size()), all);
}

}  // namespace
}  // namespace ringmaster
