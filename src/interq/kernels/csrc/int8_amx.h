// The AMX-INT8 GEMM from the same packed weights, any number of rows, and the amx backend's whole linear (activation
// quantizer, GEMM and epilogue in one call).
#pragma once

#include "int8_gemm.h"

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
