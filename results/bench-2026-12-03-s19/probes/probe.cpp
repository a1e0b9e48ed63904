#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmath>
#include <vector>
#include <cstring>

using at::vec::Vectorized;
static float* g_de = nullptr; static float* g_ds = nullptr; static float* g_dd = nullptr;
void set_dbg(torch::Tensor e, torch::Tensor s, torch::Tensor d) { g_de = e.data_ptr<float>(); g_ds = s.data_ptr<float>(); g_dd = d.data_ptr<float>(); }
static int g_exp = 0; static int g_var = 0; static int g_pvmode = 0;
void set_exp(int64_t e) { g_exp = e; }
void set_var(int64_t e) { g_var = e; }
void set_pvmode(int64_t e) { g_pvmode = e; }
struct alignas(64) Cfg { uint8_t palette = 1, start_row = 0, reserved[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
static bool perm() { static bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0; return ok; }

static inline float bf2f(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) { c10::BFloat16 b(f); return b.x; }  // RNE

// C[G x n16] = sum over kchunks of A[G x 32] * B(packed 16 x 16 x 2)
// mode 0: AMX; mode 1: vdpbf16ps sequential pairs (single acc); mode 2: fp32 fma sequential even/odd; mode 3: plain float sequential
static void dot_block(int mode, int G, const uint16_t* a, int64_t lda, const uint16_t* bp /*[kc][16][16][2]*/, int kc, float* c /*G x 16*/, const float* init = nullptr) {
  if (mode == 0) {
    Cfg cfg; cfg.rows[0] = G; cfg.colsb[0] = 64; cfg.rows[1] = G; cfg.colsb[1] = 64; cfg.rows[2] = 16; cfg.colsb[2] = 64;
    _tile_loadconfig(&cfg);
    if (init) _tile_loadd(0, init, 64); else _tile_zero(0);
    for (int ch = 0; ch < kc; ++ch) {
      _tile_loadd(1, a + ch * 32, lda * 2);
      _tile_loadd(2, bp + ch * 512, 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    return;
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 16; ++j) {
      float acc = 0.f;
      for (int ch = 0; ch < kc; ++ch)
        for (int p = 0; p < 16; ++p) {
          float a0 = bf2f(a[g * lda + ch * 32 + 2 * p]), a1 = bf2f(a[g * lda + ch * 32 + 2 * p + 1]);
          float b0 = bf2f(bp[ch * 512 + p * 32 + j * 2]), b1 = bf2f(bp[ch * 512 + p * 32 + j * 2 + 1]);
          if (mode == 1) { acc = acc + a1 * b1; acc = acc + a0 * b0; }
          else { acc = acc + a0 * b0; acc = acc + a1 * b1; }
        }
      c[g * 16 + j] = acc;
    }
}

// q [B,H,G,D], k/v [B,H,L,D] bf16 contiguous-last-dim; mask [B,1,1,L] bf16 additive (or empty)
torch::Tensor flash_probe(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale_d,
                          int64_t mqk, int64_t mpv, int64_t kvsplit, int64_t pvkb) {
  TORCH_CHECK(perm());
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), L = k.size(2);
  auto out = torch::empty_like(q);
  const float scale = (float)scale_d;
  const bool has_mask = mask.numel() > 0;
  using Vec = Vectorized<float>;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t* qp = (const uint16_t*)q.data_ptr<at::BFloat16>() + (b * q.stride(0) + h * q.stride(1));
      const uint16_t* kp = (const uint16_t*)k.data_ptr<at::BFloat16>() + (b * k.stride(0) + h * k.stride(1));
      const uint16_t* vp = (const uint16_t*)v.data_ptr<at::BFloat16>() + (b * v.stride(0) + h * v.stride(1));
      const int64_t qs = q.stride(2), ks = k.stride(2), vs = v.stride(2);
      std::vector<float> mx(G, -INFINITY), sm(G, 0.f), dst(G * D, 0.f);
      for (int64_t n = 0; n < L; n += kvsplit) {
        const int64_t kb = std::min(kvsplit, L - n);
        const int64_t kb16 = (kb + 15) / 16 * 16;
        std::vector<float> qk(G * kb16);
        // QK
        const int kc = D / 32;
        std::vector<uint16_t> pk(kc * 512);
        std::vector<float> cb(16 * 16);
        for (int64_t j0 = 0; j0 < kb; j0 += 16) {
          std::fill(pk.begin(), pk.end(), 0);
          for (int64_t j = j0; j < std::min(kb, j0 + 16); ++j)
            for (int64_t d = 0; d < D; ++d) pk[(d / 32) * 512 + ((d % 32) / 2) * 32 + (j - j0) * 2 + (d % 2)] = kp[(n + j) * ks + d];
          dot_block(mqk, G, qp, qs, pk.data(), kc, cb.data());
          for (int g = 0; g < G; ++g) for (int j = 0; j < 16; ++j) qk[g * kb16 + j0 + j] = cb[g * 16 + j];
        }
        std::vector<uint16_t> pr(G * ((kb + 31) / 32 * 32), 0);
        const int64_t ldp = (kb + 31) / 32 * 32;
        for (int g = 0; g < G; ++g) {
          float* row = qk.data() + g * kb16;
          float tmax;
          if (has_mask) {
            const at::BFloat16* mp = mask.data_ptr<at::BFloat16>() + b * mask.stride(0) + n;
            for (int64_t j = 0; j < kb; ++j) { float t = row[j] * scale; row[j] = t + (float)mp[j]; }
            tmax = at::vec::reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, row, kb);
          } else {
            Vec vt(-INFINITY); float tm = -INFINITY; int64_t j = 0;
            for (; j < Vec::size() * (kb / Vec::size()); j += Vec::size()) { auto t = Vec::loadu(row + j) * Vec(scale); vt = at::vec::maximum(vt, t); t.store(row + j); }
            for (; j < kb; ++j) { float t = row[j] * scale; tm = std::max(tm, t); row[j] = t; }
            tmax = std::max(tm, at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, vt));
          }
          tmax = mx[g] > tmax ? mx[g] : tmax;
          if (tmax == -INFINITY) { for (int64_t j = 0; j < kb; ++j) pr[g * ldp + j] = 0; continue; }
          // exp + sum
          Vec vs(0.f), vs1(0.f); int64_t j = 0; float s = 0.f; int nv = 0;
          for (; j < Vec::size() * (kb / Vec::size()); j += Vec::size()) {
            auto x = (Vec::loadu(row + j) - Vec(tmax)); Vec t;
            if (g_exp == 0) t = x.exp_u20(); else if (g_exp == 1) t = x.fexp_u20(); else if (g_exp == 2) t = x.exp(); else { float xb[16]; x.store(xb); for (int e = 0; e < 16; ++e) xb[e] = std::exp(xb[e]); t = Vec::loadu(xb); }
            if (nv++ % 2) vs1 = vs1 + t; else vs = vs + t;
            if (g_de && b == 0 && h == 0) t.store(g_de + g * kb + j);
            float tb[64]; t.store(tb); for (int e = 0; e < Vec::size(); ++e) pr[g * ldp + j + e] = f2bf(tb[e]);
          }
          vs = vs + vs1;
          if ((g_var & 128) && j < kb) {
            int rem = kb - j;
            auto x = Vec::loadu(row + j, rem) - Vec(tmax);
            auto t = x.fexp_u20();
            vs = Vec::set(vs, vs + t, rem);
            float tb[16]; t.store(tb);
            for (int e = 0; e < rem; ++e) pr[g * ldp + j + e] = f2bf(tb[e]);
            j = kb;
          }
          s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, vs);
          if ((g_var & 256) && j < kb) {
            int rem = kb - j;
            auto x = Vec::loadu(row + j, rem) - Vec(tmax);
            float tb[16]; x.fexp_u20().store(tb);
            for (int e = 0; e < rem; ++e) { s += tb[e]; pr[g * ldp + j + e] = f2bf(tb[e]); }
            j = kb;
          }
          if (g_var & 4) { for (; j < kb; ++j) { double t = ::exp((double)(row[j] - tmax)); s = (float)((double)s + t); pr[g * ldp + j] = f2bf((float)t); } }
          else for (; j < kb; ++j) { float t = std::exp(row[j] - tmax); s += t; pr[g * ldp + j] = f2bf(t); if (g_de && b == 0 && h == 0) g_de[g * kb + j] = t; }
          float et = std::exp(mx[g] - tmax);
          if (g_var & 8) { float tb[16]; Vec(mx[g] - tmax).fexp_u20().store(tb); et = tb[0]; }
          if (g_var & 16) { float tb[16]; Vec(mx[g] - tmax).exp_u20().store(tb); et = tb[0]; }
          if (g_var & 32) { et = (float)::exp((double)(mx[g] - tmax)); }
          if (g_ds && b == 0 && h == 0) g_ds[g] = s;
          sm[g] = (g_var & 1) ? std::fma(et, sm[g], s) : s + et * sm[g];
          mx[g] = tmax;
          if (n > 0) for (int64_t d = 0; d < D; ++d) dst[g * D + d] = dst[g * D + d] * et;
        }
        // PV: dst[g, d] (+)= sum_j p[g, j] v[j, d]
        const int64_t kcp = ldp / 32;
        std::vector<uint16_t> pv(kcp * 512);
        std::vector<float> tot(G * 16), part(G * 16);
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
          std::fill(pv.begin(), pv.end(), 0);
          for (int64_t j = 0; j < kb; ++j) for (int64_t d = d0; d < d0 + 16; ++d)
            pv[(j / 32) * 512 + ((j % 32) / 2) * 32 + (d - d0) * 2 + (j % 2)] = vp[(n + j) * vs + d];
          int64_t kbb = pvkb > 0 ? pvkb : kcp;
          // running: G x 16 (C or nothing)
          std::vector<float> run(G * 16, 0.f);
          const bool has_c = n > 0;
          for (int g = 0; g < G; ++g) for (int dd = 0; dd < 16; ++dd) run[g * 16 + dd] = dst[g * D + d0 + dd];
          const int pm = g_pvmode;
          std::vector<float> sumb(G * 16, 0.f);
          for (int64_t c0 = 0; c0 < kcp; c0 += kbb) {
            int cc = std::min(kbb, kcp - c0);
            bool first = c0 == 0;
            if (pm == 0) {  // A: tile carries everything
              dot_block(mpv, G, pr.data() + c0 * 32, ldp, pv.data() + c0 * 512, cc, tot.data(), (has_c || !first) ? run.data() : nullptr);
              run = tot;
            } else if (pm == 1) {  // B: first K block loads C, later ones from zero added in memory
              if (first) { dot_block(mpv, G, pr.data() + c0 * 32, ldp, pv.data() + c0 * 512, cc, tot.data(), has_c ? run.data() : nullptr); run = tot; }
              else { dot_block(mpv, G, pr.data() + c0 * 32, ldp, pv.data() + c0 * 512, cc, part.data()); for (int i = 0; i < G * 16; ++i) run[i] = run[i] + part[i]; }
            } else if (pm == 2) {  // C: each from zero, added sequentially to C
              dot_block(mpv, G, pr.data() + c0 * 32, ldp, pv.data() + c0 * 512, cc, part.data());
              for (int i = 0; i < G * 16; ++i) run[i] = (first && !has_c) ? part[i] : run[i] + part[i];
            } else {  // D: C + (b1 + b2 + ...)
              dot_block(mpv, G, pr.data() + c0 * 32, ldp, pv.data() + c0 * 512, cc, part.data());
              for (int i = 0; i < G * 16; ++i) sumb[i] = first ? part[i] : sumb[i] + part[i];
              if (c0 + kbb >= kcp) for (int i = 0; i < G * 16; ++i) run[i] = has_c ? run[i] + sumb[i] : sumb[i];
            }
          }
          for (int g = 0; g < G; ++g) for (int dd = 0; dd < 16; ++dd) dst[g * D + d0 + dd] = run[g * 16 + dd];
        }
      }
      uint16_t* op = (uint16_t*)out.data_ptr<at::BFloat16>() + (b * out.stride(0) + h * out.stride(1));
      for (int g = 0; g < G; ++g) {
        float s = sm[g] == 0 ? 1 : sm[g];
        float r = 1 / s;
        if (g_dd && b == 0 && h == 0) for (int64_t d = 0; d < D; ++d) g_dd[g * D + d] = dst[g * D + d];
        for (int64_t d = 0; d < D; ++d) op[g * out.stride(2) + d] = f2bf(dst[g * D + d] * r);
      }
    }
  return out;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("flash_probe", &flash_probe); m.def("set_exp", &set_exp); m.def("set_var", &set_var); m.def("set_dbg", &set_dbg); m.def("set_pvmode", &set_pvmode); }
