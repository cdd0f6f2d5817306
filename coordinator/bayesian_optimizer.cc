#include "coordinator/bayesian_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace ringmaster {
namespace {

constexpr double kLengthScales[] = {0.05, 0.08, 0.12, 0.18, 0.25, 0.35, 0.5, 0.75, 1.0};
constexpr double kPi = 3.14159265358979323846;
// Exploration margin of expected improvement, in normalised score units.
constexpr double kXi = 0.01;
constexpr int kRandomCandidates = 1500;
constexpr int kLocalCandidates = 150;  // around each of the best few samples

// Solves L z = b in place (L lower triangular, row-major n x n).
void ForwardSubstitute(const std::vector<double>& l, int n, std::vector<double>* b) {
  for (int i = 0; i < n; ++i) {
    double s = (*b)[i];
    for (int k = 0; k < i; ++k) s -= l[i * n + k] * (*b)[k];
    (*b)[i] = s / l[i * n + i];
  }
}

// Solves L^T z = b in place.
void BackSubstitute(const std::vector<double>& l, int n, std::vector<double>* b) {
  for (int i = n - 1; i >= 0; --i) {
    double s = (*b)[i];
    for (int k = i + 1; k < n; ++k) s -= l[k * n + i] * (*b)[k];
    (*b)[i] = s / l[i * n + i];
  }
}

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * kPi); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

double GaussianProcess::Kernel(const Point& a, const Point& b, double length) const {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-d2 / (2 * length * length));
}

double GaussianProcess::Factor(double length, double jitter, std::vector<double>* chol,
                               std::vector<double>* alpha) const {
  const int n = static_cast<int>(x_.size());
  std::vector<double>& l = *chol;
  l.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      double s = Kernel(x_[i], x_[j], length) + (i == j ? noise_ + jitter : 0.0);
      for (int k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
      if (i == j) {
        if (s <= 0) return -std::numeric_limits<double>::infinity();
        l[i * n + i] = std::sqrt(s);
      } else {
        l[i * n + j] = s / l[j * n + j];
      }
    }
  }
  *alpha = y_;
  ForwardSubstitute(l, n, alpha);
  double fit = 0, log_det = 0;
  for (int i = 0; i < n; ++i) {
    fit += (*alpha)[i] * (*alpha)[i];
    log_det += std::log(l[i * n + i]);
  }
  BackSubstitute(l, n, alpha);
  return -0.5 * fit - log_det - 0.5 * n * std::log(2 * kPi);
}

void GaussianProcess::Fit(const std::vector<Point>& x, const std::vector<double>& y) {
  x_ = x;
  const double n = static_cast<double>(y.size());
  y_mean_ = n > 0 ? std::accumulate(y.begin(), y.end(), 0.0) / n : 0.0;
  double var = 0;
  for (double v : y) var += (v - y_mean_) * (v - y_mean_);
  y_scale_ = n > 1 && var > 0 ? std::sqrt(var / n) : 1.0;
  if (y_scale_ < 1e-12 * std::max(1.0, std::abs(y_mean_))) y_scale_ = 1.0;
  y_.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) y_[i] = (y[i] - y_mean_) / y_scale_;
  chol_.clear();  // Predict() falls back to the prior if no factorisation succeeds
  alpha_.clear();
  std::vector<double> chol, alpha;
  // Nearly repeated points (or zero noise) can make the kernel matrix numerically singular: add
  // diagonal jitter until it factorises.
  for (double jitter : {1e-8, 1e-6, 1e-4, 1e-2, 1.0}) {
    double best = -std::numeric_limits<double>::infinity();
    for (double length : kLengthScales) {
      const double likelihood = Factor(length, jitter, &chol, &alpha);
      if (likelihood > best) {
        best = likelihood;
        length_scale_ = length;
        chol_ = chol;
        alpha_ = alpha;
      }
    }
    if (!chol_.empty()) return;
  }
}

void GaussianProcess::Predict(const Point& p, double* mean, double* stddev) const {
  const int n = static_cast<int>(x_.size());
  if (n == 0 || chol_.empty()) {
    *mean = y_mean_;
    *stddev = y_scale_;
    return;
  }
  std::vector<double> k(n);
  double mu = 0;
  for (int i = 0; i < n; ++i) {
    k[i] = Kernel(p, x_[i], length_scale_);
    mu += k[i] * alpha_[i];
  }
  ForwardSubstitute(chol_, n, &k);
  double var = 1.0;
  for (double v : k) var -= v * v;
  *mean = y_mean_ + mu * y_scale_;
  *stddev = std::sqrt(std::max(var, 1e-12)) * y_scale_;
}

BayesianOptimizer::BayesianOptimizer(int dimensions, double noise, std::vector<int> discrete)
    : dimensions_(dimensions), discrete_(std::move(discrete)), gp_(noise) {}

Point BayesianOptimizer::Snap(Point p) const {
  for (double& v : p) v = std::clamp(v, 0.0, 1.0);
  for (int d : discrete_) p[d] = p[d] < 0.5 ? 0.0 : 1.0;
  return p;
}

void BayesianOptimizer::AddSample(const Point& x, double score) {
  x_.push_back(Snap(x));
  y_.push_back(score);
  gp_.Fit(x_, y_);
}

double BayesianOptimizer::ExpectedImprovement(const Point& p, double best) const {
  double mean, stddev;
  gp_.Predict(p, &mean, &stddev);
  if (stddev <= 0) return 0;
  const double improvement = mean - best - kXi * stddev;
  const double z = improvement / stddev;
  return improvement * NormalCdf(z) + stddev * NormalPdf(z);
}

Point BayesianOptimizer::Best(double* score) {
  const int i = BestIndex(score);
  return i < 0 ? Point(dimensions_, 0.5) : x_[i];
}

int BayesianOptimizer::BestIndex(double* score) {
  int best = -1;
  double best_mean = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < x_.size(); ++i) {
    double mean, stddev;
    gp_.Predict(x_[i], &mean, &stddev);
    if (mean > best_mean) {
      best_mean = mean;
      best = static_cast<int>(i);
    }
  }
  if (score != nullptr) *score = best_mean;
  return best;
}

Point BayesianOptimizer::Suggest() {
  if (x_.empty()) return Snap(Point(dimensions_, 0.5));
  std::mt19937_64 rng(seed_++ * 0x9E3779B97F4A7C15ull + x_.size());
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  double incumbent;
  Best(&incumbent);
  Point best_point;
  double best_ei = -1;
  auto consider = [&](Point p) {
    p = Snap(std::move(p));
    const double ei = ExpectedImprovement(p, incumbent);
    if (ei > best_ei) {
      best_ei = ei;
      best_point = std::move(p);
    }
  };
  for (int c = 0; c < kRandomCandidates; ++c) {
    Point p(dimensions_);
    for (double& v : p) v = uniform(rng);
    consider(std::move(p));
  }
  // Refine around the samples with the highest posterior means.
  std::vector<size_t> order(x_.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> means(x_.size());
  for (size_t i = 0; i < x_.size(); ++i) {
    double stddev;
    gp_.Predict(x_[i], &means[i], &stddev);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return means[a] > means[b]; });
  order.resize(std::min<size_t>(order.size(), 3));
  for (size_t i : order) {
    for (double sigma : {0.02, 0.08}) {
      std::normal_distribution<double> step(0.0, sigma);
      for (int c = 0; c < kLocalCandidates; ++c) {
        Point p = x_[i];
        for (double& v : p) v += step(rng);
        consider(std::move(p));
      }
    }
  }
  return best_point;
}

}  // namespace ringmaster
