// bf16 linears in torch's sums: by AMX-BF16 tiles where oneDNN sums that way (checked by the caller's probe), and
// the AVX2 product where torch runs its reference kernel (no native bf16).
#pragma once

#include "int8_amx.h"

// ------------------------------------------------------------------------------------------------------------------
// bf16 x bf16 -> bf16 linear by AMX-BF16 tiles (interq.kernels.packed_linear): F.linear's bits where oneDNN's are these.
//
// out[m, n] = bf16(sum_k x[m, k] w[n, k] (+ bias[n])), the sum in fp32 tile accumulators, k in chunks of 32 (one
// tdpbf16ps per 16 x 16 output tile and chunk, in k order), in K blocks of kb chunks (kb = 0: one block): each
// block is summed from zero in the tiles and added to the running fp32 total in k order, as oneDNN's brgemm does
// where it splits K (which it does, or not, by the shape, the row count and the threads: the caller compares this
// product with F.linear's on a probe and passes the kb that gives its bits, never assuming one). The bias is added
// in fp32 to the total, which is rounded to bf16 by vcvtneps2bf16 (round to nearest even), as oneDNN does.
// Weights packed by interq.kernels.packed_linear.pack_bf16_amx: [ceil(N / 16), K / 2, 16, 2] bf16, one column block's
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
// (interq.kernels.packed_linear.pack_bf16_avx2) as [ceil(N / 16), K, 16] bf16 with k in the order the slots consume
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
