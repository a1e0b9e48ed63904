// torch's CPU flash attention of bf16 decode rows in one call (sdpa_packed's decode on AMX-BF16 CPUs).
#pragma once

#include "bf16_linear.h"

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
