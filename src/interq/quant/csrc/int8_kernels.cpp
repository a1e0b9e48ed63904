// interq's fused CPU kernels for the int8 executor (src/interq/quant/kernels.py builds and loads this file).
//
// Each kernel is one pass over memory that replaces a chain of eager PyTorch ops, with the SAME values, bit for
// bit (tests/test_quant_kernels.py compares them with the eager primitives on awkward inputs):
//   quant_act_int8: interq.quant.primitives.quant_act_int8_token, rounding half_even (vLLM dynamic_scaled_int8_quant)
//   epilogue:       interq.quant.linear.epilogue without bias (CUTLASS ScaledEpilogue), one output per member
//                   of a fused q|k|v or gate|up group, each contiguous, already in the compute dtype
//   quant_kv_int8:  interq.quant.primitives.quant_kv for int8_per_token_head (store round or trunc)
//   dequant_kv_int8: interq.quant.primitives.dequant_kv for int8 codes with per-row scales (the cache read)
//   fake_quant_kv_int8: the forward value of interq.quant.primitives.fq_kv_ste for int8_per_token_head K or V
//                   (quantize, dequantize into t's dtype, plus the straight-through estimator's + 0), and the scales
//   fake_quant_act_int8: the forward value of interq.quant.primitives.fq_activation_ste for int8 activations
//                   (quantize, dequantize, plus the straight-through estimator's + 0), fp32
//   int8_gemm_vnni: torch._int_mm's exact int32 accumulator from weights packed by pack_int8_vnni (AVX512-VNNI)
//   int8_gemm_avx2: the same accumulator from the same packed weights on AVX2 without VNNI (int16 products)
//   int8_gemm_amx:  the same accumulator from the same packed weights by AMX-INT8 tiles, any number of rows
//   int8_linear_amx: quant_act_int8, int8_gemm_amx and epilogue in one call, the same values
//   int8_linear_avx2: quant_act_int8, int8_gemm_avx2 and epilogue in one call, the same values
//   bf16_linear_amx: F.linear of bf16 by AMX-BF16 tiles, oneDNN's sums where the caller's probe says so
//   bf16_linear_avx2: F.linear of bf16 where torch runs its reference kernel (no native bf16), its sums, 16 columns at once
//   rms_norm_bf16:  transformers' Llama / Qwen RMSNorm of bf16 rows with torch's summation order (interq.quant.rms_norm)
//   flash_decode_amx: torch's CPU flash attention of bf16 decode rows (oneDNN's AMX-BF16 sums), in one call
//   kv_append:      a decode step's KV cache write (copied or fake-quantized rows) into the buffers' spare columns
//   rope_bf16:      transformers' Llama rotary embedding of bf16 query and key rows, its eager ops' roundings
//   uniform_f64_rows / race_argmax: the sampler's uniforms (Tensor.uniform_'s) and its (probs / race).argmax
//   decode_attention: NOT an eager chain's bits: one-token GQA attention in fp32 for rollout.attention=packed_kernel
//   causal_attention_fwd / _bwd: NOT an eager chain's bits: the learner's causal GQA attention and its gradient,
//                   fp32, for train.learner_attention=kernel (at the end of this file)
//   masked_attention: NOT an eager chain's bits: the rollout's masked prefill attention, fp32 inside, for
//                   rollout.attention=packed_kernel (at the end of this file)
// Compiled with -ffp-contract=off: no multiply-add may be fused into an FMA (that would change roundings).
// Every float operation below is the one the eager chain performs, in the same order.

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

// x [M, K] (float32, bfloat16 or float16; rows may be strided, columns contiguous) -> (q int8 [M, K], s fp32 [M, 1])
std::vector<torch::Tensor> quant_act_int8(torch::Tensor x, int64_t qmax) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "quant_act_int8: x must be a 2-D CPU tensor");
  if (x.stride(1) != 1) x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), ld = x.stride(0);
  auto q = torch::empty({m, k}, x.options().dtype(torch::kInt8));
  auto s = torch::empty({m, 1}, x.options().dtype(torch::kFloat32));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  switch (x.scalar_type()) {
    case torch::kFloat32: quant_rows(x.data_ptr<float>(), m, k, ld, qm, qp, sp); break;
    case torch::kBFloat16: quant_rows(x.data_ptr<c10::BFloat16>(), m, k, ld, qm, qp, sp); break;
    case torch::kHalf: quant_rows(x.data_ptr<c10::Half>(), m, k, ld, qm, qp, sp); break;
    default: TORCH_CHECK(false, "quant_act_int8: dtype must be float32, bfloat16 or float16, got ", x.scalar_type());
  }
  return {q, s};
}

namespace {
template <typename T>
void fake_quant_rows(const T* x, int64_t rows, int64_t k, int64_t ld, int qmax, float* out) {
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t m = 0; m < rows; ++m) {
    const T* row = x + m * ld;
    const float amax = row_amax(row, k);
    float* o = out + m * k;
    if (!std::isfinite(amax)) {  // a NaN or inf in the row: the eager chain gives NaN everywhere (codes * NaN|inf
      for (int64_t j = 0; j < k; ++j) o[j] = NAN;  // scale, plus x - x = NaN), whatever the codes were
      continue;
    }
    const float inv = amax == 0.f ? 0.f : (1.0f / amax) * float(qmax);
    const float sc = amax / float(qmax);
    // q.float() * s, then + (x - x.detach()) = + 0 (-0 would become +0, as in the eager straight-through sum).
    // The code is kept as a float: with a finite amax every value here is finite, so the clamped, rounded value is
    // already the integer code (the int8 round trip of to_code is the identity on it), and the loop vectorizes.
    for (int64_t j = 0; j < k; ++j) {
      float v = load_f(row[j]) * inv;
      v = v < lo ? lo : v;
      v = v > hi ? hi : v;
      o[j] = std::nearbyint(v) * sc + 0.0f;
    }
  }
}
}  // namespace

// x [M, K] (rows may be strided) -> fp32 [M, K]: the dequantized per-token int8 activation (half-even rounding)
torch::Tensor fake_quant_act_int8(torch::Tensor x, int64_t qmax) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "fake_quant_act_int8: x must be a 2-D CPU tensor");
  if (x.stride(1) != 1) x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), ld = x.stride(0);
  auto out = torch::empty({m, k}, x.options().dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  switch (x.scalar_type()) {
    case torch::kFloat32: fake_quant_rows(x.data_ptr<float>(), m, k, ld, qm, op); break;
    case torch::kBFloat16: fake_quant_rows(x.data_ptr<c10::BFloat16>(), m, k, ld, qm, op); break;
    case torch::kHalf: fake_quant_rows(x.data_ptr<c10::Half>(), m, k, ld, qm, op); break;
    default: TORCH_CHECK(false, "fake_quant_act_int8: dtype must be float32, bfloat16 or float16, got ", x.scalar_type());
  }
  return out;
}

namespace {
template <typename O>
void epilogue_rows(const int32_t* acc, int64_t ld, const float* s_a, const float* s_w, bool s_w_scalar,
                   int64_t rows, int64_t col0, int64_t n, O* out) {
  for (int64_t m = 0; m < rows; ++m) {
    const int32_t* a = acc + m * ld + col0;
    const float sa = s_a[m];
    O* o = out + m * n;
    if (s_w_scalar) {
      const float sw = s_w[0];
      for (int64_t j = 0; j < n; ++j) store_f((static_cast<float>(a[j]) * sw) * sa, o + j);
    } else {
      const float* sw = s_w + col0;
      for (int64_t j = 0; j < n; ++j) store_f((static_cast<float>(a[j]) * sw[j]) * sa, o + j);
    }
  }
}
}  // namespace

// acc int32 [M, >= sum(sizes)] (rows may be strided), s_a fp32 [M, 1], s_w fp32 [N] or [] ->
// one contiguous [M, sizes[i]] tensor per member, dtype out_dtype: out((s_w * float(acc)) * s_a)
std::vector<torch::Tensor> epilogue(torch::Tensor acc, torch::Tensor s_a, torch::Tensor s_w,
                                    std::vector<int64_t> sizes, torch::ScalarType out_dtype) {
  TORCH_CHECK(acc.dim() == 2 && acc.scalar_type() == torch::kInt32 && acc.device().is_cpu(),
              "epilogue: acc must be a 2-D int32 CPU tensor");
  if (acc.stride(1) != 1) acc = acc.contiguous();
  s_a = s_a.contiguous();
  s_w = s_w.contiguous();
  TORCH_CHECK(s_a.scalar_type() == torch::kFloat32 && s_w.scalar_type() == torch::kFloat32, "epilogue: fp32 scales");
  const int64_t m = acc.size(0);
  TORCH_CHECK(s_a.numel() == m, "epilogue: s_a must hold one scale per row");
  int64_t total = 0;
  for (auto n : sizes) total += n;
  TORCH_CHECK(total <= acc.size(1), "epilogue: the members' sizes exceed the accumulator's columns");
  const bool scalar = s_w.numel() == 1;  // [] or [1]: broadcast over the columns, as torch.mul does
  TORCH_CHECK(scalar || s_w.numel() >= total, "epilogue: s_w must be a scalar or hold one scale per column");
  std::vector<torch::Tensor> outs;
  int64_t col0 = 0;
  for (auto n : sizes) {
    auto o = torch::empty({m, n}, acc.options().dtype(out_dtype));
    const int32_t* ap = acc.data_ptr<int32_t>();
    const float* sap = s_a.data_ptr<float>();
    const float* swp = s_w.data_ptr<float>();
    switch (out_dtype) {
      case torch::kFloat32: epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<float>()); break;
      case torch::kBFloat16:
        epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<c10::BFloat16>());
        break;
      case torch::kHalf: epilogue_rows(ap, acc.stride(0), sap, swp, scalar, m, col0, n, o.data_ptr<c10::Half>()); break;
      default: TORCH_CHECK(false, "epilogue: out_dtype must be float32, bfloat16 or float16");
    }
    outs.push_back(o);
    col0 += n;
  }
  return outs;
}

namespace {
template <typename T>
void quant_kv_rows(const T* t, int64_t rows, int64_t d, int qmax, bool trunc, float min_scale, int8_t* q, float* s) {
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = t + r * d;
    float sc = row_amax(row, d) / float(qmax);  // amax.float().div_(qmax).clamp_(min=1e-6)
    sc = sc < min_scale ? min_scale : sc;       // (NaN stays NaN)
    const float inv = 1.0f / sc;                // s.reciprocal()
    int8_t* qr = q + r * d;
    for (int64_t j = 0; j < d; ++j) qr[j] = to_code(load_f(row[j]) * inv, lo, hi, trunc);
    s[r] = sc;
  }
}
}  // namespace

// t [..., D] contiguous -> (q int8 [..., D], s fp32 [..., 1]): per row s = max(amax/qmax, min_scale),
// q = round|trunc(clamp(t * (1/s), -(qmax+1), qmax))
std::vector<torch::Tensor> quant_kv_int8(torch::Tensor t, int64_t qmax, bool trunc, double min_scale) {
  TORCH_CHECK(t.dim() >= 1 && t.device().is_cpu(), "quant_kv_int8: t must be a CPU tensor");
  t = t.contiguous();
  const int64_t d = t.size(-1), rows = d ? t.numel() / d : 0;
  auto q = torch::empty(t.sizes(), t.options().dtype(torch::kInt8));
  auto sshape = t.sizes().vec();
  sshape.back() = 1;
  auto s = torch::empty(sshape, t.options().dtype(torch::kFloat32));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  const float ms = static_cast<float>(min_scale);
  switch (t.scalar_type()) {
    case torch::kFloat32: quant_kv_rows(t.data_ptr<float>(), rows, d, qm, trunc, ms, qp, sp); break;
    case torch::kBFloat16: quant_kv_rows(t.data_ptr<c10::BFloat16>(), rows, d, qm, trunc, ms, qp, sp); break;
    case torch::kHalf: quant_kv_rows(t.data_ptr<c10::Half>(), rows, d, qm, trunc, ms, qp, sp); break;
    default: TORCH_CHECK(false, "quant_kv_int8: dtype must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
  return {q, s};
}

namespace {
template <typename O>
void dequant_rows(const int8_t* q, const float* s, int64_t rows, int64_t d, O* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float sc = s[r];
    const int8_t* qr = q + r * d;
    O* o = out + r * d;
    for (int64_t j = 0; j < d; ++j) store_f(static_cast<float>(qr[j]) * sc, o + j);  // torch.mul(q, s).to(dtype)
  }
}
}  // namespace

// q int8 [..., D], s fp32 [..., 1] (one scale per row) -> [..., D] out_dtype: out(float(q) * s)
torch::Tensor dequant_kv_int8(torch::Tensor q, torch::Tensor s, torch::ScalarType out_dtype) {
  TORCH_CHECK(q.scalar_type() == torch::kInt8 && q.device().is_cpu() && q.dim() >= 1,
              "dequant_kv_int8: q must be an int8 CPU tensor");
  TORCH_CHECK(s.scalar_type() == torch::kFloat32 && s.dim() == q.dim() && s.size(-1) == 1,
              "dequant_kv_int8: s must be fp32 with q's shape and a last dimension of 1");
  q = q.contiguous();
  s = s.contiguous();
  const int64_t d = q.size(-1), rows = d ? q.numel() / d : 0;
  TORCH_CHECK(s.numel() == rows, "dequant_kv_int8: one scale per row of q");
  auto out = torch::empty(q.sizes(), q.options().dtype(out_dtype));
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  switch (out_dtype) {
    case torch::kFloat32: dequant_rows(qp, sp, rows, d, out.data_ptr<float>()); break;
    case torch::kBFloat16: dequant_rows(qp, sp, rows, d, out.data_ptr<c10::BFloat16>()); break;
    case torch::kHalf: dequant_rows(qp, sp, rows, d, out.data_ptr<c10::Half>()); break;
    default: TORCH_CHECK(false, "dequant_kv_int8: out_dtype must be float32, bfloat16 or float16");
  }
  return out;
}

namespace {
template <typename T>
void fake_quant_kv_rows(const T* t, int64_t rows, int64_t d, int qmax, bool trunc, float min_scale, T* out,
                        float* s) {
  const float lo = -float(qmax + 1), hi = float(qmax);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = t + r * d;
    const float amax = row_amax(row, d);
    float sc = amax / float(qmax);
    sc = sc < min_scale ? min_scale : sc;
    s[r] = sc;
    T* o = out + r * d;
    if (!std::isfinite(amax)) {  // NaN or inf in the row: NaN everywhere, as the eager chain gives
      for (int64_t j = 0; j < d; ++j) store_f(NAN, o + j);
      continue;
    }
    const float inv = 1.0f / sc;
    for (int64_t j = 0; j < d; ++j) {
      const float code = static_cast<float>(to_code(load_f(row[j]) * inv, lo, hi, trunc));
      // dequant_kv: float(q) * s rounded to t's dtype; then + (t - t) * keep = + 0 in t's dtype (-0 -> +0)
      T v;
      store_f(code * sc, &v);
      store_f(load_f(v) + 0.0f, o + j);
    }
  }
}
}  // namespace

