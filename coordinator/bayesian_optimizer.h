// Bayesian optimisation for the autotuner: a Gaussian process over the unit cube with a squared-
// exponential kernel (length scale fitted by marginal likelihood on each fit), and expected
// improvement to choose the next point. Maximises a noisy score.
//
// Dimensions listed in `discrete` only take the values 0 and 1 (e.g. response cache off/on).
// Deterministic: the same samples give the same suggestions. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace ringmaster {

using Point = std::vector<double>;  // coordinates in [0, 1]

class GaussianProcess {
 public:
  // `noise`: variance added to the kernel's diagonal, relative to the normalised scores' unit
  // variance (Horovod's HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE).
  explicit GaussianProcess(double noise) : noise_(noise) {}

  // Fits to (x[i], y[i]); y is normalised to mean 0, variance 1 internally. The length scale is the
  // one of a fixed grid that maximises the log marginal likelihood.
  void Fit(const std::vector<Point>& x, const std::vector<double>& y);

  // Posterior mean and standard deviation at `p`, in the units of y.
  void Predict(const Point& p, double* mean, double* stddev) const;

  double length_scale() const { return length_scale_; }

 private:
  double Kernel(const Point& a, const Point& b, double length) const;
  // Cholesky factor of K + (noise + jitter) I for `length`, alpha = K^-1 y; returns the log
  // marginal likelihood (or -inf when the factorisation fails).
  double Factor(double length, double jitter, std::vector<double>* chol,
                std::vector<double>* alpha) const;

  const double noise_;
  std::vector<Point> x_;
  std::vector<double> y_;  // normalised
  double y_mean_ = 0, y_scale_ = 1;
  double length_scale_ = 0.2;
  std::vector<double> chol_;  // lower triangular, row-major n x n
  std::vector<double> alpha_;
};

class BayesianOptimizer {
 public:
  // `dimensions`: size of a point; `noise`: see GaussianProcess; `discrete`: indices of 0/1 dims.
  BayesianOptimizer(int dimensions, double noise, std::vector<int> discrete = {});

  void AddSample(const Point& x, double score);

  // The point to evaluate next: the one maximising expected improvement over the best posterior
  // mean seen so far, searched over random and locally perturbed candidates. With no samples, the
  // centre of the cube.
  Point Suggest();

  // The sampled point with the highest posterior mean (robust to a lucky noisy sample), and that
  // mean. REQUIRES: at least one sample.
  Point Best(double* score = nullptr);
  // The same as an index into the samples, in the order added; -1 with no samples.
  int BestIndex(double* score = nullptr);

  int samples() const { return static_cast<int>(x_.size()); }

 private:
  Point Snap(Point p) const;  // clamps to [0, 1], rounds discrete dims
  double ExpectedImprovement(const Point& p, double best) const;

  const int dimensions_;
  std::vector<int> discrete_;
  GaussianProcess gp_;
  std::vector<Point> x_;
  std::vector<double> y_;
  uint64_t seed_ = 1;
};

}  // namespace ringmaster
