#include "coordinator/cost_model.h"

#include <array>
#include <cmath>
#include <cstdio>

namespace gradsync {
namespace {

constexpr int kTerms = 3;  // fixed, per byte, per tensor

double Term(const CostSample& s, int term) {
  switch (term) {
    case 0:
      return 1.0;
    case 1:
      return s.bytes;
    default:
      return s.tensors;
  }
}

// Least squares of the relative error (each sample weighted by 1 / its time, so that a 10 us
// collective counts as much as a 10 ms one) over the terms in `use`, by the normal equations (at
// most 3 x 3), with the columns scaled to unit size so that bytes (millions) and counts (ones)
// stay well conditioned.
std::array<double, kTerms> Solve(const std::vector<CostSample>& samples,
                                 const std::array<bool, kTerms>& use) {
  std::array<double, kTerms> scale{};
  for (int t = 0; t < kTerms; ++t) {
    for (const CostSample& s : samples) scale[t] = std::max(scale[t], std::fabs(Term(s, t)));
    if (scale[t] == 0) scale[t] = 1;
  }
  std::vector<int> cols;
  for (int t = 0; t < kTerms; ++t) {
    if (use[t]) cols.push_back(t);
  }
  const size_t n = cols.size();
  double a[kTerms][kTerms + 1] = {};
  for (const CostSample& s : samples) {
    const double w = 1.0 / std::max(s.us, 1e-3);
    for (size_t i = 0; i < n; ++i) {
      const double xi = w * Term(s, cols[i]) / scale[cols[i]];
      for (size_t j = 0; j < n; ++j) a[i][j] += xi * w * Term(s, cols[j]) / scale[cols[j]];
      a[i][n] += xi * w * s.us;
    }
  }
  // Degenerate relative to the matrix itself: its entries scale as 1/us^2, so a fixed floor would
  // drop real terms of a fit whose times are long (a slow network at many ranks).
  double largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(a[i][i]));
  const double degenerate = largest * 1e-12;
  for (size_t i = 0; i < n; ++i) {  // Gauss-Jordan with partial pivoting
    size_t pivot = i;
    for (size_t r = i + 1; r < n; ++r) {
      if (std::fabs(a[r][i]) > std::fabs(a[pivot][i])) pivot = r;
    }
    for (size_t c = 0; c <= n; ++c) std::swap(a[i][c], a[pivot][c]);
    if (std::fabs(a[i][i]) <= degenerate) continue;  // a degenerate term stays 0
    for (size_t r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = a[r][i] / a[i][i];
      for (size_t c = i; c <= n; ++c) a[r][c] -= f * a[i][c];
    }
  }
  std::array<double, kTerms> coef{};
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(a[i][i]) > degenerate) coef[cols[i]] = a[i][n] / a[i][i] / scale[cols[i]];
  }
  return coef;
}

std::string Format(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string DescribeCostTerms(const LinearCost& cost) {
  return Format("%.1f us", cost.fixed_us) + " + " + Format("%.2f us/tensor", cost.per_tensor_us) +
         " + " + Format("%.3f ns/B", cost.per_byte_us * 1e3);
}

struct PieceExtremes {
  const PieceSample* whole = nullptr;
  const PieceSample* fastest = nullptr;  // of the samples in pieces; the first of equals
};

PieceExtremes FindPieceExtremes(const std::vector<PieceSample>& samples) {
  PieceExtremes found;
  for (const PieceSample& s : samples) {
    if (s.piece_bytes <= 0) {
      found.whole = &s;
    } else if (found.fastest == nullptr || s.us < found.fastest->us) {
      found.fastest = &s;
    }
  }
  return found;
}

}  // namespace

LinearCost FitLinearCost(const std::vector<CostSample>& samples, int terms) {
  std::array<bool, kTerms> use = {(terms & kFixed) != 0, (terms & kPerByte) != 0,
                                  (terms & kPerTensor) != 0};
  std::array<double, kTerms> coef{};
  for (int round = 0; round < kTerms; ++round) {
    coef = Solve(samples, use);
    bool dropped = false;
    for (int t = 0; t < kTerms; ++t) {
      if (use[t] && coef[t] < 0) {
        use[t] = false;
        dropped = true;
      }
    }
    if (!dropped) break;
  }
  for (double& c : coef) c = std::max(0.0, c);
  return {coef[0], coef[1], coef[2]};
}

