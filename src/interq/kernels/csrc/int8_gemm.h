// int8 x int8 -> int32 GEMMs from weights packed once (pack_int8_vnni): AVX512-VNNI for few rows, AVX2 (int16
// products) for CPUs without VNNI, and the AVX2 backend's whole linear.
#pragma once

#include "quant.h"

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