// t [..., D] -> (fake-quantized t in t's dtype, s fp32 [..., 1])
std::vector<torch::Tensor> fake_quant_kv_int8(torch::Tensor t, int64_t qmax, bool trunc, double min_scale) {
  TORCH_CHECK(t.dim() >= 1 && t.device().is_cpu(), "fake_quant_kv_int8: t must be a CPU tensor");
  t = t.contiguous();
  const int64_t d = t.size(-1), rows = d ? t.numel() / d : 0;
  auto out = torch::empty(t.sizes(), t.options());
  auto sshape = t.sizes().vec();
  sshape.back() = 1;
  auto s = torch::empty(sshape, t.options().dtype(torch::kFloat32));
  float* sp = s.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  const float ms = static_cast<float>(min_scale);
  switch (t.scalar_type()) {
    case torch::kFloat32:
      fake_quant_kv_rows(t.data_ptr<float>(), rows, d, qm, trunc, ms, out.data_ptr<float>(), sp);
      break;
    case torch::kBFloat16:
      fake_quant_kv_rows(t.data_ptr<c10::BFloat16>(), rows, d, qm, trunc, ms, out.data_ptr<c10::BFloat16>(), sp);
      break;
    case torch::kHalf:
      fake_quant_kv_rows(t.data_ptr<c10::Half>(), rows, d, qm, trunc, ms, out.data_ptr<c10::Half>(), sp);
      break;
    default: TORCH_CHECK(false, "fake_quant_kv_int8: dtype must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
  return {out, s};
}

// ------------------------------------------------------------------------------------------------------------------
// kv_append: a decode step's KV cache write (interq.rollout.kv_buffer, interq.quant.kv_cache) in one call. For each
// pair i, new[i] [B, H, n, D] is written after the cur[i].size(-2) columns already in buf[i] [B, H, C, D] (cur[i] a
// prefix view of buf[i]: append_columns' in-place case), as it is (fake_quant = false: the copy of append_columns)
// or fake-quantized row by row (fake_quant_kv_int8's values: the 8-bit cache that keeps only dequantized values);
// -> the prefix views [B, H, T + n, D], or nothing when any pair is not the in-place case (the caller then takes the
// eager path, which may grow the buffer).
namespace {
bool kv_in_place(const torch::Tensor& buf, const torch::Tensor& cur, const torch::Tensor& nw) {
  if (!buf.defined() || !cur.defined() || !nw.defined() || buf.dim() != 4 || cur.dim() != 4 || nw.dim() != 4)
    return false;
  if (!buf.device().is_cpu() || !nw.device().is_cpu() || !buf.is_contiguous() || nw.stride(3) != 1) return false;
  const auto dt = buf.scalar_type();
  if (nw.scalar_type() != dt || cur.scalar_type() != dt) return false;
  if (dt != torch::kFloat32 && dt != torch::kBFloat16 && dt != torch::kHalf) return false;
  if (buf.requires_grad() || cur.requires_grad() || nw.requires_grad()) return false;
  if (!c10::InferenceMode::is_enabled() && buf.is_inference()) return false;  // an inference buffer, written outside
  if (cur.numel() == 0 || cur.data_ptr() != buf.data_ptr() || cur.strides() != buf.strides()) return false;
  for (int d : {0, 1, 3})
    if (cur.size(d) != buf.size(d) || nw.size(d) != buf.size(d)) return false;
  return cur.size(2) + nw.size(2) <= buf.size(2);
}

template <typename T>
void kv_write(const torch::Tensor& buf, int64_t length, const torch::Tensor& nw, bool fake_quant, int qmax, bool trunc,
              float min_scale) {
  const int64_t b = nw.size(0), h = nw.size(1), n = nw.size(2), d = nw.size(3), cap = buf.size(2);
  const T* src = nw.data_ptr<T>();
  T* dst = buf.data_ptr<T>();
  const int64_t sb = nw.stride(0), sh = nw.stride(1), sn = nw.stride(2);
  at::parallel_for(0, b * h * n, 64, [&](int64_t r0, int64_t r1) {  // rows (i, j, t) over the threads
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r / (h * n), j = (r / n) % h, t = r % n;
      const T* row = src + i * sb + j * sh + t * sn;
      T* out = dst + ((i * h + j) * cap + length + t) * d;
      if (fake_quant) {
        float scale;
        fake_quant_kv_rows(row, 1, d, qmax, trunc, min_scale, out, &scale);
      } else {
        std::memcpy(out, row, d * sizeof(T));
      }
    }
  });
  buf.unsafeGetTensorImpl()->bump_version();  // an in-place write, as copy_'s (autograd's saved views see it)
}
}  // namespace

std::vector<torch::Tensor> kv_append(std::vector<torch::Tensor> bufs, std::vector<torch::Tensor> curs,
                                     std::vector<torch::Tensor> news, bool fake_quant, int64_t qmax, bool trunc,
                                     double min_scale) {
  TORCH_CHECK(bufs.size() == curs.size() && curs.size() == news.size(), "kv_append: one buffer, view and tensor per pair");
  for (size_t i = 0; i < bufs.size(); ++i)
    if (!kv_in_place(bufs[i], curs[i], news[i])) return {};
  std::vector<torch::Tensor> views;
  for (size_t i = 0; i < bufs.size(); ++i) {
    const int64_t length = curs[i].size(2);
    switch (bufs[i].scalar_type()) {
      case torch::kFloat32:
        kv_write<float>(bufs[i], length, news[i], fake_quant, int(qmax), trunc, float(min_scale));
        break;
      case torch::kBFloat16:
        kv_write<c10::BFloat16>(bufs[i], length, news[i], fake_quant, int(qmax), trunc, float(min_scale));
        break;
      case torch::kHalf:
        kv_write<c10::Half>(bufs[i], length, news[i], fake_quant, int(qmax), trunc, float(min_scale));
        break;
      default: TORCH_CHECK(false, "kv_append: unreachable dtype");  // kv_in_place takes these three only
    }
    views.push_back(bufs[i].narrow(2, 0, length + news[i].size(2)));
  }
  return views;
}

// ------------------------------------------------------------------------------------------------------------------
// int8 x int8 -> int32 GEMM for few activation rows (decode), AVX512-VNNI.
//
// acc[m, n] = sum_k a[m, k] * w[k, n], exact in int32 like torch._int_mm (integer arithmetic: any order gives the same
// value). vpdpbusd multiplies unsigned by signed bytes, four at a time, into int32 lanes without saturation. The
// weights are stored unsigned (w + 128) in 16-column blocks, four k at a time: packed[n / 16][k / 4][n % 16][k % 4],
// so one 64-byte load feeds 16 columns; the activation's four signed bytes are broadcast. The offset adds
// 128 * sum_k a[m, k] to every column of row m, subtracted at the end (|acc| < 2^31 for K < 2^16).
// Each thread streams its own column panels once (16 x 2 columns, every row tile of up to 12 rows; the weights are
// prefetched ahead): at decode the weights come from memory and torch._int_mm reads them about half as fast.

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define INTERQ_VNNI_GEMM 1
#else
#define INTERQ_VNNI_GEMM 0
#endif

bool has_int8_gemm_vnni() { return INTERQ_VNNI_GEMM; }

// w_t [K, N] int8 (K a multiple of 4) -> packed uint8 [ceil(N / 16), K / 4, 16, 4]; the pad columns hold code 0
torch::Tensor pack_int8_vnni(torch::Tensor w_t) {
  TORCH_CHECK(w_t.dim() == 2 && w_t.device().is_cpu() && w_t.scalar_type() == torch::kInt8,
              "pack_int8_vnni: w_t must be a 2-D int8 CPU tensor");
  const int64_t k = w_t.size(0), n = w_t.size(1);
  TORCH_CHECK(k % 4 == 0, "pack_int8_vnni: K must be a multiple of 4, got ", k);
  w_t = w_t.contiguous();
  const int64_t nb = (n + 15) / 16, k4 = k / 4;
  auto out = torch::full({nb, k4, 16, 4}, 128, w_t.options().dtype(torch::kUInt8));
  const int8_t* w = w_t.data_ptr<int8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t c = 0; c < n; ++c)
      o[(((c / 16) * k4 + kk / 4) * 16 + c % 16) * 4 + kk % 4] = static_cast<uint8_t>(int(w[kk * n + c]) + 128);
  return out;
}

#if INTERQ_VNNI_GEMM
namespace {
constexpr int kVnniMaxRows = 12;   // rows per tile: 12 x 2 accumulators + 2 weight registers of the 32
constexpr int kVnniPrefetch = 32;  // 64-byte weight lines ahead (2 KiB): measured best of 0 / 8 / 32 / 64

template <int MT, int NB>
void vnni_tile(const int8_t* a, int64_t lda, const uint8_t* w, int64_t k4, int64_t ncols, const int32_t* offset,
               int32_t* out, int64_t ldo) {
  __m512i acc[MT][NB];
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_si512();
  const int64_t block = k4 * 64;  // bytes of one 16-column block
  for (int64_t q = 0; q < k4; ++q) {
    __m512i wv[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      wv[j] = _mm512_loadu_si512(static_cast<const void*>(w + j * block + q * 64));
      _mm_prefetch(reinterpret_cast<const char*>(w + j * block + (q + kVnniPrefetch) * 64), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int m = 0; m < MT; ++m) {
      int32_t four;
      std::memcpy(&four, a + m * lda + q * 4, sizeof four);
      const __m512i av = _mm512_set1_epi32(four);
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], wv[j], av);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m) {
    const __m512i off = _mm512_set1_epi32(offset[m]);
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      const int64_t left = ncols - 16 * j;
      if (left <= 0) break;
      const __m512i v = _mm512_sub_epi32(acc[m][j], off);
      int32_t* dst = out + m * ldo + 16 * j;
      if (left >= 16) _mm512_storeu_si512(static_cast<void*>(dst), v);
      else _mm512_mask_storeu_epi32(static_cast<void*>(dst), static_cast<__mmask16>((1u << left) - 1u), v);
    }
  }
}

template <int NB>
void vnni_rows(int rows, const int8_t* a, int64_t lda, const uint8_t* w, int64_t k4, int64_t ncols,
               const int32_t* offset, int32_t* out, int64_t ldo) {
  switch (rows) {
#define INTERQ_TILE(R) \
  case R: vnni_tile<R, NB>(a, lda, w, k4, ncols, offset, out, ldo); break;
    INTERQ_TILE(1) INTERQ_TILE(2) INTERQ_TILE(3) INTERQ_TILE(4) INTERQ_TILE(5) INTERQ_TILE(6)
    INTERQ_TILE(7) INTERQ_TILE(8) INTERQ_TILE(9) INTERQ_TILE(10) INTERQ_TILE(11) INTERQ_TILE(12)
#undef INTERQ_TILE
    default: TORCH_CHECK(false, "vnni_rows: tile of ", rows, " rows");
  }
}

// The checks both GEMMs on pack_int8_vnni's layout make of their arguments (fn names the caller in the messages)
void check_packed_gemm(const char* fn, const torch::Tensor& a, const torch::Tensor& packed, int64_t n) {
  TORCH_CHECK(a.dim() == 2 && a.device().is_cpu() && a.scalar_type() == torch::kInt8, fn,
              ": a must be a 2-D int8 CPU tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == 16 &&
                  packed.size(3) == 4 && packed.is_contiguous(),
              fn, ": packed must come from pack_int8_vnni");
  const int64_t k = a.size(1), nb = packed.size(0), k4 = packed.size(1);
  TORCH_CHECK(k == 4 * k4, fn, ": a has K = ", k, ", the packed weight ", 4 * k4);
  TORCH_CHECK(n > 16 * (nb - 1) && n <= 16 * nb, fn, ": n = ", n, " does not match ", nb, " blocks");
}

// sum_k a[r, k] of each row of a contiguous [m, k] int8 matrix: the unsigned weights' offset is 128 times it
std::vector<int32_t> row_sums(const int8_t* a, int64_t m, int64_t k) {
  std::vector<int32_t> sums(m);
  for (int64_t r = 0; r < m; ++r) {
    int32_t s = 0;
    for (int64_t j = 0; j < k; ++j) s += a[r * k + j];
    sums[r] = s;
  }
  return sums;
}
}  // namespace
#endif

// a [M, K] int8 (K = the packed K), packed from pack_int8_vnni, n = its true column count -> int32 [M, n]
torch::Tensor int8_gemm_vnni(torch::Tensor a, torch::Tensor packed, int64_t n) {
#if INTERQ_VNNI_GEMM
  check_packed_gemm("int8_gemm_vnni", a, packed, n);
  const int64_t m = a.size(0), k = a.size(1), nb = packed.size(0), k4 = packed.size(1);
  a = a.contiguous();
  auto out = torch::empty({m, n}, a.options().dtype(torch::kInt32));
  if (m == 0 || n == 0) return out;
  const int8_t* ap = a.data_ptr<int8_t>();
  std::vector<int32_t> offset = row_sums(ap, m, k);
  for (int32_t& o : offset) o *= 128;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  int32_t* op = out.data_ptr<int32_t>();
  const int64_t panels = (nb + 1) / 2;  // two 16-column blocks each
  const int64_t tiles = (m + kVnniMaxRows - 1) / kVnniMaxRows;
  const int64_t rows_per_tile = (m + tiles - 1) / tiles;  // balanced: 16 rows are two tiles of 8
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = 2 * p, ncols = std::min<int64_t>(n - 16 * b, 32);
      const uint8_t* w = wp + b * k4 * 64;
      for (int64_t r0 = 0; r0 < m; r0 += rows_per_tile) {
        const int rows = static_cast<int>(std::min<int64_t>(rows_per_tile, m - r0));
        if (nb - b >= 2)
          vnni_rows<2>(rows, ap + r0 * k, k, w, k4, ncols, offset.data() + r0, op + r0 * n + 16 * b, n);
        else
          vnni_rows<1>(rows, ap + r0 * k, k, w, k4, ncols, offset.data() + r0, op + r0 * n + 16 * b, n);
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "int8_gemm_vnni: this build has no AVX512-VNNI (see has_int8_gemm_vnni)");
  return a;
#endif
}

// ------------------------------------------------------------------------------------------------------------------
// int8 x int8 -> int32 GEMM on AVX2 without VNNI (the int8 executor's backend on CPUs without AVX-512 such as AMD
// Zen 2 / 3 and Intel's client CPUs, where torch._int_mm takes a slow reference path), from the SAME packed weights as
// int8_gemm_vnni.
//
// AVX2 multiplies bytes only with saturation (vpmaddubsw), so the codes are widened to int16 and multiplied by
// vpmaddwd, which sums adjacent int16 products into int32 exactly: a 16-byte quarter of a packed 64-byte line (four
// columns of four k each) widens to 16 int16, the row's four activation codes (as int16) are broadcast, and vpmaddwd
// leaves two partial sums per column (k0 + k1, k2 + k3) in 32-bit lanes, added up at the end of the tile. The same
// offset as int8_gemm_vnni: the weights are stored + 128, so 128 * sum_k a[m, k] is subtracted at the end. Integer
// arithmetic throughout: exact, any order, the values of torch._int_mm. Tiles of up to 3 rows x 8 columns (half a
// packed line: 6 accumulators, 3 activation and 2 weight registers of the 16, none spilled; 3 rows x 16 columns
// spilled 9 of its 12 accumulators to the stack, 4 x 8 one, and a spilled accumulator's store-to-load round trip
// bounds every iteration: 0.80-1.3x fp32_exact's time at 2,240 rows instead of 1.3x); each thread streams its own
// 16-column panels, the weights read once from memory and again from cache for the other row tiles.

#if defined(__AVX2__)
#include <immintrin.h>
#define INTERQ_AVX2_GEMM 1
#else
#define INTERQ_AVX2_GEMM 0
#endif

bool has_int8_gemm_avx2() { return INTERQ_AVX2_GEMM; }

#if INTERQ_AVX2_GEMM
namespace {
constexpr int kAvx2MaxRows = 3;  // rows per tile
constexpr int64_t kAvx2RowBlock = 30;  // 30 rows (10 tiles) of K = 1,536 int16 codes: 90 KiB, in the core's L2

// a16: int16 activation codes with row stride lda; w: half of one 16-column block of the packed weight (its columns
// 8h .. 8h + 7: 32 bytes of each of the k4 lines of 64 bytes), ncols <= 8 of them stored
template <int MT>
void avx2_tile(const int16_t* a16, int64_t lda, const uint8_t* w, int64_t k4, int64_t ncols, const int32_t* offset,
               int32_t* out, int64_t ldo) {
  __m256i acc[MT][2];
#pragma GCC unroll 4
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  for (int64_t q = 0; q < k4; ++q) {
    __m256i av[MT];
#pragma GCC unroll 4
    for (int m = 0; m < MT; ++m) {
      int64_t four;  // the row's four int16 codes of k = 4q .. 4q + 3
      std::memcpy(&four, a16 + m * lda + q * 4, sizeof four);
      av[m] = _mm256_set1_epi64x(four);
    }
    const uint8_t* line = w + q * 64;
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {  // four columns each
      const __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(line + 16 * p)));
#pragma GCC unroll 4
      for (int m = 0; m < MT; ++m) acc[m][p] = _mm256_add_epi32(acc[m][p], _mm256_madd_epi16(wv, av[m]));
    }
  }
  for (int m = 0; m < MT; ++m) {
    alignas(32) int32_t lanes[16];  // per quarter p: (column, half) pairs, 8 lanes
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[m][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 8), acc[m][1]);
    for (int64_t c = 0; c < ncols; ++c) out[m * ldo + c] = lanes[2 * c] + lanes[2 * c + 1] - offset[m];
  }
}
}  // namespace
#endif

// a [M, K] int8 (K = the packed K), packed from pack_int8_vnni, n = its true column count -> int32 [M, n], the values
// of int8_gemm_vnni and torch._int_mm
torch::Tensor int8_gemm_avx2(torch::Tensor a, torch::Tensor packed, int64_t n) {
#if INTERQ_AVX2_GEMM
  TORCH_CHECK(a.dim() == 2 && a.device().is_cpu() && a.scalar_type() == torch::kInt8,
              "int8_gemm_avx2: a must be a 2-D int8 CPU tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == 16 &&
                  packed.size(3) == 4 && packed.is_contiguous() && packed.device().is_cpu(),
              "int8_gemm_avx2: packed must come from pack_int8_vnni (a CPU tensor)");
  const int64_t m = a.size(0), k = a.size(1), nb = packed.size(0), k4 = packed.size(1);
  TORCH_CHECK(k == 4 * k4, "int8_gemm_avx2: a has K = ", k, ", the packed weight ", 4 * k4);
  TORCH_CHECK(n >= 1 && n <= 16 * nb, "int8_gemm_avx2: n = ", n, " does not match ", nb, " blocks");  // the first n
  a = a.contiguous();
  auto out = torch::empty({m, n}, a.options().dtype(torch::kInt32));
  if (m == 0 || n == 0) return out;
  const int8_t* ap = a.data_ptr<int8_t>();
  std::vector<int16_t> a16(m * k);
  std::vector<int32_t> offset(m, 0);
  for (int64_t r = 0; r < m; ++r) {
    int32_t s = 0;
    for (int64_t j = 0; j < k; ++j) {
      a16[r * k + j] = ap[r * k + j];
      s += ap[r * k + j];
    }
    offset[r] = 128 * s;
  }
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  int32_t* op = out.data_ptr<int32_t>();
  // rows in blocks of kAvx2RowBlock, each block's int16 codes kept in cache while the thread's column blocks pass
  // over them (at prefill sizes, re-reading all rows for every 8 columns was slower than fp32_exact); each block
  // split into balanced tiles of at most kAvx2MaxRows rows
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t rb = 0; rb < m; rb += kAvx2RowBlock) {
      const int64_t rend = std::min<int64_t>(m, rb + kAvx2RowBlock);
      const int64_t tiles = (rend - rb + kAvx2MaxRows - 1) / kAvx2MaxRows;
      const int64_t rows_per_tile = (rend - rb + tiles - 1) / tiles;
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t h = 0; h < 2; ++h) {  // the block's two halves of 8 columns
          const int64_t ncols = std::min<int64_t>(n - 16 * b - 8 * h, 8);
          if (ncols <= 0) break;
          const uint8_t* w = wp + b * k4 * 64 + 32 * h;
          for (int64_t r0 = rb; r0 < rend; r0 += rows_per_tile) {
          const int rows = static_cast<int>(std::min<int64_t>(rows_per_tile, rend - r0));
          const int16_t* ar = a16.data() + r0 * k;
          int32_t* o = op + r0 * n + 16 * b + 8 * h;
          switch (rows) {
            case 1: avx2_tile<1>(ar, k, w, k4, ncols, offset.data() + r0, o, n); break;
            case 2: avx2_tile<2>(ar, k, w, k4, ncols, offset.data() + r0, o, n); break;
            case 3: avx2_tile<3>(ar, k, w, k4, ncols, offset.data() + r0, o, n); break;
            default: avx2_tile<4>(ar, k, w, k4, ncols, offset.data() + r0, o, n); break;
          }
          }
        }
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "int8_gemm_avx2: this build has no AVX2 (see has_int8_gemm_avx2)");
  return a;
#endif
}

// x [M, K] (float32, bfloat16 or float16), packed from pack_int8_vnni of the codes [Kp, Np] (K <= Kp), s_w fp32
// [>= sum(sizes)] or one scale, sizes: the members' columns, qmax: the activation codes' bound -> one contiguous
// [M, sizes[i]] tensor per member in out_dtype: quant_act_int8, int8_gemm_avx2 (the codes zero-padded to Kp) and
// epilogue called in turn, as interq.quant.linear calls them for the avx2 backend, without the Python between them
std::vector<torch::Tensor> int8_linear_avx2(torch::Tensor x, torch::Tensor packed, torch::Tensor s_w,
                                            std::vector<int64_t> sizes, int64_t qmax, torch::ScalarType out_dtype) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4, "int8_linear_avx2: x must be 2-D and packed from pack_int8_vnni");
  const int64_t k = x.size(1), kp = 4 * packed.size(1);
  TORCH_CHECK(k <= kp, "int8_linear_avx2: x has K = ", k, ", more than the packed ", kp);
  int64_t total = 0;
  for (auto n : sizes) total += n;
  auto qs = quant_act_int8(x, qmax);  // {codes [M, K], s_a [M, 1]}
  const torch::Tensor q = k == kp ? qs[0] : torch::constant_pad_nd(qs[0], {0, kp - k});
  return epilogue(int8_gemm_avx2(q, packed, total), qs[1], s_w, sizes, out_dtype);
}

