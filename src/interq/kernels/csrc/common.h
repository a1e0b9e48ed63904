// Shared by every kernel: torch's headers, float <-> bf16 / fp16 loads and stores with the eager
// conversions' roundings, a row's amax as torch gives it, the int8 code of a value and the per-row activation quantizer.
//
// Compiled with -ffp-contract=off: no multiply-add may be fused into an FMA (that would change roundings).
// Every float operation in these files is the one the eager chain performs, in the same order, except in
// causal_attention.h (fp32 of its own, to rounding).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline float load_f(float v) { return v; }
inline float load_f(c10::BFloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.x) << 16;  // bf16 -> fp32 is exact: the high half of the bits
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float load_f(c10::Half v) { return static_cast<float>(v); }

inline void store_f(float v, float* out) { *out = v; }
inline void store_f(float v, c10::BFloat16* out) {
  // round to nearest even, NaN -> 0x7FC0: what torch's fp32 -> bf16 conversion gives
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  uint16_t r = std::isnan(v) ? uint16_t(0x7FC0) : uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  out->x = r;
}
inline void store_f(float v, c10::Half* out) { *out = c10::Half(v); }

// A bf16 linear's optional bias [n] (checked; fn names the caller) in fp32 (exact), zero-padded to nb blocks of 16
// columns; empty without a bias
std::vector<float> bias_fp32(const char* fn, const c10::optional<torch::Tensor>& bias, int64_t n, int64_t nb) {
  std::vector<float> out;
  if (!bias.has_value() || !bias->defined()) return out;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kBFloat16 &&
                  bias->device().is_cpu(),
              fn, ": bias must be a bf16 CPU tensor [n]");
  const auto b = bias->contiguous();
  const c10::BFloat16* bp = b.data_ptr<c10::BFloat16>();
  out.assign(nb * 16, 0.f);
  for (int64_t j = 0; j < n; ++j) out[j] = load_f(bp[j]);
  return out;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// float -> bf16 -> float, rounded to nearest even as store_f, without its NaN branch (so that loops vectorize): for
// non-NaN values only; the callers report NaNs and leave them to the eager ops
inline float round_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  return bits_float(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}
#if defined(__AVX512F__) && defined(__AVX512BW__)
// the same three steps on 16 floats: bf16 -> float, round_to_bf16, and the high halves stored as bf16
inline __m512 load_bf16x16(const c10::BFloat16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 round_to_bf16x16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd);
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline void store_bf16x16(__m512 rounded, c10::BFloat16* p) {  // rounded: low halves zero (round_to_bf16x16)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rounded), 16)));
}
#endif

// the amax of |row| as torch's amax gives it: NaN if any element is NaN (the scalar loop; float16 rows)
template <typename T>
inline float row_amax(const T* row, int64_t k) {
  float amax = 0.f;
  bool nan = false;
  for (int64_t j = 0; j < k; ++j) {
    float a = std::fabs(load_f(row[j]));
    nan |= (a != a);
    amax = a > amax ? a : amax;
  }
  return nan ? NAN : amax;
}

// float32 and bfloat16 rows: the same value, 8 lanes at a time (GCC vector types: AVX2 and AVX-512 alike). The
// scalar loop's compare-and-select carries a dependency from element to element that the compiler does not
// vectorize; a maximum is exact whatever the order, and NaN is flagged as there, so the result is the same float.
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef uint16_t vh8 __attribute__((vector_size(16)));
inline vu8 load_bits8(const float* p) {
  vu8 u;
  std::memcpy(&u, p, sizeof u);
  return u;
}
inline vu8 load_bits8(const c10::BFloat16* p) {
  vh8 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vu8) << 16;  // bf16 -> fp32 bits, as load_f
}
template <typename T>
inline float row_amax_vec(const T* row, int64_t k) {
  vf8 m[4] = {};  // four running maxima side by side: each compare-and-select waits only for its own
  vi8 bad = {};
  int64_t j = 0;
  for (; j + 32 <= k; j += 32) {
    for (int a4 = 0; a4 < 4; ++a4) {
      vu8 u = load_bits8(row + j + 8 * a4) & 0x7fffffffu;  // |x|
      vf8 a;
      std::memcpy(&a, &u, sizeof a);
      bad |= (a != a);
      m[a4] = a > m[a4] ? a : m[a4];
    }
  }
  for (; j + 8 <= k; j += 8) {
    vu8 u = load_bits8(row + j) & 0x7fffffffu;
    vf8 a;
    std::memcpy(&a, &u, sizeof a);
    bad |= (a != a);
    m[0] = a > m[0] ? a : m[0];
  }
  float amax = 0.f;
  bool nan = false;
  for (int i = 0; i < 8; ++i) {
    nan |= bad[i] != 0;
    for (int a4 = 0; a4 < 4; ++a4) amax = m[a4][i] > amax ? m[a4][i] : amax;
  }
  for (; j < k; ++j) {
    float a = std::fabs(load_f(row[j]));
    nan |= (a != a);
    amax = a > amax ? a : amax;
  }
  return nan ? NAN : amax;
}
inline float row_amax(const float* row, int64_t k) { return row_amax_vec(row, k); }
inline float row_amax(const c10::BFloat16* row, int64_t k) { return row_amax_vec(row, k); }

// torch's round_() / trunc_() and clamp_(lo, hi) then .to(int8), for values already multiplied by the inverse scale
// (clamping first gives the same value: the bounds are integers)
inline int8_t to_code(float v, float lo, float hi, bool trunc) {
  v = v < lo ? lo : v;  // NaN stays NaN (as torch.clamp)
  v = v > hi ? hi : v;
  v = trunc ? std::trunc(v) : std::nearbyint(v);  // nearbyint: half to even in the default rounding mode
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

template <typename T>
void quant_rows(const T* x, int64_t rows, int64_t k, int64_t ld, int qmax, int8_t* q, float* s, int64_t ldq = -1) {
  if (ldq < 0) ldq = k;  // the codes' row stride (int8_linear_amx pads rows to the packed K)
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t m = 0; m < rows; ++m) {
    const T* row = x + m * ld;
    float amax = row_amax(row, k);
    // amax.reciprocal().mul_(qmax).masked_fill_(amax == 0, 0): a true division, then a multiply
    float inv = amax == 0.f ? 0.f : (1.0f / amax) * float(qmax);
    int8_t* qr = q + m * ldq;
    int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {  // to_code, 16 at a time
      const __m512 vinv = _mm512_set1_ps(inv), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
      for (; j + 16 <= k; j += 16) {
        __m512 v;
        if constexpr (std::is_same_v<T, float>) v = _mm512_loadu_ps(row + j);
        else v = load_bf16x16(row + j);
        v = _mm512_mul_ps(v, vinv);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, vlo, _CMP_LT_OQ), v, vlo);  // NaN stays NaN, as there
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, vhi, _CMP_GT_OQ), v, vhi);
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // nearbyint: half to even
        // truncating conversions as the scalar casts (NaN -> 0x80000000 -> 0)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + j), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
      }
    }
#endif
    for (; j < k; ++j) qr[j] = to_code(load_f(row[j]) * inv, lo, hi, false);
    s[m] = amax / float(qmax);
  }
}

}  // namespace
