// The autotuner's optimiser on functions whose optimum is known: within the default budget of 20
// samples (Horovod's HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES) it must land near the maximum.
#include "coordinator/bayesian_optimizer.h"

#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Runs `budget` samples of `f` (plus optional noise) and returns the optimiser's best point.
template <typename F>
Point Optimise(F f, int dimensions, int budget, double gp_noise, double score_noise = 0,
               std::vector<int> discrete = {}) {
  BayesianOptimizer opt(dimensions, gp_noise, discrete);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0, score_noise);
  for (int i = 0; i < budget; ++i) {
    Point x = opt.Suggest();
    opt.AddSample(x, f(x) + (score_noise > 0 ? noise(rng) : 0));
  }
  return opt.Best();
}

TEST(GaussianProcessTest, InterpolatesNoiseFreeSamples) {
  GaussianProcess gp(1e-6);
  gp.Fit({{0.1}, {0.5}, {0.9}}, {3.0, 5.0, 4.0});
  double mean, stddev;
  gp.Predict({0.5}, &mean, &stddev);
  EXPECT_NEAR(mean, 5.0, 1e-3);
  EXPECT_LT(stddev, 1e-2);
  gp.Predict({0.1}, &mean, &stddev);
  EXPECT_NEAR(mean, 3.0, 1e-3);
  // Far from every sample the posterior reverts to the mean with the prior's spread.
  gp.Fit({{0.0}, {0.05}}, {1.0, 3.0});
  gp.Predict({1.0}, &mean, &stddev);
  EXPECT_NEAR(mean, 2.0, 0.05);
  EXPECT_NEAR(stddev, 1.0, 0.05);  // the normalised scores' standard deviation
}

TEST(GaussianProcessTest, NoiseSmoothsInsteadOfInterpolating) {
  GaussianProcess gp(0.8);
  gp.Fit({{0.5}, {0.5}}, {1.0, 3.0});
  double mean, stddev;
  gp.Predict({0.5}, &mean, &stddev);
  EXPECT_NEAR(mean, 2.0, 1e-6);
}

TEST(BayesianOptimizerTest, FindsTheMaximumOfAOneDimensionalFunction) {
  // One narrow-ish peak at x = 0.73 on a slope: f(0.73) = 1.
  auto f = [](const Point& x) {
    return std::exp(-std::pow((x[0] - 0.73) / 0.1, 2)) + 0.2 * x[0] - 0.146;
  };
  Point best = Optimise(f, 1, 20, 1e-4);
  EXPECT_NEAR(best[0], 0.73, 0.03);
}

TEST(BayesianOptimizerTest, FindsTheGlobalMaximumOfAMultimodalFunction) {
  // sin(3*pi*x) * x: local maxima near x = 0.17 and 0.83; the global one near 0.839.
  auto f = [](const Point& x) { return std::sin(3 * kPi * x[0]) * x[0]; };
  Point best = Optimise(f, 1, 20, 1e-4);
  EXPECT_NEAR(best[0], 0.839, 0.03);
}

TEST(BayesianOptimizerTest, FindsTheMaximumOfATwoDimensionalFunction) {
  // A negated, rescaled Branin-like bowl with its maximum at (0.2, 0.7).
  auto f = [](const Point& x) {
    const double a = x[0] - 0.2, b = x[1] - 0.7;
    return -(a * a + 2 * b * b) - 0.3 * a * b;
  };
  Point best = Optimise(f, 2, 20, 1e-4);
  EXPECT_NEAR(best[0], 0.2, 0.07);
  EXPECT_NEAR(best[1], 0.7, 0.07);
  EXPECT_GT(f(best), -0.005);  // within 0.5 % of the range from the optimum value 0
}

TEST(BayesianOptimizerTest, FindsTheMaximumUnderNoiseWithHorovodsDefaultNoise) {
  // Scores as noisy as a throughput measurement: the peak is 1.0 at (0.6, 0.3), noise sd 3 %.
  auto f = [](const Point& x) {
    const double a = x[0] - 0.6, b = x[1] - 0.3;
    return 1.0 - 2 * (a * a + b * b);
  };
  Point best = Optimise(f, 2, 20, 0.8, 0.03);
  EXPECT_GT(f(best), 0.95);  // within 5 % of the best value
}

TEST(BayesianOptimizerTest, DiscreteDimensionsOnlyTakeZeroOrOne) {
  // Dimension 1 is a switch; the function is better with it on.
  auto f = [](const Point& x) { return -std::pow(x[0] - 0.4, 2) + 0.3 * x[1]; };
  BayesianOptimizer opt(2, 1e-4, {1});
  for (int i = 0; i < 15; ++i) {
    Point x = opt.Suggest();
    ASSERT_TRUE(x[1] == 0.0 || x[1] == 1.0) << x[1];
    opt.AddSample(x, f(x));
  }
  Point best = opt.Best();
  EXPECT_EQ(best[1], 1.0);
  EXPECT_NEAR(best[0], 0.4, 0.05);
}

TEST(BayesianOptimizerTest, SuggestionsAreDeterministic) {
  auto run = [] {
    BayesianOptimizer opt(2, 0.1);
    std::vector<Point> points;
    for (int i = 0; i < 6; ++i) {
      Point x = opt.Suggest();
      points.push_back(x);
      opt.AddSample(x, x[0] - x[1]);
    }
    return points;
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace ringmaster