// ------------------------------------------------------------------------------------------------------------------
// int8 x int8 -> int32 GEMM by AMX tiles (CPUs with AMX-INT8: Intel Sapphire Rapids and later), any number of rows.
//
// The same exact accumulator as torch._int_mm and int8_gemm_vnni, from the SAME packed weights: one 16-column block
// of pack_int8_vnni over 64 k (16 rows of 64 bytes: four k of 16 columns each) is exactly an AMX weight tile, so
// tdpbsud (signed activation bytes times the unsigned stored weights, four at a time, into int32 without saturation)
// multiplies a 16-row x 64-k activation tile by it. The accumulator tiles start at -128 * sum_k a[m, k] (the offset
// the unsigned weights add), so they hold the result when stored. K must be a multiple of 64 (a tile's depth); the
// caller uses int8_gemm_vnni otherwise. Each thread configures its own tiles (the Linux kernel must first permit the
// process to use them: amx_permitted) and computes blocks of 32 rows x 32 columns (four accumulator tiles, two of
// activations, two of weights: the eight tile registers), split over the threads as amx_blocks says.

#if INTERQ_VNNI_GEMM && defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define INTERQ_AMX_GEMM 1
#else
#define INTERQ_AMX_GEMM 0
#endif

#if INTERQ_AMX_GEMM
namespace {
// Linux (5.16+) gives a process AMX's tile data only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA)
bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0, 1: accumulators of row tile 0 (column blocks 0, 1); 2, 3: of row tile 1; 4, 5: activations of row tiles
// 0, 1; 6, 7: weights of column blocks 0, 1. rows1 = 0: one row tile (its tiles stay unconfigured).
void amx_configure(int rows0, int rows1) {
  AmxConfig c;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows[t]);
    c.colsb[t] = rows[t] ? 64 : 0;
  }
  _tile_loadconfig(&c);
}

// One block: up to 32 rows (R2: two row tiles) x 16 or 32 columns (C2: two column blocks), over kc chunks of 64 k.
// init: the accumulators' start, [32][16] int32 (row r: -offset of row r); out: int32, row stride ldo elements.
template <bool R2, bool C2>
void amx_block(const int8_t* a, int64_t lda, const uint8_t* w0, const uint8_t* w1, int64_t kc, const int32_t* init,
               int32_t* out, int64_t ldo) {
  _tile_loadd(0, init, 64);
  if (C2) _tile_loadd(1, init, 64);
  if (R2) _tile_loadd(2, init + 256, 64);
  if (R2 && C2) _tile_loadd(3, init + 256, 64);
  for (int64_t c = 0; c < kc; ++c) {
    _tile_loadd(4, a + c * 64, lda);
    _tile_loadd(6, w0 + c * 1024, 64);
    _tile_dpbsud(0, 4, 6);
    if (R2) {
      _tile_loadd(5, a + 16 * lda + c * 64, lda);
      _tile_dpbsud(2, 5, 6);
    }
    if (C2) {
      _tile_loadd(7, w1 + c * 1024, 64);
      _tile_dpbsud(1, 4, 7);
      if (R2) _tile_dpbsud(3, 5, 7);
    }
  }
  const int64_t stride = ldo * 4;
  _tile_stored(0, out, stride);
  if (C2) _tile_stored(1, out + 16, stride);
  if (R2) _tile_stored(2, out + 16 * ldo, stride);
  if (R2 && C2) _tile_stored(3, out + 16 * ldo + 16, stride);
}

// Weight bytes a thread keeps in its L2 cache while every row block passes over them (AMX Xeons have 2 MB per core)
constexpr int64_t kAmxL2WeightBytes = 1 << 20;

// f(r2, c2) with r2 / c2 as compile-time bools (std::integral_constant): the block templates' four tile shapes
template <typename F>
void amx_shape(bool r2, bool c2, F&& f) {
  if (r2) {
    if (c2) f(std::true_type{}, std::true_type{});
    else f(std::true_type{}, std::false_type{});
  } else {
    if (c2) f(std::false_type{}, std::true_type{});
    else f(std::false_type{}, std::false_type{});
  }
}

// The work split every AMX GEMM here shares: panels of 32 columns (two column blocks of 16) over the threads; a
// thread takes its panels in groups of about kAmxL2WeightBytes of weights (panel_bytes each), which stay in its L2
// cache while every row block of 32 passes over them: each row block's activations are read once per group and its
// outputs written in rows of the group's width. (Looping over all rows inside each panel instead, the activations
// and the output's column strips left the caches from a few hundred rows on: 0.4 TOPS at 1,920 rows against 1.3,
// one core of a Xeon with AMX, SmolLM2-135M's shapes.) Each thread configures its tiles for the row count of the
// block (amx_configure) and releases them at the end. block(rb, rows, b, c2, scratch): row block rb of `rows` rows,
// column blocks b and b + 1 (c2: whether b + 1 exists), scratch: the thread's 64-byte aligned 8 KB.
template <typename Block>
void amx_blocks(int64_t m, int64_t nb, int64_t panel_bytes, Block&& block) {
  const int64_t mb = (m + 31) / 32, panels = (nb + 1) / 2;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) unsigned char scratch[2 * 32 * 32 * 4] = {};
    int config = -1;  // the rows of the last row block configured (32 = two full tiles)
    const int64_t group = std::max<int64_t>(1, kAmxL2WeightBytes / panel_bytes);
    for (int64_t g0 = p0; g0 < p1; g0 += group) {
      for (int64_t rb = 0; rb < mb; ++rb) {
        const int rows = static_cast<int>(std::min<int64_t>(32, m - 32 * rb));
        if (rows != config) {
          amx_configure(std::min(rows, 16), std::max(rows - 16, 0));
          config = rows;
        }
        for (int64_t p = g0; p < std::min(p1, g0 + group); ++p) block(rb, rows, 2 * p, nb - 2 * p >= 2, scratch);
      }
    }
    if (config != -1) _tile_release();
  });
}
}  // namespace
#endif

bool has_int8_gemm_amx() {
#if INTERQ_AMX_GEMM
  return amx_permitted();
#else
  return false;
#endif
}

// a [M, K] int8 (K a multiple of 64, = the packed K), packed from pack_int8_vnni, n = its true column count ->
// int32 [M, n], the values of int8_gemm_vnni and torch._int_mm
torch::Tensor int8_gemm_amx(torch::Tensor a, torch::Tensor packed, int64_t n) {
#if INTERQ_AMX_GEMM
  TORCH_CHECK(amx_permitted(), "int8_gemm_amx: the Linux kernel does not let this process use AMX tiles");
  check_packed_gemm("int8_gemm_amx", a, packed, n);
  const int64_t m = a.size(0), k = a.size(1), nb = packed.size(0), k4 = packed.size(1);
  TORCH_CHECK(k % 64 == 0, "int8_gemm_amx: K must be a multiple of 64, got ", k);
  a = a.contiguous();
  auto out = torch::empty({m, n}, a.options().dtype(torch::kInt32));
  if (m == 0 || n == 0) return out;
  const int8_t* ap = a.data_ptr<int8_t>();
  const int64_t mb = (m + 31) / 32;  // row blocks of 32
  // each row's accumulator start, -128 * sum_k a[m, k], as a 16-wide tile row; 32 more zero rows past the end
  std::vector<int32_t> init((mb * 32) * 16, 0);
  const std::vector<int32_t> sums = row_sums(ap, m, k);
  for (int64_t r = 0; r < m; ++r) std::fill_n(init.begin() + r * 16, 16, -128 * sums[r]);
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  int32_t* op = out.data_ptr<int32_t>();
  const int64_t kc = k / 64, full_cols = n / 16;  // column blocks stored in place
  amx_blocks(m, nb, 32 * k, [&](int64_t rb, int rows, int64_t b, bool c2, unsigned char* buf) {
    int32_t* scratch = reinterpret_cast<int32_t*>(buf);  // a block whose columns pass n: stored here, then copied
    const bool in_place = b + (c2 ? 2 : 1) <= full_cols;
    const uint8_t* w0 = wp + b * k4 * 64;
    const uint8_t* w1 = c2 ? w0 + k4 * 64 : w0;
    int32_t* dst = in_place ? op + 32 * rb * n + 16 * b : scratch;
    const int64_t ldo = in_place ? n : 32;
    amx_shape(rows > 16, c2, [&](auto r2, auto c2v) {
      amx_block<decltype(r2)::value, decltype(c2v)::value>(ap + 32 * rb * k, k, w0, w1, kc,
                                                           init.data() + 32 * rb * 16, dst, ldo);
    });
    if (!in_place) {
      const int64_t cols = std::min<int64_t>(n - 16 * b, 32);
      for (int r = 0; r < rows; ++r)
        std::memcpy(op + (32 * rb + r) * n + 16 * b, scratch + r * 32, cols * sizeof(int32_t));
    }
  });
  return out;
#else
  TORCH_CHECK(false, "int8_gemm_amx: this build has no AMX-INT8 (see has_int8_gemm_amx)");
  return a;
#endif
}

// ------------------------------------------------------------------------------------------------------------------
// The whole W8A8 linear (or fused q|k|v / gate|up group) in one call on AMX: quant_act_int8 of the rows, the
// int8_gemm_amx accumulator, then the epilogue of each member, with the SAME values as those three kernels (the
// same per-row and per-element code), but the rows quantized over the threads, and each 32 x 32 block of the
// accumulator turned into the members' outputs while it is in the cache (no int32 [M, N] in memory). At decode
// sizes the three calls' fixed costs were most of a group's time (SmolLM2 gate|up at 16 rows: 9 + 38 + 24 us of
// kernels, 85-120 us called in turn).

#if INTERQ_AMX_GEMM
namespace {
template <typename T>
void quant_rows_padded(const T* x, int64_t m, int64_t k, int64_t kp, int qmax, int8_t* q, float* s) {
  at::parallel_for(0, m, std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1)), [&](int64_t r0, int64_t r1) {
    quant_rows(x + r0 * k, r1 - r0, k, k, qmax, q + r0 * kp, s + r0, kp);
  });
}

template <typename O>
void epilogue_block(const int32_t* acc, int rows, int64_t row0, int64_t col0, int64_t cols, const float* s_a,
                    const float* s_w, bool s_w_scalar, const std::vector<int64_t>& starts,
                    const std::vector<int64_t>& sizes, const std::vector<O*>& outs) {
  for (size_t i = 0; i < sizes.size(); ++i) {  // the block's columns [col0, col0 + cols) of each member
    const int64_t lo = std::max(col0, starts[i]), hi = std::min(col0 + cols, starts[i] + sizes[i]);
    if (lo >= hi) continue;
    for (int r = 0; r < rows; ++r) {
      const int32_t* a = acc + r * 32 + (lo - col0);
      const float sa = s_a[row0 + r];
      O* o = outs[i] + (row0 + r) * sizes[i] + (lo - starts[i]);
      int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      if constexpr (std::is_same_v<O, c10::BFloat16>) {  // 16 at a time: the same products, store_f's rounding
        const __m512 vsa = _mm512_set1_ps(sa);
        for (; j + 16 <= hi - lo; j += 16) {
          const __m512 w = s_w_scalar ? _mm512_set1_ps(s_w[0]) : _mm512_loadu_ps(s_w + lo + j);
          const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + j)), w), vsa);
          const __m512i u = _mm512_castps_si512(v);
          const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
          __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
          r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j), _mm512_cvtepi32_epi16(r));
        }
      }
#endif
      if (s_w_scalar) {
        const float sw = s_w[0];
        for (; j < hi - lo; ++j) store_f((static_cast<float>(a[j]) * sw) * sa, o + j);
      } else {
        const float* sw = s_w + lo;
        for (; j < hi - lo; ++j) store_f((static_cast<float>(a[j]) * sw[j]) * sa, o + j);
      }
    }
  }
}

template <typename T, typename O>
void int8_linear_amx_impl(const T* x, int64_t m, int64_t k, const uint8_t* wp, int64_t nb, int64_t kp, int qmax,
                          const float* s_w, bool s_w_scalar, const std::vector<int64_t>& sizes,
                          const std::vector<O*>& outs) {
  std::vector<int8_t> q(m * kp, 0);  // the codes, zero-padded to the packed K
  std::vector<float> s_a(m);
  quant_rows_padded(x, m, k, kp, qmax, q.data(), s_a.data());
  const int64_t mb = (m + 31) / 32, kc = kp / 64;
  std::vector<int32_t> init((mb * 32) * 16, 0);
  const std::vector<int32_t> sums = row_sums(q.data(), m, kp);
  for (int64_t r = 0; r < m; ++r) std::fill_n(init.begin() + r * 16, 16, -128 * sums[r]);
  std::vector<int64_t> starts(sizes.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    starts[i] = total;
    total += sizes[i];
  }
  amx_blocks(m, nb, 32 * kp, [&](int64_t rb, int rows, int64_t b, bool c2, unsigned char* buf) {
    int32_t* scratch = reinterpret_cast<int32_t*>(buf);
    const uint8_t* w0 = wp + b * kp * 16;
    const uint8_t* w1 = c2 ? w0 + kp * 16 : w0;
    amx_shape(rows > 16, c2, [&](auto r2, auto c2v) {
      amx_block<decltype(r2)::value, decltype(c2v)::value>(q.data() + 32 * rb * kp, kp, w0, w1, kc,
                                                           init.data() + 32 * rb * 16, scratch, 32);
    });
    const int64_t cols = std::min<int64_t>(total - 16 * b, 32);
    if (cols > 0) epilogue_block(scratch, rows, 32 * rb, 16 * b, cols, s_a.data(), s_w, s_w_scalar, starts, sizes, outs);
  });
}
}  // namespace
#endif

// x [M, K] (float32, bfloat16 or float16, contiguous), packed from pack_int8_vnni of the group's codes [Kp, Np]
// (Kp a multiple of 64), s_w fp32 [>= sum(sizes)] or one scale, sizes: the members' columns, qmax: the activation
// codes' bound -> one contiguous [M, sizes[i]] tensor per member in out_dtype: the values of quant_act_int8,
// int8_gemm_amx and epilogue called in turn
std::vector<torch::Tensor> int8_linear_amx(torch::Tensor x, torch::Tensor packed, torch::Tensor s_w,
                                           std::vector<int64_t> sizes, int64_t qmax, torch::ScalarType out_dtype) {
#if INTERQ_AMX_GEMM
  TORCH_CHECK(amx_permitted(), "int8_linear_amx: the Linux kernel does not let this process use AMX tiles");
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous(), "int8_linear_amx: x must be a contiguous 2-D CPU tensor");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == 16 &&
                  packed.size(3) == 4 && packed.is_contiguous() && packed.device().is_cpu(),
              "int8_linear_amx: packed must come from pack_int8_vnni (a CPU tensor)");
  const int64_t m = x.size(0), k = x.size(1), nb = packed.size(0), kp = 4 * packed.size(1);
  TORCH_CHECK(kp % 64 == 0 && k <= kp, "int8_linear_amx: the packed K (", kp, ") must be a multiple of 64, >= K = ", k);
  int64_t total = 0;
  for (auto n : sizes) total += n;
  TORCH_CHECK(total <= 16 * nb, "int8_linear_amx: the members' sizes exceed the packed columns");
  s_w = s_w.contiguous();
  TORCH_CHECK(s_w.scalar_type() == torch::kFloat32 && s_w.device().is_cpu(), "int8_linear_amx: fp32 CPU weight scales");
  const bool scalar = s_w.numel() == 1;
  TORCH_CHECK(scalar || s_w.numel() >= total, "int8_linear_amx: s_w must be a scalar or hold one scale per column");
  std::vector<torch::Tensor> outs;
  for (auto n : sizes) outs.push_back(torch::empty({m, n}, x.options().dtype(out_dtype)));
  if (m == 0) return outs;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const float* swp = s_w.data_ptr<float>();
  const int qm = static_cast<int>(qmax);
  auto run = [&](auto* xp) {
    switch (out_dtype) {
      case torch::kFloat32: {
        std::vector<float*> o;
        for (auto& t : outs) o.push_back(t.data_ptr<float>());
        int8_linear_amx_impl(xp, m, k, wp, nb, kp, qm, swp, scalar, sizes, o);
        break;
      }
      case torch::kBFloat16: {
        std::vector<c10::BFloat16*> o;
        for (auto& t : outs) o.push_back(t.data_ptr<c10::BFloat16>());
        int8_linear_amx_impl(xp, m, k, wp, nb, kp, qm, swp, scalar, sizes, o);
        break;
      }
      case torch::kHalf: {
        std::vector<c10::Half*> o;
        for (auto& t : outs) o.push_back(t.data_ptr<c10::Half>());
        int8_linear_amx_impl(xp, m, k, wp, nb, kp, qm, swp, scalar, sizes, o);
        break;
      }
      default: TORCH_CHECK(false, "int8_linear_amx: out_dtype must be float32, bfloat16 or float16");
    }
  };
  switch (x.scalar_type()) {
    case torch::kFloat32: run(x.data_ptr<float>()); break;
    case torch::kBFloat16: run(x.data_ptr<c10::BFloat16>()); break;
    case torch::kHalf: run(x.data_ptr<c10::Half>()); break;
    default: TORCH_CHECK(false, "int8_linear_amx: dtype must be float32, bfloat16 or float16, got ", x.scalar_type());
  }
  return outs;
#else
  TORCH_CHECK(false, "int8_linear_amx: this build has no AMX-INT8 (see has_int8_gemm_amx)");
  return {};
#endif
}

// ------------------------------------------------------------------------------------------------------------------
// bf16 x bf16 -> bf16 linear by AMX-BF16 tiles (interq.quant.packed_linear): F.linear's bits where oneDNN's are these.
//
// out[m, n] = bf16(sum_k x[m, k] w[n, k] (+ bias[n])), the sum in fp32 tile accumulators, k in chunks of 32 (one
// tdpbf16ps per 16 x 16 output tile and chunk, in k order), in K blocks of kb chunks (kb = 0: one block): each
// block is summed from zero in the tiles and added to the running fp32 total in k order, as oneDNN's brgemm does
// where it splits K (which it does, or not, by the shape, the row count and the threads: the caller compares this
// product with F.linear's on a probe and passes the kb that gives its bits, never assuming one). The bias is added
// in fp32 to the total, which is rounded to bf16 by vcvtneps2bf16 (round to nearest even), as oneDNN does.
// Weights packed by interq.quant.packed_linear.pack_bf16_amx: [ceil(N / 16), K / 2, 16, 2] bf16, one column block's
// 32 k (16 rows of 64 bytes: pairs of k for 16 columns) exactly an AMX weight tile. K a multiple of 32. The work is
// split by amx_blocks, as int8_gemm_amx's;
// K is never split over threads, so the result does not depend on the thread count. At decode sizes (16 rows,
// SmolLM2-135M's layers) this is 2.3-5x oneDNN's packed product per call, whose fixed cost dominates there.