int64_t InPlaceCutoff(const AllreduceCosts& costs) {
  // Alone:  in_place.fixed + in_place.per_tensor + in_place.per_byte x b
  // Fused:  fused.per_tensor + fused.per_byte x b   (the bucket's fixed cost is paid anyway)
  // Alone wins from b = (alone's fixed - fused's per tensor) / (fused's - alone's per byte), and
  // never when a byte costs no more fused than alone.
  const double fixed =
      costs.in_place.fixed_us + costs.in_place.per_tensor_us - costs.fused.per_tensor_us;
  const double slope = costs.fused.per_byte_us - costs.in_place.per_byte_us;
  if (slope <= 0) return kNeverInPlace;
  const double bytes = std::max(0.0, fixed) / slope;
  if (!(bytes < static_cast<double>(kNeverInPlace))) return kNeverInPlace;
  const int64_t granule = 4096;
  return std::max(kSmallestInPlace, (static_cast<int64_t>(bytes) / granule + 1) * granule);
}

int64_t PlannedInPlaceCutoff(const AllreduceCosts& costs, int64_t bucket_cap) {
  return std::max(kSmallestInPlace, std::min(InPlaceCutoff(costs), bucket_cap));
}

int64_t FusedBucketCap(const AllreduceCosts& costs, double largest_measured, int64_t configured,
                       int64_t cache_bytes) {
  constexpr double kFixedShare = 0.05;
  double cap = largest_measured;
  if (costs.fused.per_byte_us > 0) {
    cap = std::max(cap, costs.fused.fixed_us / (kFixedShare * costs.fused.per_byte_us));
  } else if (costs.fused.fixed_us > 0) {
    cap = static_cast<double>(configured);
  }
  if (cache_bytes > 0) cap = std::min(cap, std::max(largest_measured, cache_bytes / 2.0));
  if (!(cap < 0.9 * static_cast<double>(configured))) return configured;
  const int64_t granule = 1 << 20;
  return std::min(configured, (static_cast<int64_t>(cap) + granule - 1) / granule * granule);
}

int64_t HierarchicalFrom(const LinearCost& flat, const LinearCost& hierarchical) {
  // Across namespace hosts two calibrations minutes apart measured the hierarchical path 12% and
  // 20% cheaper per byte, while whole steps ran 1.2 to 1.3 times slower through it than flat: a
  // ladder's margin below a quarter is within its noise, and the wrong choice costs every step.
  constexpr double kRequiredShare = 0.75;
  const double slope = flat.per_byte_us - hierarchical.per_byte_us / kRequiredShare;
  if (slope <= 0) return kNeverInPlace;
  const double bytes = std::max(0.0, hierarchical.fixed_us + hierarchical.per_tensor_us -
                                         flat.fixed_us - flat.per_tensor_us) /
                       slope;
  if (!(bytes < static_cast<double>(kNeverInPlace))) return kNeverInPlace;
  const int64_t granule = 4096;
  return bytes == 0 ? 0 : (static_cast<int64_t>(bytes) / granule + 1) * granule;
}

int64_t ChoosePieceBytes(const std::vector<PieceSample>& samples) {
  const PieceExtremes found = FindPieceExtremes(samples);
  if (found.whole == nullptr || found.fastest == nullptr) return 0;
  return found.fastest->us <= found.whole->us * (1 - kPieceMargin) ? found.fastest->piece_bytes : 0;
}

std::string DescribePieceChoice(const std::vector<PieceSample>& samples, int64_t chosen) {
  const PieceExtremes found = FindPieceExtremes(samples);
  if (found.whole == nullptr || found.fastest == nullptr) return "whole (not measured)";
  const std::string probe = "a " + DescribeBytes(kPieceProbeBytes) + " allreduce: ";
  const double whole_ms = found.whole->us / 1e3;
  const double fastest_ms = found.fastest->us / 1e3;
  if (chosen > 0) {
    return "in pieces of " + DescribeBytes(chosen) + " (" + probe +
           Format("%.1f ms so, ", fastest_ms) + Format("%.1f ms whole)", whole_ms);
  }
  return "whole (" + probe + Format("%.1f ms whole, ", whole_ms) +
         Format("%.1f ms at best in pieces, of ", fastest_ms) +
         DescribeBytes(found.fastest->piece_bytes) + ")";
}

std::string DescribeCost(const LinearCost& cost) { return DescribeCostTerms(cost); }

std::string DescribeCosts(const AllreduceCosts& costs) {
  return "alone " + DescribeCost(costs.in_place) + "; fused " + DescribeCost(costs.fused);
}

std::string DescribeBytes(int64_t bytes) {
  if (bytes >= kNeverInPlace) return "never";
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return std::to_string(bytes >> 20) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace gradsync
