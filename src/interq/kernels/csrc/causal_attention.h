// The learner's causal self-attention and its gradient in fp32 (train.learner_attention=kernel), on 16-lane fp32
// vectors (two __m256 on AVX2, one 64-byte vector elsewhere).
#pragma once

#include "common.h"

// ------------------------------------------------------------------------------------------------------------------
// fp32 vectors of 16 lanes for the learner's causal attention kernel (below): loads of fp32 and bf16 rows, a fixed
// order of horizontal sums, exp, max, masking of the lanes past a limit.
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
}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// causal_attention_fwd / causal_attention_bwd: NOT an eager chain's bits: the learner's causal self-attention
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