#if INTERQ_AMX_GEMM && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define INTERQ_AMX_BF16 1
#else
#define INTERQ_AMX_BF16 0
#endif

#if INTERQ_AMX_BF16
namespace {
// One block as amx_block's (same tiles and configuration), bf16 pairs into fp32 accumulators started at zero, over
// kc chunks of 32 k; stores the fp32 sums to out (row stride ldo elements).
template <bool R2, bool C2>
void amx_bf16_block(const uint16_t* a, int64_t lda, const uint16_t* w0, const uint16_t* w1, int64_t kc, float* out,
                    int64_t ldo) {
  _tile_zero(0);
  if (C2) _tile_zero(1);
  if (R2) _tile_zero(2);
  if (R2 && C2) _tile_zero(3);
  for (int64_t c = 0; c < kc; ++c) {
    _tile_loadd(4, a + c * 32, lda * 2);
    _tile_loadd(6, w0 + c * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (R2) {
      _tile_loadd(5, a + 16 * lda + c * 32, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
    }
    if (C2) {
      _tile_loadd(7, w1 + c * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
      if (R2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t stride = ldo * 4;
  _tile_stored(0, out, stride);
  if (C2) _tile_stored(1, out + 16, stride);
  if (R2) _tile_stored(2, out + 16 * ldo, stride);
  if (R2 && C2) _tile_stored(3, out + 16 * ldo + 16, stride);
}

template <bool R2, bool C2>
void amx_bf16_blocks(const uint16_t* a, int64_t lda, const uint16_t* w0, const uint16_t* w1, int64_t kc, int64_t kb,
                     float* total, float* part) {
  for (int64_t c0 = 0; c0 < kc; c0 += kb) {
    const int64_t cc = std::min(kb, kc - c0);
    amx_bf16_block<R2, C2>(a + c0 * 32, lda, w0 + c0 * 512, w1 + c0 * 512, cc, c0 == 0 ? total : part, 32);
    if (c0 != 0)
      for (int i = 0; i < 32 * 32; ++i) total[i] = total[i] + part[i];
  }
}
}  // namespace
#endif

bool has_bf16_gemm_amx() {
#if INTERQ_AMX_BF16
  return amx_permitted();
#else
  return false;
#endif
}

// x [M, K] bf16 contiguous (K a multiple of 32), packed [ceil(n / 16), K / 2, 16, 2] bf16, bias [n] bf16 or
// undefined, kb: chunks of 32 k per K block (0: none) -> bf16 [M, n]
torch::Tensor bf16_linear_amx(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias,
                              int64_t kb) {
#if INTERQ_AMX_BF16
  TORCH_CHECK(amx_permitted(), "bf16_linear_amx: the Linux kernel does not let this process use AMX tiles");
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(),
              "bf16_linear_amx: x must be a contiguous 2-D bf16 CPU tensor");
  const int64_t m = x.size(0), k = x.size(1), nb = packed.size(0);
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.size(1) * 2 == k &&
                  packed.size(2) == 16 && packed.size(3) == 2 && packed.is_contiguous() && packed.device().is_cpu(),
              "bf16_linear_amx: packed must come from pack_bf16_amx for K = ", k);
  TORCH_CHECK(k % 32 == 0, "bf16_linear_amx: K must be a multiple of 32, got ", k);
  TORCH_CHECK(n > 16 * (nb - 1) && n <= 16 * nb, "bf16_linear_amx: n = ", n, " does not match ", nb, " blocks");
  TORCH_CHECK(kb >= 0, "bf16_linear_amx: kb must be >= 0, got ", kb);
  auto out = torch::empty({m, n}, x.options());
  if (m == 0 || n == 0) return out;
  const std::vector<float> bf = bias_fp32("bf16_linear_amx", bias, n, nb);
  const bool has_bias = !bf.empty();
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int64_t kc = k / 32, kbb = kb > 0 ? std::min(kb, kc) : kc;
  amx_blocks(m, nb, 32 * k * 2, [&](int64_t rb, int rows, int64_t b, bool c2, unsigned char* buf) {
    float* total = reinterpret_cast<float*>(buf);  // zeroed: the entries a block does not store are still added
    float* part = total + 32 * 32;
    const uint16_t* w0 = wp + b * k * 16;
    const uint16_t* w1 = c2 ? w0 + k * 16 : w0;
    amx_shape(rows > 16, c2, [&](auto r2, auto c2v) {
      amx_bf16_blocks<decltype(r2)::value, decltype(c2v)::value>(xp + 32 * rb * k, k, w0, w1, kc, kbb, total, part);
    });
    const int64_t cols = std::min<int64_t>(n - 16 * b, 32);
    for (int r = 0; r < rows; ++r) {
      uint16_t* dst = op + (32 * rb + r) * n + 16 * b;
      for (int64_t j = 0; j < cols; j += 16) {
        const __mmask16 keep = static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - j)) - 1u);
        __m512 v = _mm512_load_ps(total + r * 32 + j);
        if (has_bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bf.data() + 16 * b + j));
        _mm256_mask_storeu_epi16(dst + j, keep, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "bf16_linear_amx: this build has no AMX-BF16 (see has_bf16_gemm_amx)");
  return x;
#endif
}

// ------------------------------------------------------------------------------------------------------------------
// F.linear of bf16 on CPUs without native bf16 (AVX2: torch's bf16 GEMM is then its own reference kernel), bit for bit.
//
// There torch computes each output as one dot product of the weight row and the input row with fp32 arithmetic
// (bf16_dot_with_fp32_arith): 8 vector accumulators of 8 lanes take the products of each block of 64 k by fused
// multiply-add (slot s = k % 64 of the block), so that every slot is a running sum over the blocks in order; the 64
// slots are then added in a fixed tree (accumulator r + r + 4, + 2, + 1, then lanes l + l + 4, + 2, + 1); a tail of
// 16-k chunks goes into one more 8-lane accumulator (slot (k - tail start) % 8), added in the same lane tree; the last
// k % 16 products are added one by one; bias (bf16 -> fp32) + that sum is rounded to bf16. A product of two bf16 values
// is exact in fp32, so each fused multiply-add rounds once, like any add of it. The same values come out when the
// outputs are computed 16 columns at a time (vectors across columns instead of across k): each slot's running sum is
// one fused multiply-add per block as before, and the tree is evaluated leaf by leaf with a stack (a binary counter),
// leaves taken in bit-reversed slot order, which is the order in which that tree pairs them. The weight is packed
// (interq.quant.packed_linear.pack_bf16_avx2) as [ceil(N / 16), K, 16] bf16 with k in the order the slots consume
// them; the input rows are permuted to the same order in fp32. Tiles of up to 6 rows x 16 columns (12 accumulators).
// The caller's probe (product_choice) checks these bits against F.linear's before any use.

#if defined(__AVX2__) && defined(__FMA__)
#define INTERQ_BF16_AVX2 1
#else
#define INTERQ_BF16_AVX2 0
#endif

bool has_bf16_linear_avx2() { return INTERQ_BF16_AVX2; }

// The order in which bf16_linear_avx2 consumes k (pack_bf16_avx2 packs the weight in it): for each slot s of the
// 64-k blocks, in bit-reversed order, that slot's k of every block in turn; then the 16-k chunks' 8 slots the same way
// (3 bits); then the last k % 16 in order
std::vector<int64_t> bf16_avx2_order(int64_t k) {
  std::vector<int64_t> order;
  order.reserve(k);
  const int64_t blocks = k / 64, main = 64 * blocks, vec = main + 16 * ((k % 64) / 16);
  auto reversed = [](int64_t t, int bits) {
    int64_t r = 0;
    for (int i = 0; i < bits; ++i) r |= ((t >> i) & 1) << (bits - 1 - i);
    return r;
  };
  if (blocks > 0)
    for (int64_t t = 0; t < 64; ++t)
      for (int64_t b = 0; b < blocks; ++b) order.push_back(64 * b + reversed(t, 6));
  if (vec > main)
    for (int64_t t = 0; t < 8; ++t)
      for (int64_t c = 0; c < (vec - main) / 8; ++c) order.push_back(main + 8 * c + reversed(t, 3));
  for (int64_t q = vec; q < k; ++q) order.push_back(q);
  return order;
}

torch::Tensor bf16_avx2_k_order(int64_t k) {
  TORCH_CHECK(k >= 0, "bf16_avx2_k_order: k must be >= 0, got ", k);
  const std::vector<int64_t> order = bf16_avx2_order(k);
  return torch::tensor(order, torch::kInt64);
}

#if INTERQ_BF16_AVX2
namespace {
constexpr int kBf16Avx2MaxRows = 6;

inline __m256 load_bf16x8(const uint16_t* p) {  // 8 bf16 -> 8 fp32 (exact)
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// One tree of 2^levels slots, each the running sum over `count` consecutive k of the packed order: x rows
// (xp, ldx), weight lines (w: 16 bf16 per k) -> the tree's value for each row and 16 columns in value[m].
template <int MT>
void bf16_avx2_tree(const float* xp, int64_t ldx, const uint16_t* w, int levels, int64_t count, __m256 (*value)[2]) {
  __m256 stack[MT][2][7];
  const int leaves = 1 << levels;
  for (int t = 0; t < leaves; ++t) {
    __m256 acc[MT][2];
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    const int64_t base = static_cast<int64_t>(t) * count;
    for (int64_t c = 0; c < count; ++c) {
      const uint16_t* line = w + (base + c) * 16;
      const __m256 w0 = load_bf16x8(line), w1 = load_bf16x8(line + 8);
#pragma GCC unroll 6
      for (int m = 0; m < MT; ++m) {
        const __m256 xv = _mm256_broadcast_ss(xp + m * ldx + base + c);
        acc[m][0] = _mm256_fmadd_ps(xv, w0, acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(xv, w1, acc[m][1]);
      }
    }
    int lvl = 0;  // binary counter: leaf t closes one subtree per trailing one bit of t
    for (; (t >> lvl) & 1; ++lvl) {
#pragma GCC unroll 6
      for (int m = 0; m < MT; ++m) {
        acc[m][0] = _mm256_add_ps(stack[m][0][lvl], acc[m][0]);
        acc[m][1] = _mm256_add_ps(stack[m][1][lvl], acc[m][1]);
      }
    }
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) {
      stack[m][0][lvl] = acc[m][0];
      stack[m][1][lvl] = acc[m][1];
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) {
    value[m][0] = stack[m][0][levels];
    value[m][1] = stack[m][1][levels];
  }
}

template <int MT>
void bf16_avx2_tile(const float* xp, int64_t k, const uint16_t* w, int64_t ncols, const float* bias,
                    c10::BFloat16* out, int64_t ldo) {
  const int64_t blocks = k / 64, chunks = (k % 64) / 16, main = 64 * blocks, vec = main + 16 * chunks;
  __m256 total[MT][2], tail[MT][2];  // the main loop's tree (0 without blocks), the chunks' (0 without chunks)
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) total[m][0] = total[m][1] = tail[m][0] = tail[m][1] = _mm256_setzero_ps();
  if (blocks > 0) bf16_avx2_tree<MT>(xp, k, w, 6, blocks, total);
  if (chunks > 0) bf16_avx2_tree<MT>(xp + main, k, w + main * 16, 3, 2 * chunks, tail);
  alignas(32) float lanes[16];
  for (int m = 0; m < MT; ++m) {
    _mm256_store_ps(lanes, _mm256_add_ps(total[m][0], tail[m][0]));
    _mm256_store_ps(lanes + 8, _mm256_add_ps(total[m][1], tail[m][1]));
    for (int64_t j = 0; j < ncols; ++j) {
      float v = lanes[j];
      for (int64_t q = vec; q < k; ++q)  // the last k % 16 products, one by one
        v += xp[m * k + q] * load_f(c10::BFloat16(w[q * 16 + j], c10::BFloat16::from_bits()));
      if (bias != nullptr) v = bias[j] + v;
      store_f(v, out + m * ldo + j);
    }
  }
}
}  // namespace
#endif

// x [M, K] bf16, packed from pack_bf16_avx2 ([ceil(n / 16), K, 16] bf16), bias [n] bf16 or none -> [M, n] bf16: the
// values of F.linear(x, w, bias) where torch multiplies bf16 by its reference kernel (CPUs without native bf16)
torch::Tensor bf16_linear_avx2(torch::Tensor x, torch::Tensor packed, int64_t n, c10::optional<torch::Tensor> bias) {
#if INTERQ_BF16_AVX2
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == torch::kBFloat16,
              "bf16_linear_avx2: x must be a 2-D bf16 CPU tensor");
  const int64_t m = x.size(0), k = x.size(1), nb = packed.size(0);
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kBFloat16 && packed.size(1) == k &&
                  packed.size(2) == 16 && packed.is_contiguous() && packed.device().is_cpu(),
              "bf16_linear_avx2: packed must come from pack_bf16_avx2 for K = ", k);
  TORCH_CHECK(n > 16 * (nb - 1) && n <= 16 * nb, "bf16_linear_avx2: n = ", n, " does not match ", nb, " blocks");
  auto out = torch::empty({m, n}, x.options());
  if (m == 0 || n == 0) return out;
  const std::vector<float> bf = bias_fp32("bf16_linear_avx2", bias, n, nb);
  const bool has_bias = !bf.empty();
  // the input rows in fp32, k in the packed order: per block of 64 the slots in bit-reversed order, each slot's k of
  // every block in turn; then the 16-k chunks' 8 slots the same way (3 bits); then the rest in order
  const auto xc = x.contiguous();
  const c10::BFloat16* xs = xc.data_ptr<c10::BFloat16>();
  std::vector<int64_t> order = bf16_avx2_order(k);
  std::vector<float> xp(m * k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t q = 0; q < k; ++q) xp[r * k + q] = load_f(xs[r * k + order[q]]);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int64_t tiles = (m + kBf16Avx2MaxRows - 1) / kBf16Avx2MaxRows;
  const int64_t rows_per_tile = (m + tiles - 1) / tiles;
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t ncols = std::min<int64_t>(n - 16 * b, 16);
      const uint16_t* w = wp + b * k * 16;
      const float* bias_b = has_bias ? bf.data() + 16 * b : nullptr;
      for (int64_t r0 = 0; r0 < m; r0 += rows_per_tile) {
        const int rows = static_cast<int>(std::min<int64_t>(rows_per_tile, m - r0));
        const float* xr = xp.data() + r0 * k;
        c10::BFloat16* o = op + r0 * n + 16 * b;
        switch (rows) {
#define INTERQ_TILE(R) \
  case R: bf16_avx2_tile<R>(xr, k, w, ncols, bias_b, o, n); break;
          INTERQ_TILE(1) INTERQ_TILE(2) INTERQ_TILE(3) INTERQ_TILE(4) INTERQ_TILE(5) INTERQ_TILE(6)
#undef INTERQ_TILE
          default: TORCH_CHECK(false, "bf16_linear_avx2: tile of ", rows, " rows");
        }
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "bf16_linear_avx2: this build has no AVX2 with FMA (see has_bf16_linear_avx2)");
  return x;
#endif
}

// ------------------------------------------------------------------------------------------------------------------
// RMSNorm of bf16 rows as transformers' Llama / Qwen modules compute it eagerly, bit for bit (interq.quant.rms_norm):
//   h = x.float(); var = (h * h).sum(-1) / n; r = 1 / sqrt(var + eps); out = bf16(w * bf16(h * r))
// with torch's own summation order: its CPU sum of a contiguous row (SumKernel's vectorized inner sum) adds the row
// as vectors of `lanes` floats (8 with torch 2.13 on x86, its AVX512 capability included: the sum kernel runs its
// AVX2 build; the caller finds the width by test, interq.quant.rms_norm.sum_lanes), four running
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

// ------------------------------------------------------------------------------------------------------------------
// Decode attention for grouped-query models (rollout.attention=packed_kernel): one new token per row.
//
// q [B, Hkv, G, D] (the G query heads of a KV head packed, as interq.rollout.attention's packed path lays them out),
// k, v [B, Hkv, K, D] (strided views of a growing cache are read in place), mask: none, bool [B|1, 1, 1, K] (true =
// attend) or additive float [B|1, 1, 1, K]. out [B, Hkv, G, D] in q's dtype. Per (row, KV head): the scores
// q . k_j * scale in fp32 (products of the inputs exact in fp32, summed 16 lanes at a time, the lanes added in a
// fixed order), softmax in fp32 (max subtracted), then sum_j p_j v_j in fp32 over keys in order, divided by the sum.
// Each K and V row is read once for all G query heads, where torch's flash kernel runs small blocks through GEMM
// calls. The same attention to rounding (not the same bits as torch's kernel: this is an opt-in choice).
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
namespace {
// On AVX2 without AVX-512 (AMD Zen 2 / 3, Intel client CPUs) GCC lowers 64-byte generic vectors lane by lane
// through the stack as soon as they are broadcast, compared, selected or split (the 2026-12-03 AVX2 machine ran the
// learner's attention kernel at 1/20 of torch's speed). There vf16 is two __m256 with the same operations, lane for
// lane the same IEEE operations in the same order (no contraction, exp16 step for step), so both builds give the
// same values; the block products have their own register tiles there (block_tiles below).
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// No lane access (operator[]): a lane read or written through memory kept every micro-kernel accumulator on the
// stack; lanes are read after store16 and masked by hide_after.
struct vf16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
inline vf16 mk16(__m256 lo, __m256 hi) { return vf16{lo, hi}; }
#define INTERQ_VF16_OP(op, fn)                                                              \
  inline vf16 operator op(vf16 a, vf16 b) { return mk16(fn(a.lo, b.lo), fn(a.hi, b.hi)); } \
  inline vf16 operator op(vf16 a, float s) {                                                \
    const __m256 b = _mm256_set1_ps(s);                                                     \
    return mk16(fn(a.lo, b), fn(a.hi, b));                                                  \
  }                                                                                         \
  inline vf16 operator op(float s, vf16 b) {                                                \
    const __m256 a = _mm256_set1_ps(s);                                                     \
    return mk16(fn(a, b.lo), fn(a, b.hi));                                                  \
  }
INTERQ_VF16_OP(+, _mm256_add_ps)
INTERQ_VF16_OP(-, _mm256_sub_ps)
INTERQ_VF16_OP(*, _mm256_mul_ps)
#undef INTERQ_VF16_OP
inline vf16 load16(const float* p) { return mk16(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
inline __m256 bf16x8(const c10::BFloat16* p) {  // bf16 -> fp32 exactly: the high half of the bits
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline vf16 load16(const c10::BFloat16* p) { return mk16(bf16x8(p), bf16x8(p + 8)); }
inline float hsum16(vf16 v) {  // the generic build's order: lanes i + (i + 8), then i + (i + 4), then (0 + 2) + (1 + 3)
  const __m256 a = _mm256_add_ps(v.lo, v.hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  float x[4];
  _mm_storeu_ps(x, b);
  return (x[0] + x[2]) + (x[1] + x[3]);
}
inline __m256 exp8(__m256 x) {  // exp16's steps on 8 lanes
  const __m256 lo = _mm256_set1_ps(0.f - 87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_blendv_ps(x, lo, under);
  __m256 n = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  n = _mm256_add_ps(n, _mm256_blendv_ps(_mm256_set1_ps(-0.5f), _mm256_set1_ps(0.5f),
                                        _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_GE_OQ)));
  const __m256i ni = _mm256_cvttps_epi32(n);
  n = _mm256_cvtepi32_ps(ni);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_add_ps(_mm256_setzero_ps(), _mm256_set1_ps(1.9875691500e-4f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, scale));
}
inline vf16 exp16(vf16 x) { return mk16(exp8(x.lo), exp8(x.hi)); }
inline vf16 max16(vf16 a, vf16 b) {  // a > b ? a : b lane by lane (maxps: the second operand unless a > b)
  return mk16(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi));
}
inline vf16 fma16(vf16 a, vf16 b, vf16 c) {
  return mk16(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
inline void store16(float* p, vf16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline vf16 hide_where(vf16 x, const bool* show) {  // lanes u with !show[u] -> -inf
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(show));
  const __m256i lo = _mm256_cvtepu8_epi32(b), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
  const __m256i z = _mm256_setzero_si256();
  return mk16(_mm256_blendv_ps(x.lo, ninf, _mm256_castsi256_ps(_mm256_cmpeq_epi32(lo, z))),
              _mm256_blendv_ps(x.hi, ninf, _mm256_castsi256_ps(_mm256_cmpeq_epi32(hi, z))));
}
inline vf16 hide_after(vf16 x, int64_t lim) {  // lanes u > lim -> -inf (causal masking of a diagonal block)
  if (lim >= 15) return x;
  const __m256 l = _mm256_set1_ps(static_cast<float>(lim < -1 ? -1 : lim)), ninf = _mm256_set1_ps(-INFINITY);
  const __m256 i0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), i1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  return mk16(_mm256_blendv_ps(x.lo, ninf, _mm256_cmp_ps(i0, l, _CMP_GT_OQ)),
              _mm256_blendv_ps(x.hi, ninf, _mm256_cmp_ps(i1, l, _CMP_GT_OQ)));
}
#else
typedef float vf16 __attribute__((vector_size(64)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef uint16_t vh16 __attribute__((vector_size(32)));

inline vf16 load16(const float* p) {
  vf16 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline vf16 load16(const c10::BFloat16* p) {
  vh16 h;
  std::memcpy(&h, p, sizeof h);
  vu16 u = __builtin_convertvector(h, vu16) << 16;  // bf16 -> fp32 exactly: the high half of the bits
  vf16 r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}
typedef float vf4 __attribute__((vector_size(16)));  // vf8: beside row_amax_vec above
typedef int32_t vi16 __attribute__((vector_size(64)));
inline float hsum16(vf16 v) {  // a fixed order: halves added pairwise (shuffles, no memory round trip)
  vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
// exp of 16 floats at once (x <= 0 here: scores minus their maximum): x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial for e^r, then 2^n into the exponent; about 1 ulp, 0 below -87.3 (where e^x is below 2^-126)
inline vf16 exp16(vf16 x) {
  const vf16 lo = vf16{} - 87.3f;
  vi16 under = x < lo;
  x = x < lo ? lo : x;
  vf16 n = x * 1.44269504088896341f;
  n = n + (n >= 0.f ? 0.5f : -0.5f);
  vi16 ni = __builtin_convertvector(n, vi16);  // truncation of n +- 0.5: the nearest integer
  n = __builtin_convertvector(ni, vf16);
  vf16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf16 p = vf16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  vi16 bits = (ni + 127) << 23;
  vf16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  vf16 out = p * scale;
  vi16 ob;
  std::memcpy(&ob, &out, sizeof ob);
  ob = under ? vi16{} : ob;
  std::memcpy(&out, &ob, sizeof out);
  return out;
}
inline vf16 max16(vf16 a, vf16 b) { return a > b ? a : b; }
inline void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof v); }
inline vf16 hide_where(vf16 x, const bool* show) {  // lanes u with !show[u] -> -inf
  for (int u = 0; u < 16; ++u)
    if (!show[u]) x[u] = -INFINITY;
  return x;
}
inline vf16 hide_after(vf16 x, int64_t lim) {  // lanes u > lim -> -inf (causal masking of a diagonal block)
  for (int u = 0; u < 16; ++u)
    if (u > lim) x[u] = -INFINITY;
  return x;
}
#if defined(__AVX512F__)
inline vf16 fma16(vf16 a, vf16 b, vf16 c) { return (vf16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#else
inline vf16 fma16(vf16 a, vf16 b, vf16 c) { return a * b + c; }  // no FMA: rounded twice
#endif
constexpr int kNtRows = 8, kNnRows = 6;  // micro-kernel rows: 32 registers of 16 floats
#endif

constexpr int kDecodeMaxG = 16;
constexpr int kDecodeMaxChunks = 16;  // D <= 256

template <typename T>
void decode_attention_head(const T* q, int64_t qs_g, const T* k, int64_t ks_j, const T* v, int64_t vs_j, int64_t kl,
                           int g, int chunks, float scale, const bool* mb, const float* mf, float* s, T* out,
                           int64_t os_g) {
  vf16 qv[kDecodeMaxG][kDecodeMaxChunks];
  for (int a = 0; a < g; ++a)
    for (int c = 0; c < chunks; ++c) qv[a][c] = load16(q + a * qs_g + 16 * c);
  float mx[kDecodeMaxG];
  for (int a = 0; a < g; ++a) mx[a] = -INFINITY;
  for (int64_t j = 0; j < kl; ++j) {  // scores: each key row read once for the G query heads
    const bool keep = mb == nullptr || mb[j];
    const T* kr = k + j * ks_j;
    vf16 kv[kDecodeMaxChunks];
    if (keep)
      for (int c = 0; c < chunks; ++c) kv[c] = load16(kr + 16 * c);
    for (int a = 0; a < g; ++a) {
      float x = -INFINITY;
      if (keep) {
        vf16 acc = qv[a][0] * kv[0];
        for (int c = 1; c < chunks; ++c) acc = acc + qv[a][c] * kv[c];
        x = hsum16(acc) * scale;
        if (mf != nullptr) x = x + mf[j];
      }
      s[a * kl + j] = x;
      mx[a] = x > mx[a] ? x : mx[a];
    }
  }
  float sum[kDecodeMaxG];
  for (int a = 0; a < g; ++a) {
    float* sa = s + a * kl;
    const float m = mx[a] == -INFINITY ? 0.f : mx[a];  // a row with nothing to attend: p = 0 everywhere
    vf16 t16 = vf16{};
    int64_t j = 0;
    for (; j + 16 <= kl; j += 16) {
      vf16 p = exp16(load16(sa + j) - m);
      std::memcpy(sa + j, &p, sizeof p);
      t16 = t16 + p;
    }
    if (j < kl) {  // the tail, padded with -inf (e^-inf = 0)
      float tail[16];
      for (int i = 0; i < 16; ++i) tail[i] = j + i < kl ? sa[j + i] : -INFINITY;
      vf16 p = exp16(load16(tail) - m);
      float pl[16];
      store16(pl, p);
      for (int i = 0; j + i < kl; ++i) sa[j + i] = pl[i];
      t16 = t16 + p;
    }
    sum[a] = hsum16(t16);
  }
  vf16 acc[kDecodeMaxG][kDecodeMaxChunks];
  for (int a = 0; a < g; ++a)
    for (int c = 0; c < chunks; ++c) acc[a][c] = vf16{};
  for (int64_t j = 0; j < kl; ++j) {  // values: each row read once
    if (mb != nullptr && !mb[j]) continue;
    const T* vr = v + j * vs_j;
    vf16 vv[kDecodeMaxChunks];
    for (int c = 0; c < chunks; ++c) vv[c] = load16(vr + 16 * c);
    for (int a = 0; a < g; ++a) {
      const float p = s[a * kl + j];
      for (int c = 0; c < chunks; ++c) acc[a][c] = acc[a][c] + p * vv[c];
    }
  }
  for (int a = 0; a < g; ++a) {
    const float inv = sum[a] > 0.f ? 1.0f / sum[a] : 0.f;
    T* o = out + a * os_g;
    for (int c = 0; c < chunks; ++c) {
      float al[16];
      store16(al, acc[a][c]);
      for (int i = 0; i < 16; ++i) store_f(al[i] * inv, o + 16 * c + i);
    }
  }
}
}  // namespace

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, std::optional<torch::Tensor> mask,
                               double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.device().is_cpu(),
              "decode_attention: q, k, v must be 4-D CPU tensors [B, Hkv, G|K, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == torch::kFloat32 || q.scalar_type() == torch::kBFloat16),
              "decode_attention: q, k, v must share one dtype, float32 or bfloat16");
  const int64_t b = q.size(0), hkv = q.size(1), g = q.size(2), d = q.size(3), kl = k.size(2);
  TORCH_CHECK(k.size(0) == b && v.size(0) == b && k.size(1) == hkv && v.size(1) == hkv && v.size(2) == kl &&
                  k.size(3) == d && v.size(3) == d,
              "decode_attention: k and v must be [B, Hkv, K, D] with q's B, Hkv and D");
  TORCH_CHECK(d % 16 == 0 && d / 16 <= kDecodeMaxChunks && g >= 1 && g <= kDecodeMaxG,
              "decode_attention: D must be a multiple of 16 up to 256 and G at most 16, got D=", d, " G=", g);
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: k and v rows must be contiguous");
  q = q.contiguous();
  torch::Tensor mb, mf;
  if (mask.has_value() && mask->defined()) {
    const auto& m = *mask;
    TORCH_CHECK(m.dim() == 4 && (m.size(0) == b || m.size(0) == 1) && m.size(1) == 1 && m.size(2) == 1 &&
                    m.size(3) == kl,
                "decode_attention: mask must be [B|1, 1, 1, K]");
    if (m.scalar_type() == torch::kBool) mb = m.expand({b, 1, 1, kl}).contiguous();
    else mf = m.to(torch::kFloat32).expand({b, 1, 1, kl}).contiguous();
  }
  auto out = torch::empty({b, hkv, g, d}, q.options());
  const int chunks = static_cast<int>(d / 16);
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b * hkv, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> s(static_cast<size_t>(g * kl));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t bi = p / hkv, hi = p % hkv;
      const bool* mbp = mb.defined() ? mb.data_ptr<bool>() + bi * kl : nullptr;
      const float* mfp = mf.defined() ? mf.data_ptr<float>() + bi * kl : nullptr;
      if (q.scalar_type() == torch::kFloat32)
        decode_attention_head(q.data_ptr<float>() + (bi * hkv + hi) * g * d, d,
                              k.data_ptr<float>() + bi * k.stride(0) + hi * k.stride(1), k.stride(2),
                              v.data_ptr<float>() + bi * v.stride(0) + hi * v.stride(1), v.stride(2), kl,
                              static_cast<int>(g), chunks, sc, mbp, mfp, s.data(),
                              out.data_ptr<float>() + (bi * hkv + hi) * g * d, d);
      else
        decode_attention_head(q.data_ptr<c10::BFloat16>() + (bi * hkv + hi) * g * d, d,
                              k.data_ptr<c10::BFloat16>() + bi * k.stride(0) + hi * k.stride(1), k.stride(2),
                              v.data_ptr<c10::BFloat16>() + bi * v.stride(0) + hi * v.stride(1), v.stride(2), kl,
                              static_cast<int>(g), chunks, sc, mbp, mfp, s.data(),
                              out.data_ptr<c10::BFloat16>() + (bi * hkv + hi) * g * d, d);
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// causal_attention_fwd / causal_attention_bwd: NOT an eager chain's bits either: the learner's causal self-attention
// (no mask, query length = key length, GQA), forward and backward, fp32, for train.learner_attention=kernel
// (interq.train.learner_attention). FlashAttention-2's blocking: 64 x 64 blocks of scores that never leave the
// cache, an online softmax in the forward (the output and each row's log-sum-exp are kept), the probabilities
// recomputed from the log-sum-exp in the backward; blocks above the diagonal are skipped. Products of blocks run
// in two register-tiled micro-kernels with explicit fused multiply-adds (the -ffp-contract=off above does not
// apply to those: the rounding is the FMA's, as in any BLAS).
namespace {

constexpr int64_t kBlk = 64;  // rows and columns of a block of scores

// a zeroed fp32 work buffer on 64-byte boundaries (std::vector's 16-byte alignment split a vector load over two cache
// lines at every other block row)
class Floats {
 public:
  explicit Floats(int64_t n) : n_(n), p_(static_cast<float*>(std::aligned_alloc(64, (sizeof(float) * n + 63) / 64 * 64))) {
    TORCH_CHECK(p_ != nullptr, "interq kernels: out of memory for a work buffer of ", n, " floats");
    std::memset(p_, 0, sizeof(float) * n);
  }
  ~Floats() { std::free(p_); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  float* data() { return p_; }
  float* begin() { return p_; }
  float* end() { return p_ + n_; }
  float& operator[](int64_t i) { return p_[i]; }

 private:
  int64_t n_;
  float* p_;
};

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// AVX2: tiles of R rows x 16 columns in 2R registers (6 x 16: 12 accumulators, 2 for B's row, 1 for A's
// broadcast; the two-register vf16 tiles of the generic code left the FMA units idle half the time). A block's 64
// rows are 9 tiles of 6 and 2 of 5 (a 4-row tile, 8 accumulators, ran at 0.6x: the FMA latency shows). A's element
// is broadcast from memory and added to +0, as the generic code's vf16{} + a does (a -0 enters as +0: the same bits).
constexpr int64_t kTile6 = 54;  // rows 0-53 in tiles of 6, 54-63 in two of 5

inline __m256 a_bcast(const float* p) { return _mm256_add_ps(_mm256_setzero_ps(), _mm256_broadcast_ss(p)); }

// C[R][16] (+)= sum_k A(r, k) B[k][16], A(r, k) = a[r * sar + k * sak] (a transposed block: sar = 1); kAcc: add
// to C (block_nn), else start from 0 (block_nt)
template <int R, bool kAcc>
inline void mk_tile(const float* a, int64_t sar, int64_t sak, const float* b, int64_t ldb, int64_t kn, float* c,
                    int64_t ldc) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = kAcc ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = kAcc ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kn; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 av = a_bcast(a + r * sar + k * sak);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}
// C[64][ncols] (+)= A(64 x kn, strides sar / sak) . B[kn][ncols] (ld ldb), ncols a multiple of 16, in 16-column
// stripes of row tiles (each output's sum runs over k in order whatever the tile: the same values on every build)
template <bool kAcc>
inline void block_tiles(const float* a, int64_t sar, int64_t sak, const float* b, int64_t ldb, int64_t kn,
                        int64_t ncols, float* c, int64_t ldc) {
  for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
    int64_t r = 0;
    for (; r < kTile6; r += 6) mk_tile<6, kAcc>(a + r * sar, sar, sak, b + c0, ldb, kn, c + r * ldc + c0, ldc);
    for (; r < kBlk; r += 5) mk_tile<5, kAcc>(a + r * sar, sar, sak, b + c0, ldb, kn, c + r * ldc + c0, ldc);
  }
}
// S[64][64] = A[64 rows, ld lda][d] . BT[d][64 columns, ld ldb]
inline void block_nt(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t d, float* s) {
  block_tiles<false>(a, lda, 1, bt, ldb, d, kBlk, s, kBlk);
}
// C[64][d] += A(64 x 64, strides sar / sak) . B[64][d] (ld ldb), d a multiple of 16
inline void block_nn(const float* a, int64_t sar, int64_t sak, const float* b, int64_t ldb, int64_t d, float* c,
                     int64_t ldc) {
  block_tiles<true>(a, sar, sak, b, ldb, kBlk, d, c, ldc);
}
#else

// C[R][32] = A[R][d] . BT[d][32]: rows of A (ld lda) against 32 columns of a transposed matrix (ld ldb)
template <int R>
inline void mk_nt(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t d, float* c, int64_t ldc) {
  vf16 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = vf16{};
  for (int64_t k = 0; k < d; ++k) {
    const vf16 b0 = load16(bt + k * ldb), b1 = load16(bt + k * ldb + 16);
    for (int r = 0; r < R; ++r) {
      const vf16 av = vf16{} + a[r * lda + k];
      acc0[r] = fma16(av, b0, acc0[r]);
      acc1[r] = fma16(av, b1, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    store16(c + r * ldc, acc0[r]);
    store16(c + r * ldc + 16, acc1[r]);
  }
}
// S[64][64] = A[64 rows, ld lda][d] . BT[d][64 columns, ld ldb]
// (each output's sum runs over k in order whatever the rows per micro-kernel call: the same values on every build)
inline void block_nt(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t d, float* s) {
  static_assert(kBlk % kNtRows == 0, "block_nt: rows per call must divide the block");
  for (int64_t r = 0; r < kBlk; r += kNtRows)
    for (int64_t c = 0; c < kBlk; c += 32)
      mk_nt<kNtRows>(a + r * lda, lda, bt + c, ldb, d, s + r * kBlk + c, kBlk);
}

// C[R][64] += sum_k A(r, k) B[k][64], A(r, k) = a[r * sar + k * sak] (a transposed block: sar = 1)
template <int R>
inline void mk_nn(const float* a, int64_t sar, int64_t sak, const float* b, int64_t ldb, int64_t kn, float* c,
                  int64_t ldc) {
  vf16 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = load16(c + r * ldc + 16 * v);
  for (int64_t k = 0; k < kn; ++k) {
    const float* bk = b + k * ldb;
    const vf16 b0 = load16(bk), b1 = load16(bk + 16), b2 = load16(bk + 32), b3 = load16(bk + 48);
    for (int r = 0; r < R; ++r) {
      const vf16 av = vf16{} + a[r * sar + k * sak];
      acc[r][0] = fma16(av, b0, acc[r][0]);
      acc[r][1] = fma16(av, b1, acc[r][1]);
      acc[r][2] = fma16(av, b2, acc[r][2]);
      acc[r][3] = fma16(av, b3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) store16(c + r * ldc + 16 * v, acc[r][v]);
}
// C[64][d] += A(64 x 64, strides sar / sak) . B[64][d] (ld ldb), d a multiple of 64... or of 16 (below)
inline void block_nn(const float* a, int64_t sar, int64_t sak, const float* b, int64_t ldb, int64_t d, float* c,
                     int64_t ldc) {
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    int64_t r = 0;
    for (; r + kNnRows <= kBlk; r += kNnRows)
      mk_nn<kNnRows>(a + r * sar, sar, sak, b + c0, ldb, kBlk, c + r * ldc + c0, ldc);
    if constexpr (kBlk % kNnRows != 0)  // AVX-512: 64 = 10 x 6 + 4
      mk_nn<kBlk % kNnRows>(a + r * sar, sar, sak, b + c0, ldb, kBlk, c + r * ldc + c0, ldc);
  }
}
#endif

// a head's rows into a zero-padded fp32 [lp][dp] buffer (dp: d rounded up to 64; t: [L][d] rows at stride ld)
template <typename T>
inline void pack_rows(const T* t, int64_t ld, int64_t l, int64_t d, int64_t lp, int64_t dp, float* out) {
  std::memset(out, 0, sizeof(float) * lp * dp);
  for (int64_t r = 0; r < l; ++r)
    for (int64_t j = 0; j < d; ++j) out[r * dp + j] = load_f(t[r * ld + j]);
}
// transposed by blocks of 64 rows: [lp / 64][dp][64], block c0 / 64 at out + c0 * dp with rows of kBlk floats (a
// whole-matrix transpose put the 64 rows a block product reads at a stride of lp floats: at lp a multiple of 256,
// all in a few L1 sets)
template <typename T>
inline void pack_cols(const T* t, int64_t ld, int64_t l, int64_t d, int64_t lp, int64_t dp, float* out) {
  std::memset(out, 0, sizeof(float) * lp * dp);
  for (int64_t r = 0; r < l; ++r)
    for (int64_t j = 0; j < d; ++j) out[(r / kBlk * dp + j) * kBlk + r % kBlk] = load_f(t[r * ld + j]);
}

inline float hmax16(vf16 x) {
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
  // Without a NaN lane the maximum does not depend on the order of the comparisons, but for which of a -0 and a +0
  // it keeps, which no result sees (the maximum is subtracted from scores and added to a log-sum: exp and + give the
  // same for either zero); with a NaN lane, the loop below.
  const __m256 nan = _mm256_or_ps(_mm256_cmp_ps(x.lo, x.lo, _CMP_UNORD_Q), _mm256_cmp_ps(x.hi, x.hi, _CMP_UNORD_Q));
  if (_mm256_movemask_ps(nan) == 0) {
    const __m256 m8 = _mm256_max_ps(x.lo, x.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  }
#endif
  float v[16];
  store16(v, x);
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// one row's step of the online softmax over a block of 64 scores: x holds the row's scaled scores (-inf where hidden);
// the row's running maximum m and sum are updated, its output row (dp floats) rescaled, the block's probabilities
// left in p. A row with nothing visible so far takes no weight from the block (p = 0).
inline void online_softmax_row(const vf16 (&x)[4], float* p, float& m, float& sum, float* orow, int64_t dp) {
  vf16 mx = x[0];
  for (int t = 1; t < 4; ++t) mx = max16(x[t], mx);
  const float mnew = std::max(m, hmax16(mx));
  if (mnew == -INFINITY) {
    std::fill(p, p + kBlk, 0.f);
    return;
  }
  // exp(m - mnew) is exp(+0) = 1 where the maximum did not move (most rows after the first blocks): no call
  const float alpha = m == -INFINITY ? 0.f : m == mnew && m != INFINITY ? 1.f : std::exp(m - mnew);
  vf16 tot = vf16{};
  for (int t = 0; t < 4; ++t) {
    const vf16 pv = exp16(x[t] - mnew);
    store16(p + 16 * t, pv);
    tot = tot + pv;
  }
  sum = sum * alpha + hsum16(tot);
  m = mnew;
  if (alpha != 1.f)
    for (int64_t c = 0; c < dp; c += 16) store16(orow + c, load16(orow + c) * alpha);
}

struct HeadView {  // [L][d] rows of one head inside a 4-D tensor (last dim contiguous)
  const float* p;
  int64_t ld;
};
inline HeadView head_of(const torch::Tensor& t, int64_t b, int64_t h) {
  return {t.data_ptr<float>() + b * t.stride(0) + h * t.stride(1), t.stride(2)};
}

}  // namespace

std::vector<torch::Tensor> causal_attention_fwd(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.device().is_cpu() &&
                  q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
                  v.scalar_type() == torch::kFloat32,
              "causal_attention_fwd: q [B, H, L, D], k and v [B, Hkv, L, D] must be float32 CPU tensors");
  const int64_t b = q.size(0), h = q.size(1), l = q.size(2), d = q.size(3), hkv = k.size(1);
  TORCH_CHECK(k.size(0) == b && v.size(0) == b && v.size(1) == hkv && k.size(2) == l && v.size(2) == l &&
                  k.size(3) == d && v.size(3) == d && hkv >= 1 && h % hkv == 0 && d % 16 == 0 && d <= 256,
              "causal_attention_fwd: shapes must be q [B, H, L, D], k/v [B, Hkv, L, D] with H a multiple of Hkv and D "
              "a multiple of 16 up to 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "causal_attention_fwd: rows must be contiguous");
  const int64_t g = h / hkv, lp = (l + kBlk - 1) / kBlk * kBlk, dp = (d + 63) / 64 * 64, nb = lp / kBlk;
  auto out = torch::empty({b, l, h, d}, q.options());  // transformers' layout of an attention output
  auto lse = torch::empty({b, h, l}, q.options());
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b * h, 1, [&](int64_t p0, int64_t p1) {
    Floats qp(lp * dp), kt(lp * dp), vp(lp * dp), s(kBlk * kBlk), o(kBlk * dp);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t bi = p / h, hi = p % h, kh = hi / g;
      HeadView qv = head_of(q, bi, hi), kv = head_of(k, bi, kh), vv = head_of(v, bi, kh);
      pack_rows(qv.p, qv.ld, l, d, lp, dp, qp.data());
      pack_cols(kv.p, kv.ld, l, d, lp, dp, kt.data());
      pack_rows(vv.p, vv.ld, l, d, lp, dp, vp.data());
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t r0 = i * kBlk;
        float m[kBlk], sum[kBlk];
        for (int64_t r = 0; r < kBlk; ++r) m[r] = -INFINITY, sum[r] = 0.f;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t c0 = j * kBlk;
          block_nt(qp.data() + r0 * dp, dp, kt.data() + c0 * dp, kBlk, dp, s.data());
          for (int64_t r = 0; r < kBlk; ++r) {
            float* sr = s.data() + r * kBlk;
            const int64_t lim = r0 + r - c0;  // columns c <= lim are visible (causal)
            vf16 x[4];
            for (int t = 0; t < 4; ++t) {
              x[t] = load16(sr + 16 * t) * sc;
              if (j == i) x[t] = hide_after(x[t], lim - 16 * t);
            }
            online_softmax_row(x, sr, m[r], sum[r], o.data() + r * dp, dp);
          }
          block_nn(s.data(), kBlk, 1, vp.data() + c0 * dp, dp, dp, o.data(), dp);
        }
        for (int64_t r = 0; r < kBlk && r0 + r < l; ++r) {
          float* dst = out.data_ptr<float>() + ((bi * l + r0 + r) * h + hi) * d;
          const float* orow = o.data() + r * dp;
          for (int64_t c = 0; c < d; ++c) dst[c] = orow[c] / sum[r];
          lse.data_ptr<float>()[(bi * h + hi) * l + r0 + r] = m[r] + std::log(sum[r]);
        }
      }
    }
  });
  return {out, lse};
}

std::vector<torch::Tensor> causal_attention_bwd(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out,
                                                torch::Tensor lse, torch::Tensor dout, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && out.scalar_type() == torch::kFloat32 &&
                  dout.scalar_type() == torch::kFloat32 && lse.scalar_type() == torch::kFloat32,
              "causal_attention_bwd: float32 tensors expected");
  const int64_t b = q.size(0), h = q.size(1), l = q.size(2), d = q.size(3), hkv = k.size(1);
  const int64_t g = h / hkv, lp = (l + kBlk - 1) / kBlk * kBlk, dp = (d + 63) / 64 * 64, nb = lp / kBlk;
  TORCH_CHECK(out.is_contiguous() && dout.is_contiguous() && lse.is_contiguous() && out.sizes() == dout.sizes() &&
                  out.size(0) == b && out.size(1) == l && out.size(2) == h && out.size(3) == d,
              "causal_attention_bwd: out and dout must be contiguous [B, L, H, D], lse [B, H, L]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "causal_attention_bwd: rows must be contiguous");
  auto dq = torch::empty({b, h, l, d}, q.options());
  auto dk = torch::empty({b, hkv, l, d}, q.options());
  auto dv = torch::empty({b, hkv, l, d}, q.options());
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b * hkv, 1, [&](int64_t p0, int64_t p1) {
    Floats qp(g * lp * dp), dop(g * lp * dp), dqa(g * lp * dp), dsum(g * lp), lsep(g * lp);
    Floats kt(lp * dp), vt(lp * dp), kp(lp * dp), pb(kBlk * kBlk), ds(kBlk * kBlk), dkj(kBlk * dp),
        dvj(kBlk * dp);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t bi = p / hkv, kh = p % hkv;
      HeadView kv = head_of(k, bi, kh), vv = head_of(v, bi, kh);
      pack_cols(kv.p, kv.ld, l, d, lp, dp, kt.data());
      pack_cols(vv.p, vv.ld, l, d, lp, dp, vt.data());
      pack_rows(kv.p, kv.ld, l, d, lp, dp, kp.data());
      for (int64_t a = 0; a < g; ++a) {
        const int64_t hi = kh * g + a;
        HeadView qv = head_of(q, bi, hi);
        pack_rows(qv.p, qv.ld, l, d, lp, dp, qp.data() + a * lp * dp);
        pack_rows(dout.data_ptr<float>() + (bi * l * h + hi) * d, h * d, l, d, lp, dp, dop.data() + a * lp * dp);
        const float* orows = out.data_ptr<float>() + (bi * l * h + hi) * d;
        for (int64_t r = 0; r < lp; ++r) {  // D_r = rowsum(dO * O); padded rows: lse +inf (P = 0)
          float acc = 0.f;
          if (r < l)
            for (int64_t c = 0; c < d; ++c) acc += dop[(a * lp + r) * dp + c] * orows[r * h * d + c];
          dsum[a * lp + r] = acc;
          lsep[a * lp + r] = r < l ? lse.data_ptr<float>()[(bi * h + hi) * l + r] : INFINITY;
        }
      }
      std::fill(dqa.begin(), dqa.end(), 0.f);
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t c0 = j * kBlk;
        std::fill(dkj.begin(), dkj.end(), 0.f);
        std::fill(dvj.begin(), dvj.end(), 0.f);
        for (int64_t a = 0; a < g; ++a) {
          const float* qa = qp.data() + a * lp * dp;
          const float* doa = dop.data() + a * lp * dp;
          for (int64_t i = j; i < nb; ++i) {
            const int64_t r0 = i * kBlk;
            block_nt(qa + r0 * dp, dp, kt.data() + c0 * dp, kBlk, dp, pb.data());  // scores
            block_nt(doa + r0 * dp, dp, vt.data() + c0 * dp, kBlk, dp, ds.data());  // dP = dO V^T
            for (int64_t r = 0; r < kBlk; ++r) {
              float* pr = pb.data() + r * kBlk;
              float* dr = ds.data() + r * kBlk;
              const float ls = lsep[a * lp + r0 + r], dd = dsum[a * lp + r0 + r];
              const int64_t lim = r0 + r - c0;
              for (int t = 0; t < 4; ++t) {
                vf16 x = load16(pr + 16 * t) * sc - ls;
                if (i == j) x = hide_after(x, lim - 16 * t);
                const vf16 pv = exp16(x);
                store16(pr + 16 * t, pv);
                store16(dr + 16 * t, pv * (load16(dr + 16 * t) - dd));  // dS = P (dP - D)
              }
            }
            block_nn(pb.data(), 1, kBlk, doa + r0 * dp, dp, dp, dvj.data(), dp);                  // dV += P^T dO
            block_nn(ds.data(), kBlk, 1, kp.data() + c0 * dp, dp, dp, dqa.data() + (a * lp + r0) * dp, dp);  // dQ += dS K
            block_nn(ds.data(), 1, kBlk, qa + r0 * dp, dp, dp, dkj.data(), dp);                   // dK += dS^T Q
          }
        }
        for (int64_t c = 0; c < kBlk && c0 + c < l; ++c) {
          float* dkr = dk.data_ptr<float>() + ((bi * hkv + kh) * l + c0 + c) * d;
          float* dvr = dv.data_ptr<float>() + ((bi * hkv + kh) * l + c0 + c) * d;
          for (int64_t e = 0; e < d; ++e) {
            dkr[e] = dkj[c * dp + e] * sc;
            dvr[e] = dvj[c * dp + e];
          }
        }
      }
      for (int64_t a = 0; a < g; ++a) {
        float* dqr = dq.data_ptr<float>() + (bi * h + kh * g + a) * l * d;
        for (int64_t r = 0; r < l; ++r)
          for (int64_t e = 0; e < d; ++e) dqr[r * d + e] = dqa[(a * lp + r) * dp + e] * sc;
      }
    }
  });
  return {dq, dk, dv};
}

// ---------------------------------------------------------------------------------------------------------------
// masked_attention: NOT an eager chain's bits: the rollout's prefill attention (several new query tokens over the
// KV cache, an explicit mask: left padding and causality), forward only, for rollout.attention=packed_kernel
// (interq.rollout.attention). The learner kernel's blocking and micro-kernels over fp32 copies of bf16 or fp32
// inputs; blocks the mask hides entirely are skipped; a row with nothing to attend gives 0 (as torch's CPU flash
// kernel). Output in the inputs' dtype.
namespace {

template <typename T>
void masked_attention_kv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const bool* mb,
                         const float* mf, int64_t ms_b, float sc, int64_t bi, int64_t kh, int64_t g, float* qp,
                         float* kt, float* vp, float* s, float* o, T* out) {
  const int64_t h = q.size(1), lq = q.size(2), d = q.size(3), lk = k.size(2);
  const int64_t lqp = (lq + kBlk - 1) / kBlk * kBlk, lkp = (lk + kBlk - 1) / kBlk * kBlk, dp = (d + 63) / 64 * 64;
  const T* kb = k.data_ptr<T>() + bi * k.stride(0) + kh * k.stride(1);
  const T* vb = v.data_ptr<T>() + bi * v.stride(0) + kh * v.stride(1);
  pack_cols(kb, k.stride(2), lk, d, lkp, dp, kt);
  pack_rows(vb, v.stride(2), lk, d, lkp, dp, vp);
  const bool* mbb = mb != nullptr ? mb + bi * ms_b : nullptr;  // [Lq][Lk] of this batch row
  const float* mfb = mf != nullptr ? mf + bi * ms_b : nullptr;
  for (int64_t a = 0; a < g; ++a) {
    const int64_t hi = kh * g + a;
    pack_rows(q.data_ptr<T>() + bi * q.stride(0) + hi * q.stride(1), q.stride(2), lq, d, lqp, dp, qp);
    for (int64_t r0 = 0; r0 < lqp; r0 += kBlk) {
      const int64_t rn = std::min(kBlk, lq - r0);  // real rows of this block
      float m[kBlk], sum[kBlk];
      for (int64_t r = 0; r < kBlk; ++r) m[r] = -INFINITY, sum[r] = 0.f;
      std::fill(o, o + kBlk * dp, 0.f);
      for (int64_t c0 = 0; c0 < lkp; c0 += kBlk) {
        const int64_t cn = std::min(kBlk, lk - c0);
        bool any = false;  // does the mask show anything of this block?
        for (int64_t r = 0; r < rn && !any; ++r)
          for (int64_t c = 0; c < cn; ++c) {
            const int64_t at = (r0 + r) * lk + c0 + c;
            if (mbb != nullptr ? mbb[at] : mfb[at] != -INFINITY) {
              any = true;
              break;
            }
          }
        if (!any) continue;
        block_nt(qp + r0 * dp, dp, kt + c0 * dp, kBlk, dp, s);
        for (int64_t r = 0; r < rn; ++r) {
          float* sr = s + r * kBlk;
          const int64_t row = (r0 + r) * lk + c0;
          vf16 x[4];  // the row's scaled scores, masked (the same operations lane by lane)
          if (cn == kBlk) {
            for (int t = 0; t < 4; ++t) {
              x[t] = load16(sr + 16 * t) * sc;
              x[t] = mbb != nullptr ? hide_where(x[t], mbb + row + 16 * t) : x[t] + load16(mfb + row + 16 * t);
            }
          } else {  // the last block of keys: lanes past them hidden
            float xs[kBlk];
            for (int64_t c = 0; c < kBlk; ++c) {
              const float xc = sr[c] * sc;
              if (c >= cn || (mbb != nullptr && !mbb[row + c])) xs[c] = -INFINITY;
              else xs[c] = mfb != nullptr ? xc + mfb[row + c] : xc;
            }
            for (int t = 0; t < 4; ++t) x[t] = load16(xs + 16 * t);
          }
          online_softmax_row(x, sr, m[r], sum[r], o + r * dp, dp);
        }
        for (int64_t r = rn; r < kBlk; ++r) std::fill(s + r * kBlk, s + (r + 1) * kBlk, 0.f);
        block_nn(s, kBlk, 1, vp + c0 * dp, dp, dp, o, dp);
      }
      for (int64_t r = 0; r < rn; ++r) {
        T* dst = out + ((bi * lq + r0 + r) * h + hi) * d;
        const float* orow = o + r * dp;
        const float inv = sum[r] > 0.f ? 1.0f / sum[r] : 0.f;
        for (int64_t c = 0; c < d; ++c) store_f(orow[c] * inv, dst + c);
      }
    }
  }
}

}  // namespace

torch::Tensor masked_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.device().is_cpu(),
              "masked_attention: q [B, H, Lq, D], k and v [B, Hkv, Lk, D] must be CPU tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  (q.scalar_type() == torch::kFloat32 || q.scalar_type() == torch::kBFloat16),
              "masked_attention: q, k, v must share one dtype, float32 or bfloat16");
  const int64_t b = q.size(0), h = q.size(1), lq = q.size(2), d = q.size(3), hkv = k.size(1), lk = k.size(2);
  TORCH_CHECK(k.size(0) == b && v.size(0) == b && v.size(1) == hkv && v.size(2) == lk && k.size(3) == d &&
                  v.size(3) == d && hkv >= 1 && h % hkv == 0 && d % 16 == 0 && d <= 256,
              "masked_attention: k/v must be [B, Hkv, Lk, D] with H a multiple of Hkv and D a multiple of 16 up to 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "masked_attention: rows must be contiguous");
  TORCH_CHECK(mask.dim() == 4 && (mask.size(0) == b || mask.size(0) == 1) && mask.size(1) == 1 && mask.size(2) == lq &&
                  mask.size(3) == lk,
              "masked_attention: mask must be [B|1, 1, Lq, Lk]");
  torch::Tensor mb, mf;
  if (mask.scalar_type() == torch::kBool) mb = mask.contiguous();
  else mf = mask.to(torch::kFloat32).contiguous();
  const int64_t ms_b = mask.size(0) == 1 ? 0 : lq * lk;
  auto out = torch::empty({b, lq, h, d}, q.options());
  const int64_t g = h / hkv, lqp = (lq + kBlk - 1) / kBlk * kBlk, lkp = (lk + kBlk - 1) / kBlk * kBlk,
                dp = (d + 63) / 64 * 64;
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b * hkv, 1, [&](int64_t p0, int64_t p1) {
    Floats qp(lqp * dp), kt(lkp * dp), vp(lkp * dp), s(kBlk * kBlk), o(kBlk * dp);
    for (int64_t p = p0; p < p1; ++p) {
      const bool* mbp = mb.defined() ? mb.data_ptr<bool>() : nullptr;
      const float* mfp = mf.defined() ? mf.data_ptr<float>() : nullptr;
      if (q.scalar_type() == torch::kFloat32)
        masked_attention_kv<float>(q, k, v, mbp, mfp, ms_b, sc, p / hkv, p % hkv, g, qp.data(), kt.data(), vp.data(),
                                   s.data(), o.data(), out.data_ptr<float>());
      else
        masked_attention_kv<c10::BFloat16>(q, k, v, mbp, mfp, ms_b, sc, p / hkv, p % hkv, g, qp.data(), kt.data(),
                                           vp.data(), s.data(), o.data(), out.data_ptr<c10::BFloat16>());
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// uniform_f64_rows: the sampler's uniforms (interq.rollout.sampling.exponential_race): row r of out [N, V] float64
// = what out[r].uniform_(generator=generators[r]) writes, bit for bit, each generator left as that call leaves it.
// torch's CPU uniform_ on float64 takes, per element, random64() = two 32-bit outputs of the generator's mt19937
// (the first in the high half), keeps the low 53 bits and scales them by 2^-53 (ATen's
// transformation::uniform_real; tests/test_rollout_engine.py compares). Its serial kernel calls the generator through
// libtorch once per number; here the engine's state (ATen's header-only at::mt19937) is advanced in bulk (mt_outputs)
// and stored back, rows in parallel, each under its generator's lock (16 rows of 49k: 3.8 -> 1.1 ms on one core).
// Generators that appear twice are drawn in row order on one thread (as the loop would).
#include <ATen/CPUGeneratorImpl.h>
#include <mutex>

namespace {
// The engine's next m outputs, as m calls of at::mt19937's operator() would give them, from its state (left_ / next_
// counters, the 624 words) in bulk: the state's remaining words tempered as a block, the twist of all 624 words
// when they run out (16 words at a time where AVX-512 is built in: each new word reads words at least 16 apart
// from those of its block, so a block of 16 sees the same inputs as the serial loop), the state left as the calls
// leave it (tests/test_rollout_engine.py: the numbers and the generators' states equal torch's).
inline uint32_t mt_temper(uint32_t y) {
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

inline uint32_t mt_twist(uint32_t u, uint32_t v) {
  return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ (v & 1 ? at::MATRIX_A : 0u);
}

void mt_next_state(uint32_t* p) {
  constexpr int n = at::MERSENNE_STATE_N, m = at::MERSENNE_STATE_M;
  int i = 0;
#if defined(__AVX512F__)
  const __m512i um = _mm512_set1_epi32(static_cast<int>(at::UMASK)), lm = _mm512_set1_epi32(at::LMASK);
  const __m512i ma = _mm512_set1_epi32(static_cast<int>(at::MATRIX_A)), one = _mm512_set1_epi32(1);
  auto block = [&](int i0, int far) {
    const __m512i u = _mm512_loadu_si512(p + i0), v = _mm512_loadu_si512(p + i0 + 1);
    const __m512i y = _mm512_or_si512(_mm512_and_si512(u, um), _mm512_and_si512(v, lm));
    const __m512i mag = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(v, one), ma);
    const __m512i w = _mm512_xor_si512(_mm512_xor_si512(_mm512_loadu_si512(p + far), _mm512_srli_epi32(y, 1)), mag);
    _mm512_storeu_si512(p + i0, w);
  };
  for (; i + 16 <= n - m; i += 16) block(i, i + m);
#endif
  for (; i < n - m; ++i) p[i] = p[i + m] ^ mt_twist(p[i], p[i + 1]);
#if defined(__AVX512F__)
  for (; i + 16 <= n - 1; i += 16) block(i, i + m - n);
#endif
  for (; i < n - 1; ++i) p[i] = p[i + m - n] ^ mt_twist(p[i], p[i + 1]);
  p[n - 1] = p[m - 1] ^ mt_twist(p[n - 1], p[0]);
}

void mt_outputs(at::mt19937_data_pod& d, uint32_t* out, int64_t count) {
  uint32_t* st = d.state_.data();
  while (count > 0) {
    if (d.left_ == 1) {  // the call that finds left_ 1 twists, then takes word 0 with left_ = 624
      mt_next_state(st);
      d.left_ = at::MERSENNE_STATE_N + 1;
      d.next_ = 0;
    }
    const int64_t t = std::min<int64_t>(count, d.left_ - 1);
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= t; j += 16) {
      __m512i y = _mm512_loadu_si512(st + d.next_ + j);
      y = _mm512_xor_si512(y, _mm512_srli_epi32(y, 11));
      y = _mm512_xor_si512(y, _mm512_and_si512(_mm512_slli_epi32(y, 7), _mm512_set1_epi32(static_cast<int>(0x9d2c5680u))));
      y = _mm512_xor_si512(y, _mm512_and_si512(_mm512_slli_epi32(y, 15), _mm512_set1_epi32(static_cast<int>(0xefc60000u))));
      y = _mm512_xor_si512(y, _mm512_srli_epi32(y, 18));
      _mm512_storeu_si512(out + j, y);
    }
#endif
    for (; j < t; ++j) out[j] = mt_temper(st[d.next_ + j]);
    d.next_ += static_cast<uint32_t>(t);
    d.left_ -= static_cast<int>(t);
    out += t;
    count -= t;
  }
}

// v doubles of torch's uniform_ on [0, 1): per double two outputs (the first the high half), the low 53 bits times
// 2^-53 (exact)
void uniform_f64_from(at::mt19937_data_pod& d, double* row, int64_t v) {
  constexpr int64_t kBlock = 1024;  // doubles per block of outputs
  uint32_t words[2 * kBlock];
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    const int64_t c = std::min(kBlock, v - j0);
    mt_outputs(d, words, 2 * c);
    for (int64_t j = 0; j < c; ++j) {
      const uint64_t bits = ((uint64_t(words[2 * j]) << 32) | words[2 * j + 1]) & ((uint64_t(1) << 53) - 1);
      row[j0 + j] = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
    }
  }
}
}  // namespace

void uniform_f64_rows(torch::Tensor out, std::vector<at::Generator> generators) {
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == torch::kFloat64 && out.is_contiguous() && out.device().is_cpu(),
              "uniform_f64_rows: out must be a contiguous [N, V] float64 CPU tensor");
  const int64_t n = out.size(0), v = out.size(1);
  TORCH_CHECK(static_cast<int64_t>(generators.size()) == n, "uniform_f64_rows: one generator per row of out");
  std::vector<at::CPUGeneratorImpl*> gens(n);
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(generators[r].defined() && generators[r].device().is_cpu(), "uniform_f64_rows: CPU generators only");
    gens[r] = at::check_generator<at::CPUGeneratorImpl>(generators[r]);
  }
  bool distinct = true;
  for (int64_t r = 0; r < n && distinct; ++r)
    for (int64_t s = r + 1; s < n; ++s)
      if (gens[r] == gens[s]) { distinct = false; break; }
  double* base = out.data_ptr<double>();
  auto draw = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::lock_guard<std::mutex> lock(gens[r]->mutex_);
      at::mt19937 engine = gens[r]->engine();
      at::mt19937_data_pod state = engine.data();
      uniform_f64_from(state, base + r * v, v);
      engine.set_data(state);
      gens[r]->set_engine(engine);
    }
  };
  if (distinct) at::parallel_for(0, n, 1, draw);
  else draw(0, n);
}

// ---------------------------------------------------------------------------------------------------------------
// flash_decode_amx: torch's CPU flash attention (aten::_scaled_dot_product_flash_attention_for_cpu, torch 2.13) of
// bf16 decode problems, bit for bit where oneDNN multiplies by AMX-BF16 tiles, in one call without its per-block
// GEMM calls (interq.rollout.attention's sdpa_packed decode: q [B, Hkv, G, D], the G query heads of a KV head as
// G rows; K / V [B, Hkv, L, D] views of the cache). Torch runs each (b, h) as blocks of 512 keys: scores by one
// oneDNN GEMM (bf16 in, fp32 out), an online softmax in fp32 with its vectorized exp (fexp_u20), the probabilities
// rounded to bf16 and multiplied into the fp32 output by a second GEMM. The same steps here, found by comparing
// with torch's output and log-sum-exp on random problems (tests/test_flash_decode.py; interq.rollout.attention
// checks each shape on a probe before use, so another torch or oneDNN falls back to torch instead of differing):
//   - scores: fp32 AMX tiles from zero, D in chunks of 32 in order (one tdpbf16ps per chunk), times the scale, plus
//     the mask (bool: 0 / -inf), block maximum (with the running one);
//   - exp(s - max) by at::vec's fexp_u20 on vectors of 16 keys, summed in two vector accumulators taken in turn,
//     added together and reduced by at::vec::vec_reduce_all; the last keys (fewer than 16) by std::exp, added one
//     by one; each exp rounded to bf16 (torch's conversions: vectors by at::vec, the tail by c10::BFloat16);
//   - running sum = fma(exp(old max - new max), old sum, block sum) (torch's build contracts this one into an FMA),
//     the output so far times exp(old max - new max) before the block's products;
//   - output += P V by AMX tiles that start from the output so far (from zero for the first block), keys in chunks
//     of 32 in order (zero-padded); out = bf16(o * (1 / sum)) (a sum of 0 taken as 1).
// A row whose block is entirely masked (max -inf) gets zeros and keeps its state, as torch's. Float masks are added
// in fp32 after the scale multiply; where a mask value could round differently under torch's possibly fused
// multiply-add (a finite nonzero value below 2^100 in magnitude with a scale that is not a power of two), the call
// says so (exact = false) and the caller uses torch. Needs AMX-BF16 (has_bf16_gemm_amx), D a multiple of 32 up
// to 256, 2 <= G <= 16 (one query row is a matrix-vector product to oneDNN, with other sums).
#if INTERQ_AMX_BF16
#if !defined(CPU_CAPABILITY)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#endif
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
namespace {
using FVec = at::vec::Vectorized<float>;
static_assert(FVec::size() == 16, "flash_decode_amx follows torch's AVX512 build: 16-float vectors");
constexpr int64_t kFlashBlock = 512;  // torch's kv split for q_seq_len < 192

struct FlashScratch {
  std::vector<uint16_t> qpack, kpad, p, vpack;
  std::vector<float> sc, row, dst, mx, sm;
};

// tiles: 0 scores C [16 keys x G], 1 keys A [16 x 32], 2 query B [16 pairs x G], 3 output C [G x 16 d],
// 4 probabilities A [G x 32 keys], 5 values B [16 key pairs x 16 d]
void flash_configure(int g) {
  AmxConfig c;
  const int rows[6] = {16, 16, 16, g, g, 16};
  const int colsb[6] = {g * 4, 64, g * 4, 64, 64, 64};
  for (int t = 0; t < 6; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows[t]);
    c.colsb[t] = static_cast<uint16_t>(colsb[t]);
  }
  _tile_loadconfig(&c);
}

// One (b, h) problem. q rows at stride qs (elements), k / v rows at stride ks / vs; mask row: bool (mb) or float
// (mf) or none. Returns into out (G rows of D at stride os).
void flash_problem(const uint16_t* q, int64_t qs, const uint16_t* k, int64_t ks, const uint16_t* v, int64_t vs,
                   int64_t L, int g, int64_t D, float scale, const bool* mb, const float* mf, uint16_t* out,
                   int64_t os, FlashScratch& w) {
  const int64_t dc = D / 32;  // chunks of 32 along D
  // the query as AMX B tiles: [dc][16 pairs][g][2]
  w.qpack.assign(dc * 16 * g * 2, 0);
  for (int gi = 0; gi < g; ++gi)
    for (int64_t d = 0; d < D; ++d)
      w.qpack[((d / 32) * 16 + (d % 32) / 2) * g * 2 + gi * 2 + (d % 2)] = q[gi * qs + d];
  w.mx.assign(g, -std::numeric_limits<float>::infinity());
  w.sm.assign(g, 0.f);
  w.dst.assign(g * D, 0.f);
  const float ninf = -std::numeric_limits<float>::infinity();
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int64_t n = 0; n < L; n += kFlashBlock) {
    const int64_t kb = std::min(kFlashBlock, L - n);
    const int64_t kg = (kb + 15) / 16, ldp = (kb + 31) / 32 * 32, kcp = ldp / 32;
    // scores [kg * 16 keys][16] (column gi of key j at sc[j * 16 + gi])
    w.sc.resize(kg * 16 * 16);
    for (int64_t j0 = 0; j0 < kb; j0 += 16) {
      const uint16_t* a = k + (n + j0) * ks;
      int64_t lda = ks;
      if (j0 + 16 > kb) {  // the last keys: copied into zeroed rows (a tile load reads 16 rows)
        w.kpad.assign(16 * D, 0);
        for (int64_t j = j0; j < kb; ++j) std::memcpy(&w.kpad[(j - j0) * D], k + (n + j) * ks, D * 2);
        a = w.kpad.data();
        lda = D;
      }
      _tile_zero(0);
      for (int64_t c = 0; c < dc; ++c) {
        _tile_loadd(1, a + c * 32, lda * 2);
        _tile_loadd(2, w.qpack.data() + c * 16 * g * 2, g * 4);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, w.sc.data() + j0 * 16, 64);
    }
    w.p.assign(g * ldp, 0);
    w.row.resize(kb);
    for (int gi = 0; gi < g; ++gi) {
      float* row = w.row.data();
      for (int64_t j = 0; j < kb; ++j) row[j] = w.sc[j * 16 + gi];
      float tmax;
      if (mb || mf) {
        for (int64_t j = 0; j < kb; ++j) {
          const float m = mb ? (mb[n + j] ? 0.f : ninf) : mf[n + j];
          const float t = row[j] * scale;
          row[j] = t + m;
        }
        tmax = at::vec::reduce_all<float>([](FVec& x, FVec& y) { return at::vec::maximum(x, y); }, row, kb);
      } else {  // torch's _mul_reduce_max_fusion_kernel
        FVec vmax(ninf);
        float tm = ninf;
        int64_t j = 0;
        for (; j < 16 * (kb / 16); j += 16) {
          const FVec t = FVec::loadu(row + j) * FVec(scale);
          vmax = at::vec::maximum(vmax, t);
          t.store(row + j);
        }
        for (; j < kb; ++j) {
          const float t = row[j] * scale;
          tm = std::max(tm, t);
          row[j] = t;
        }
        tmax = std::max(tm, at::vec::vec_reduce_all<float>(
                                [](FVec& x, FVec& y) { return at::vec::maximum(x, y); }, vmax));
      }
      tmax = w.mx[gi] > tmax ? w.mx[gi] : tmax;
      uint16_t* pr = w.p.data() + gi * ldp;
      if (tmax == ninf) continue;  // probabilities 0 (w.p zeroed), state kept
      FVec acc0(0.f), acc1(0.f);
      int64_t j = 0;
      for (int64_t i = 0; j < 16 * (kb / 16); j += 16, ++i) {
        const FVec t = (FVec::loadu(row + j) - FVec(tmax)).fexp_u20();
        if (i % 2) acc1 += t;
        else acc0 += t;
        at::vec::convert_float_bfloat16(t, t).store(pr + j, 16);
      }
      float s = at::vec::vec_reduce_all<float>([](FVec& x, FVec& y) { return x + y; }, acc0 + acc1);
      for (; j < kb; ++j) {
        const float t = std::exp(row[j] - tmax);
        s += t;
        pr[j] = c10::BFloat16(t).x;
      }
      const float et = std::exp(w.mx[gi] - tmax);
      w.sm[gi] = std::fma(et, w.sm[gi], s);
      w.mx[gi] = tmax;
      if (n > 0)
        for (int64_t d = 0; d < D; ++d) w.dst[gi * D + d] = w.dst[gi * D + d] * et;
    }
    // the values as AMX B tiles: [D / 16][kcp][16 key pairs][16 d][2], keys past kb zero
    w.vpack.resize((D / 16) * kcp * 512);
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t c = 0; c < kcp; ++c)
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 32 * c + 2 * i;
        for (int64_t h = 0; h < D / 32; ++h) {
          const __m512i a = j < kb ? _mm512_loadu_si512(v + (n + j) * vs + 32 * h) : zero;
          const __m512i b = j + 1 < kb ? _mm512_loadu_si512(v + (n + j + 1) * vs + 32 * h) : zero;
          _mm512_storeu_si512(&w.vpack[((2 * h) * kcp + c) * 512 + i * 32], _mm512_permutex2var_epi16(a, lo_idx, b));
          _mm512_storeu_si512(&w.vpack[((2 * h + 1) * kcp + c) * 512 + i * 32],
                              _mm512_permutex2var_epi16(a, hi_idx, b));
        }
      }
    for (int64_t db = 0; db < D / 16; ++db) {
      if (n == 0) _tile_zero(3);
      else _tile_loadd(3, w.dst.data() + db * 16, D * 4);
      for (int64_t c = 0; c < kcp; ++c) {
        _tile_loadd(4, w.p.data() + c * 32, ldp * 2);
        _tile_loadd(5, w.vpack.data() + (db * kcp + c) * 512, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(3, w.dst.data() + db * 16, D * 4);
    }
  }
  for (int gi = 0; gi < g; ++gi) {
    const float s = w.sm[gi] == 0 ? 1.f : w.sm[gi];
    const float r = 1 / s;
    for (int64_t d = 0; d < D; d += 16) {
      const FVec x = FVec::loadu(w.dst.data() + gi * D + d) * FVec(r);
      at::vec::convert_float_bfloat16(x, x).store(out + gi * os + d, 16);
    }
  }
}
}  // namespace
#endif

