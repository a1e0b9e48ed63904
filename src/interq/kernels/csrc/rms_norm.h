// torch's CPU float row sum in its own order, and transformers' Llama / Qwen RMSNorm of bf16 rows with it.
#pragma once

#include "common.h"

// ------------------------------------------------------------------------------------------------------------------
// RMSNorm of bf16 rows as transformers' Llama / Qwen modules compute it eagerly, bit for bit (interq.kernels.rms_norm):
//   h = x.float(); var = (h * h).sum(-1) / n; r = 1 / sqrt(var + eps); out = bf16(w * bf16(h * r))
// with torch's own summation order: its CPU sum of a contiguous row (SumKernel's vectorized inner sum) adds the row
// as vectors of `lanes` floats (8 with torch 2.13 on x86, its AVX512 capability included: the sum kernel runs its
// AVX2 build; the caller finds the width by test, interq.kernels.rms_norm.sum_lanes), four running
// accumulators side by side with a cascade of levels (row_sum / multi_row_sum), then the scalar tail, then the
// lanes in order; rows shorter than one vector are summed as scalars the same way. Every other step is one IEEE
// operation per element (torch.mean is sum then division on the CPU; torch.rsqrt is 1 / sqrt). Rows in parallel.
namespace {
int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

// acc[k][0..W) += data of the "row" i, element k: the rows are ilp = 4 consecutive groups of W floats
// (W = lanes: vectors; W = 1: scalars); size rows; returns the four partial sums (each W wide) in p. W is a
// template argument so that the lanes' additions compile to vector adds (the same IEEE additions, lane by lane).
template <int W>
void multi_row_sum4(const float* x, int64_t size, float* p) {
  constexpr int kLevels = 4, kRows = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power, level_mask = level_step - 1;
  float acc[kLevels][kRows][W];
  for (int l = 0; l < kLevels; ++l)
    for (int k = 0; k < kRows; ++k)
      for (int e = 0; e < W; ++e) acc[l][k][e] = 0.f;
  int64_t i = 0;
  for (; i + level_step <= size;) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < kRows; ++k)
        for (int e = 0; e < W; ++e) acc[0][k][e] += x[(i * kRows + k) * W + e];
    for (int l = 1; l < kLevels; ++l) {
      for (int k = 0; k < kRows; ++k)
        for (int e = 0; e < W; ++e) {
          acc[l][k][e] += acc[l - 1][k][e];
          acc[l - 1][k][e] = 0.f;
        }
      if ((i & (level_mask << (l * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < kRows; ++k)
      for (int e = 0; e < W; ++e) acc[0][k][e] += x[(i * kRows + k) * W + e];
  for (int l = 1; l < kLevels; ++l)
    for (int k = 0; k < kRows; ++k)
      for (int e = 0; e < W; ++e) acc[0][k][e] += acc[l][k][e];
  for (int k = 0; k < kRows; ++k)
    for (int e = 0; e < W; ++e) p[k * W + e] = acc[0][k][e];
}

template <int L>
float torch_row_sum_lanes(const float* x, int64_t n) {
  float p[4 * 16];
  if (n < L) {  // scalar_inner_sum: row_sum over scalars
    const int64_t size_ilp = n / 4;
    multi_row_sum4<1>(x, size_ilp, p);
    for (int64_t i = size_ilp * 4; i < n; ++i) p[0] += x[i];
    for (int k = 1; k < 4; ++k) p[0] += p[k];
    return p[0];
  }
  const int64_t nv = n / L, size_ilp = nv / 4;  // vectorized_inner_sum: row_sum over vectors
  multi_row_sum4<L>(x, size_ilp, p);
  for (int64_t i = size_ilp * 4; i < nv; ++i)
    for (int e = 0; e < L; ++e) p[e] += x[i * L + e];
  for (int k = 1; k < 4; ++k)
    for (int e = 0; e < L; ++e) p[e] += p[k * L + e];
  float total = 0.f;
  for (int64_t i = nv * L; i < n; ++i) total += x[i];
  for (int e = 0; e < L; ++e) total += p[e];
  return total;
}

// torch's CPU sum of a contiguous float row of n elements, for its Vectorized<float> of `lanes` floats
float torch_row_sum(const float* x, int64_t n, int64_t lanes) {
  return lanes == 16 ? torch_row_sum_lanes<16>(x, n) : torch_row_sum_lanes<8>(x, n);
}

void check_lanes(const char* fn, int64_t lanes) {
  TORCH_CHECK(lanes == 8 || lanes == 16, fn, ": lanes must be 8 (torch's AVX2 build) or 16 (AVX512), got ", lanes);
}
}  // namespace

// x [R, n] float, contiguous -> [R]: each row's sum in torch's CPU order (for the tests and the first-use check)
torch::Tensor torch_row_sums(torch::Tensor x, int64_t lanes) {
  check_lanes("torch_row_sums", lanes);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.device().is_cpu(),
              "torch_row_sums: x must be a 2-D float CPU tensor");
  x = x.contiguous();
  const int64_t r = x.size(0), n = x.size(1);
  auto out = torch::empty({r}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t i = 0; i < r; ++i) op[i] = torch_row_sum(xp + i * n, n, lanes);
  return out;
}

// x [..., n] bf16 contiguous, w [n] bf16, eps (a Python float: used as float, as torch adds it) -> (bf16 [..., n],
// whether any output is NaN: torch's vectorized ops write other NaN bits than store_f, so the caller recomputes such
// a call eagerly)
std::tuple<torch::Tensor, bool> rms_norm_bf16(torch::Tensor x, torch::Tensor w, double eps, int64_t lanes) {
  check_lanes("rms_norm_bf16", lanes);
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1,
              "rms_norm_bf16: x must be a contiguous bf16 CPU tensor");
  const int64_t n = x.size(-1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.scalar_type() == torch::kBFloat16 && w.device().is_cpu(),
              "rms_norm_bf16: w must be a bf16 CPU tensor [", n, "]");
  TORCH_CHECK(n > 0, "rms_norm_bf16: empty rows");
  const auto wc = w.contiguous();
  auto out = torch::empty_like(x);
  const int64_t rows = x.numel() / n;
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  const c10::BFloat16* wp = wc.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const float eps_f = static_cast<float>(eps), n_f = static_cast<float>(n);
  std::atomic<bool> any_nan{false};
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    std::vector<float> h(n), sq(n);
    bool nan = false;
    for (int64_t r = r0; r < r1; ++r) {
      const c10::BFloat16* row = xp + r * n;
      int64_t j0 = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      for (; j0 + 16 <= n; j0 += 16) {
        const __m512 hv = load_bf16x16(row + j0);
        _mm512_storeu_ps(h.data() + j0, hv);
        _mm512_storeu_ps(sq.data() + j0, _mm512_mul_ps(hv, hv));
      }
#endif
      for (int64_t j = j0; j < n; ++j) {
        h[j] = load_f(row[j]);
        sq[j] = h[j] * h[j];
      }
      const float var = torch_row_sum(sq.data(), n, lanes) / n_f;
      const float inv = 1.f / std::sqrt(var + eps_f);
      c10::BFloat16* dst = op + r * n;
      // the stores without store_f's NaN branch, so that the loop vectorizes: a NaN anywhere is reported and the
      // caller takes the eager ops (the rounding of every other value is store_f's)
      bool row_nan = false;
      int64_t j1 = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      {
        const __m512 vinv = _mm512_set1_ps(inv);
        __mmask16 nanm = 0;
        for (; j1 + 16 <= n; j1 += 16) {
          const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(h.data() + j1), vinv);
          const __m512 v = _mm512_mul_ps(load_bf16x16(wp + j1), round_to_bf16x16(t));
          nanm |= _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          store_bf16x16(round_to_bf16x16(v), dst + j1);
        }
        row_nan = nanm != 0;
      }
#endif
      for (int64_t j = j1; j < n; ++j) {
        const float t = h[j] * inv;
        const float v = load_f(wp[j]) * round_to_bf16(t);
        row_nan |= (t != t) | (v != v);
        dst[j].x = static_cast<uint16_t>(float_bits(round_to_bf16(v)) >> 16);
      }
      nan |= row_nan;
    }
    if (nan) any_nan = true;
  });
  return {out, any_nan.load()};
}