// q [B, Hkv, G, D], k / v [B, Hkv, L, D] bf16 (rows contiguous), mask [B|1, 1, 1, L] bool / bf16 / float or none
// -> (out [B, Hkv, G, D] bf16, exact): exact false where a float mask value could round differently in torch (the
// caller then uses torch)
std::tuple<torch::Tensor, bool> flash_decode_amx(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                 std::optional<torch::Tensor> mask, double scale) {
#if INTERQ_AMX_BF16
  TORCH_CHECK(amx_permitted(), "flash_decode_amx: the Linux kernel does not let this process use AMX tiles");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.device().is_cpu() && k.device().is_cpu() &&
                  v.device().is_cpu(),
              "flash_decode_amx: q, k, v must be 4-D CPU tensors [B, Hkv, G|L, D]");
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
                  v.scalar_type() == torch::kBFloat16,
              "flash_decode_amx: q, k, v must be bfloat16");
  const int64_t b = q.size(0), hkv = q.size(1), g = q.size(2), d = q.size(3), kl = k.size(2);
  TORCH_CHECK(k.size(0) == b && v.size(0) == b && k.size(1) == hkv && v.size(1) == hkv && v.size(2) == kl &&
                  k.size(3) == d && v.size(3) == d,
              "flash_decode_amx: k and v must be [B, Hkv, L, D] with q's B, Hkv and D");
  TORCH_CHECK(d % 32 == 0 && d <= 256 && g >= 2 && g <= 16,
              "flash_decode_amx: D must be a multiple of 32 up to 256 and G from 2 to 16, got D=", d, " G=", g);
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "flash_decode_amx: q, k and v rows must be contiguous");
  torch::Tensor mb, mf;
  bool exact = true;
  if (mask.has_value() && mask->defined()) {
    const auto& m = *mask;
    TORCH_CHECK(m.dim() == 4 && (m.size(0) == b || m.size(0) == 1) && m.size(1) == 1 && m.size(2) == 1 &&
                    m.size(3) == kl && m.device().is_cpu(),
                "flash_decode_amx: mask must be a CPU tensor [B|1, 1, 1, L]");
    if (m.scalar_type() == torch::kBool) {
      mb = m.expand({b, 1, 1, kl}).contiguous();
    } else {
      TORCH_CHECK(m.scalar_type() == torch::kBFloat16 || m.scalar_type() == torch::kFloat32,
                  "flash_decode_amx: a float mask must be bfloat16 or float32");
      mf = m.to(torch::kFloat32).expand({b, 1, 1, kl}).contiguous();
      int e;
      const bool pow2 = std::frexp(scale, &e) == 0.5;
      if (!pow2) {
        const float* mp = mf.data_ptr<float>();
        for (int64_t i = 0; i < mf.numel() && exact; ++i)
          exact = mp[i] == 0.f || !(std::fabs(mp[i]) < 0x1p100f);
      }
    }
  }
  auto out = torch::empty({b, hkv, g, d}, q.options());
  if (!exact || b * hkv == 0) return {out, exact};
  const float sc = static_cast<float>(scale);
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<c10::BFloat16>());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<c10::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, b * hkv, 1, [&](int64_t p0, int64_t p1) {
    thread_local FlashScratch w;
    flash_configure(static_cast<int>(g));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t bi = p / hkv, hi = p % hkv;
      flash_problem(qp + bi * q.stride(0) + hi * q.stride(1), q.stride(2), kp + bi * k.stride(0) + hi * k.stride(1),
                    k.stride(2), vp + bi * v.stride(0) + hi * v.stride(1), v.stride(2), kl, static_cast<int>(g), d, sc,
                    mb.defined() ? mb.data_ptr<bool>() + bi * kl : nullptr,
                    mf.defined() ? mf.data_ptr<float>() + bi * kl : nullptr, op + (bi * hkv + hi) * g * d, d, w);
    }
    _tile_release();
  });
  return {out, exact};
#else
  TORCH_CHECK(false, "flash_decode_amx: this build has no AMX-BF16 (see has_bf16_gemm_amx)");
  return {q, false};
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// rope_bf16: transformers' Llama rotary embedding of bf16 query and key rows (apply_rotary_pos_emb:
// q * cos + rotate_half(q) * sin), each of its eager ops' roundings kept: both products rounded to bf16 (the float
// product of two bf16 values is exact, so each is one rounding), their float sum rounded to bf16, rotate_half's
// negation exact. x [B, S, N, D] (the projection's output as heads, contiguous), cos / sin [B or 1, S, D] -> out of
// the same shape; whether an output is NaN (torch's vectorized conversion writes other NaN bits than the scalar one:
// the caller then takes the eager ops). Rows (b, s, n) over the threads.
namespace {
bool rope_rows(const c10::BFloat16* x, const c10::BFloat16* cs, const c10::BFloat16* sn, int64_t b, int64_t s,
               int64_t n, int64_t d, bool cos_batched, c10::BFloat16* out) {
  const int64_t half = d / 2;
  std::atomic<bool> nan{false};
  at::parallel_for(0, b * s * n, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> c(d), si(d), y(d);
    int64_t loaded = -1;  // the (b, s) whose cos / sin are in c / si
    bool any_nan = false;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bs = r / n;  // b * s + s_index
      if (bs != loaded) {
        const int64_t cbs = cos_batched ? bs : bs % s;
        for (int64_t j = 0; j < d; ++j) {
          c[j] = load_f(cs[cbs * d + j]);
          si[j] = load_f(sn[cbs * d + j]);
        }
        loaded = bs;
      }
      const c10::BFloat16* xr = x + r * d;
      for (int64_t j = 0; j < d; ++j) {
        const float v = load_f(xr[j]);
        const float rot = j < half ? -load_f(xr[j + half]) : load_f(xr[j - half]);
        y[j] = round_to_bf16(round_to_bf16(v * c[j]) + round_to_bf16(rot * si[j]));
      }
      c10::BFloat16* o = out + r * d;
      for (int64_t j = 0; j < d; ++j) {
        any_nan |= (y[j] != y[j]);
        o[j].x = uint16_t(float_bits(y[j]) >> 16);
      }
    }
    if (any_nan) nan.store(true);
  });
  return nan.load();
}

void check_rope(const torch::Tensor& x, const torch::Tensor& cs, const torch::Tensor& sn) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.device().is_cpu(),
              "rope_bf16: q and k must be contiguous bf16 CPU tensors [B, S, N, D]");
  TORCH_CHECK(x.size(3) % 2 == 0, "rope_bf16: the head size must be even");
  TORCH_CHECK(cs.dim() == 3 && sn.sizes() == cs.sizes() && cs.scalar_type() == torch::kBFloat16 &&
                  sn.scalar_type() == torch::kBFloat16 && cs.is_contiguous() && sn.is_contiguous() &&
                  (cs.size(0) == 1 || cs.size(0) == x.size(0)) && cs.size(1) == x.size(1) &&
                  cs.size(2) == x.size(3),
              "rope_bf16: cos and sin must be contiguous bf16 [B or 1, S, D] matching q and k");
}
}  // namespace

std::tuple<torch::Tensor, torch::Tensor, bool> rope_bf16(torch::Tensor q, torch::Tensor k, torch::Tensor cos,
                                                         torch::Tensor sin) {
  check_rope(q, cos, sin);
  check_rope(k, cos, sin);
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "rope_bf16: q and k must share B, S and D");
  auto qo = torch::empty_like(q), ko = torch::empty_like(k);
  const bool batched = cos.size(0) != 1 || q.size(0) == 1;
  const auto* cp = cos.data_ptr<c10::BFloat16>();
  const auto* sp = sin.data_ptr<c10::BFloat16>();
  const int64_t b = q.size(0), s = q.size(1), d = q.size(3);
  bool nan = rope_rows(q.data_ptr<c10::BFloat16>(), cp, sp, b, s, q.size(2), d, batched, qo.data_ptr<c10::BFloat16>());
  nan |= rope_rows(k.data_ptr<c10::BFloat16>(), cp, sp, b, s, k.size(2), d, batched, ko.data_ptr<c10::BFloat16>());
  return {qo, ko, nan};
}

// ---------------------------------------------------------------------------------------------------------------
// race_argmax: the sampler's last step (interq.rollout.sampling.sample_tokens), (probs / race).argmax(-1), in one
// pass without the quotient tensor: row r's token is the first index of the largest probs[r, j] / race[r, j] (one
// IEEE division each, as torch's div), a NaN quotient counting as the largest (torch's argmax: the first NaN),
// rows over the threads. probs and race [N, V] fp32 contiguous -> tokens [N] int64. torch's argmax of 16 rows of
// 49k ran 1.6-2.2 ms per call here.
namespace {
int64_t race_argmax_row(const float* p, const float* e, int64_t v) {
  int64_t best_i = 0;
  float best = v > 0 ? p[0] / e[0] : 0.f;
  int64_t j = 1;
#if defined(__AVX512F__)
  if (v >= 32 && !std::isnan(best)) {  // 16 lanes, each the first index of its largest (or first NaN) quotient
    __m512 lane_best = _mm512_div_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(e));
    __m512i lane_idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = lane_idx;
    int64_t k = 16;
    for (; k + 16 <= v && k + 16 <= (int64_t(1) << 31); k += 16) {
      idx = _mm512_add_epi32(idx, step);
      const __m512 q = _mm512_div_ps(_mm512_loadu_ps(p + k), _mm512_loadu_ps(e + k));
      const __mmask16 best_nan = _mm512_cmp_ps_mask(lane_best, lane_best, _CMP_UNORD_Q);
      const __mmask16 q_nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
      const __mmask16 take = (_mm512_cmp_ps_mask(q, lane_best, _CMP_GT_OQ) | q_nan) & ~best_nan;
      lane_best = _mm512_mask_mov_ps(lane_best, take, q);
      lane_idx = _mm512_mask_mov_epi32(lane_idx, take, idx);
    }
    float lb[16];
    int32_t li[16];
    _mm512_storeu_ps(lb, lane_best);
    _mm512_storeu_si512(li, lane_idx);
    best = lb[0];
    best_i = li[0];
    for (int l = 1; l < 16; ++l) {  // the largest lane value, ties and NaNs to the smallest index
      const bool bn = std::isnan(best), ln = std::isnan(lb[l]);
      if (bn ? (ln && li[l] < best_i) : (ln || lb[l] > best || (lb[l] == best && li[l] < best_i))) {
        best = lb[l];
        best_i = li[l];
      }
    }
    j = k;
  }
#endif
  for (; j < v && !std::isnan(best); ++j) {
    const float q = p[j] / e[j];
    if (std::isnan(q) || q > best) {
      best = q;
      best_i = j;
    }
  }
  return best_i;
}
}  // namespace

torch::Tensor race_argmax(torch::Tensor probs, torch::Tensor race) {
  TORCH_CHECK(probs.dim() == 2 && race.sizes() == probs.sizes() && probs.scalar_type() == torch::kFloat32 &&
                  race.scalar_type() == torch::kFloat32 && probs.is_contiguous() && race.is_contiguous() &&
                  probs.device().is_cpu() && race.device().is_cpu(),
              "race_argmax: probs and race must be contiguous fp32 CPU tensors of one shape [N, V]");
  const int64_t n = probs.size(0), v = probs.size(1);
  TORCH_CHECK(v > 0, "race_argmax: V must be positive");
  auto out = torch::empty({n}, probs.options().dtype(torch::kInt64));
  const float* pp = probs.data_ptr<float>();
  const float* ep = race.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = race_argmax_row(pp + r * v, ep + r * v, v);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------------------------
// A Llama decoder layer's two halves around its KV cache, one call each (interq.rollout.fast_layers): the kernels the
// lean layer forward calls in turn (rms_norm_bf16, int8_linear_amx or bf16_linear_amx, rope_bf16) and torch's own
// ops for the rest (at::add, at::silu, at::mul), in the same order on the same tensors: the same bits without the
// Python calls between them (at decode sizes those calls, not the kernels, were most of a layer's time). A linear
// comes as (kind, tensors, ints): kind 0, a W8A8 group on AMX: {packed, s_w}, {qmax, n_1, ..., n_k}; kind 1, AMX-BF16
// products without a bias: {packed_1, ..., packed_k}, {n_1, kb_1, ..., n_k, kb_k}. The caller checks that each
// product is the one the module's own forward would run (interq.quant.linear.whole_linear_kernel / whole_linear_takes,
// interq.quant.packed_linear.product_choice) before it asks for these.
namespace {
std::vector<torch::Tensor> layer_linear(const torch::Tensor& x, int64_t kind, const std::vector<torch::Tensor>& t,
                                        const std::vector<int64_t>& ints) {
  if (kind == 0 || kind == 2) {
    TORCH_CHECK(t.size() == 2 && ints.size() >= 2, "layer kernels: an int8 linear takes {packed, s_w}, {qmax, n...}");
    const std::vector<int64_t> sizes(ints.begin() + 1, ints.end());
    return kind == 0 ? int8_linear_amx(x, t[0], t[1], sizes, ints[0], x.scalar_type())
                     : int8_linear_avx2(x, t[0], t[1], sizes, ints[0], x.scalar_type());
  }
  TORCH_CHECK((kind == 1 || kind == 3) && !t.empty() && ints.size() == 2 * t.size(),
              "layer kernels: kind must be 0 / 2 (int8 by AMX / AVX2: {packed, s_w}, {qmax, n...}) or 1 / 3 (bf16 by "
              "AMX / AVX2: {packed...}, {n, kb, ...})");
  std::vector<torch::Tensor> outs;
  for (size_t i = 0; i < t.size(); ++i)
    outs.push_back(kind == 1 ? bf16_linear_amx(x, t[i], ints[2 * i], c10::nullopt, ints[2 * i + 1])
                             : bf16_linear_avx2(x, t[i], ints[2 * i], c10::nullopt));
  return outs;
}
}  // namespace

// h [B, S, K] bf16 (contiguous) -> {q [B, S, H, D], k [B, S, Hkv, D] (rope_bf16's outputs), v [B * S, Hkv * D]}:
// q, k, v = qkv(norm(h)), q and k normalized per head where qn_w / kn_w are given (Qwen3's q_norm / k_norm over
// head_dim), then the rotary embedding of q and k by cos / sin; {} where a norm or the rotary embedding met a NaN
// (their eager ops then decide: the caller takes the step-by-step path; nothing was written anywhere).
std::vector<torch::Tensor> layer_attn_in(torch::Tensor h, torch::Tensor norm_w, double eps, int64_t lanes,
                                         int64_t kind, std::vector<torch::Tensor> lt, std::vector<int64_t> li,
                                         c10::optional<torch::Tensor> qn_w, double qn_eps, int64_t qn_lanes,
                                         c10::optional<torch::Tensor> kn_w, double kn_eps, int64_t kn_lanes,
                                         torch::Tensor cos, torch::Tensor sin, int64_t head_dim) {
  TORCH_CHECK(h.dim() == 3 && head_dim > 0, "layer_attn_in: h must be [B, S, K] and head_dim positive");
  TORCH_CHECK(qn_w.has_value() == kn_w.has_value(), "layer_attn_in: give both q and k norms or neither");
  auto [x, nan] = rms_norm_bf16(h, norm_w, eps, lanes);
  if (nan) return {};
  const int64_t b = h.size(0), s = h.size(1);
  auto qkv = layer_linear(x.view({b * s, h.size(2)}), kind, lt, li);
  TORCH_CHECK(qkv.size() == 3, "layer_attn_in: the q|k|v linear must give three outputs, got ", qkv.size());
  auto q = qkv[0].view({b, s, -1, head_dim}), k = qkv[1].view({b, s, -1, head_dim});
  if (qn_w.has_value()) {
    auto [qn, qnan] = rms_norm_bf16(q, *qn_w, qn_eps, qn_lanes);
    if (qnan) return {};
    auto [kn, knan] = rms_norm_bf16(k, *kn_w, kn_eps, kn_lanes);
    if (knan) return {};
    q = qn;
    k = kn;
  }
  auto [qr, kr, rnan] = rope_bf16(q, k, cos, sin);
  if (rnan) return {};
  return {qr, kr, qkv[2]};
}

// h [B, S, K] bf16 (contiguous), attn [B, S, H * Dv] (contiguous: the attention's output) -> {h1, out} with
// h1 = h + o_proj(attn), gate, up = gate_up(norm(h1)), out = h1 + down(silu(gate) * up); {h1} alone where the norm
// met a NaN (the caller goes on from h1 step by step).
std::vector<torch::Tensor> layer_attn_out(torch::Tensor h, torch::Tensor attn, int64_t o_kind,
                                          std::vector<torch::Tensor> o_t, std::vector<int64_t> o_i,
                                          torch::Tensor norm_w, double eps, int64_t lanes, int64_t g_kind,
                                          std::vector<torch::Tensor> g_t, std::vector<int64_t> g_i, int64_t d_kind,
                                          std::vector<torch::Tensor> d_t, std::vector<int64_t> d_i) {
  TORCH_CHECK(h.dim() == 3 && attn.dim() == 3 && attn.is_contiguous(), "layer_attn_out: h and attn must be [B, S, *]");
  const int64_t m = h.size(0) * h.size(1);
  auto o = layer_linear(attn.view({m, attn.size(2)}), o_kind, o_t, o_i);
  TORCH_CHECK(o.size() == 1, "layer_attn_out: o_proj must give one output");
  auto h1 = at::add(h, o[0].view(h.sizes()));
  auto [x, nan] = rms_norm_bf16(h1, norm_w, eps, lanes);
  if (nan) return {h1};
  auto gu = layer_linear(x.view({m, h.size(2)}), g_kind, g_t, g_i);
  TORCH_CHECK(gu.size() == 2, "layer_attn_out: the gate|up linear must give two outputs, got ", gu.size());
  auto d = layer_linear(at::mul(at::silu(gu[0]), gu[1]), d_kind, d_t, d_i);
  TORCH_CHECK(d.size() == 1, "layer_attn_out: down_proj must give one output");
  return {h1, at::add(h1, d[0].view(h.sizes()))};
}
