// models/quants.cpp - ggml block geometry, dequantization to fp32 / bf16 and the quantizers.
// Each block kernel follows formats.md 1.6 (ggml-quants.c dequantize_row_* and, for Q8_0 and
// Q4/Q5 _0/_1, quantize_row_*_ref; the K-quant and IQ4_NL quantizers are this file's own, writing
// the layouts its dequantizers read); all block fields are read with memcpy, so sources need no
// alignment.
#include "models/quants.h"

#include "forge-impl.h" // forge_f16_to_f32, forge_f32_to_f16, forge_f32_to_bf16, forge_bf16_to_f32

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace forge {

namespace {

constexpr int64_t PAR_MIN = 1 << 16; // tensors with fewer elements run on one thread
constexpr int64_t CHUNK = 4096;      // bf16 staging: a multiple of every block size

inline bool use_threads(int64_t ne0, int64_t nrows) { return nrows > 1 && ne0 > 0 && nrows >= PAR_MIN / ne0; }

// Indexed by type id; a null name marks an unassigned or removed id. Sizes are ggml-common.h's
// block structs (static_asserts there); block counts are its QK* constants.
const ggml_type_traits TRAITS[] = {
    {"F32", 1, 4},       {"F16", 1, 2},        {"Q4_0", 32, 18},     {"Q4_1", 32, 20},
    {nullptr, 0, 0},     {nullptr, 0, 0},      {"Q5_0", 32, 22},     {"Q5_1", 32, 24},
    {"Q8_0", 32, 34},    {"Q8_1", 32, 36},     {"Q2_K", 256, 84},    {"Q3_K", 256, 110},
    {"Q4_K", 256, 144},  {"Q5_K", 256, 176},   {"Q6_K", 256, 210},   {"Q8_K", 256, 292},
    {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},  {"IQ3_S", 256, 110},  {"IQ2_S", 256, 82},   {"IQ4_XS", 256, 136},
    {"I8", 1, 1},        {"I16", 1, 2},        {"I32", 1, 4},        {"I64", 1, 8},
    {"F64", 1, 8},       {"IQ1_M", 256, 56},   {"BF16", 1, 2},       {nullptr, 0, 0},
    {nullptr, 0, 0},     {nullptr, 0, 0},      {"TQ1_0", 256, 54},   {"TQ2_0", 256, 66},
    {nullptr, 0, 0},     {nullptr, 0, 0},      {nullptr, 0, 0},      {"MXFP4", 32, 17},
    {"NVFP4", 64, 36},   {"Q1_0", 128, 18},    {"Q2_0", 64, 18},
};
constexpr uint32_t N_TRAITS = sizeof(TRAITS) / sizeof(TRAITS[0]);

inline float half_at(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return forge_f16_to_f32(h);
}
inline void put_half(uint8_t *p, float v) {
    uint16_t h = forge_f32_to_f16(v);
    std::memcpy(p, &h, 2);
}
inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---- block dequantizers: one block at b -> y[blck_size] --------------------------------

void deq_q8_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

void deq_q4_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

void deq_q4_1(const uint8_t *b, float *y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

// Q5_0 / Q5_1: element J takes bit J of the little-endian u32 qh as its fifth bit.
void deq_q5_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const uint32_t qh = u32_at(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int x0 = (int)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
        const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

void deq_q5_1(const uint8_t *b, float *y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint32_t qh = u32_at(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const int x0 = (int)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
        const int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

const int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void deq_iq4_nl(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)KVALUES_IQ4NL[qs[j] & 0x0F];
        y[j + 16] = d * (float)KVALUES_IQ4NL[qs[j] >> 4];
    }
}

// Q2_K: {scales[16], qs[64], d, dmin}; 16 sub-blocks of 16, 4-bit scale and min per sub-block.
void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *q = b + 16;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                const uint8_t sc = scales[is++];
                const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
    }
}

// Q3_K: {hmask[32], qs[64], scales[12], d}; 16 signed 6-bit scales (stored +32).
void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    const float d = half_at(b + 108);
    uint32_t aux[4];
    std::memcpy(aux, b + 96, 12);
    const uint32_t tmp = aux[2], k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
    aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
    aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
    aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
    int8_t sc[16];
    std::memcpy(sc, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++) {
                const float dl = d * (float)(sc[is++] - 32);
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * (float)((int)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
        }
    }
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: {d, dmin, scales[12], qs[128]}; Q5_K adds qh[32] before qs (fifth bit plane 2c / 2c+1).
template <bool FIVE>
void deq_qk_45(const uint8_t *b, float *y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *q = FIVE ? b + 48 : b + 16;
    for (int c = 0; c < 4; c++, q += 32) {
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * c, scales, &sc0, &m0);
        scale_min_k4(2 * c + 1, scales, &sc1, &m1);
        const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
        const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            const int h0 = FIVE ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
            y[64 * c + l] = d0 * (float)((q[l] & 0xF) + h0) - mm0;
        }
        for (int l = 0; l < 32; l++) {
            const int h1 = FIVE ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
            y[64 * c + 32 + l] = d1 * (float)((q[l] >> 4) + h1) - mm1;
        }
    }
}

// Q6_K: {ql[128], qh[64], scales[16] (int8), d}.
void deq_q6_k(const uint8_t *b, float *y) {
    const float d = half_at(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        float *Y = y + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            Y[l] = d * (float)sc[is + 0] * (float)q1;
            Y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            Y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            Y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

using block_fn = void (*)(const uint8_t *, float *);

// The block dequantizer of a quantized type, or nullptr (float types are handled directly).
block_fn block_dequantizer(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q8_0: return deq_q8_0;
    case GGML_TYPE_Q4_0: return deq_q4_0;
    case GGML_TYPE_Q4_1: return deq_q4_1;
    case GGML_TYPE_Q5_0: return deq_q5_0;
    case GGML_TYPE_Q5_1: return deq_q5_1;
    case GGML_TYPE_IQ4_NL: return deq_iq4_nl;
    case GGML_TYPE_Q2_K: return deq_q2_k;
    case GGML_TYPE_Q3_K: return deq_q3_k;
    case GGML_TYPE_Q4_K: return deq_qk_45<false>;
    case GGML_TYPE_Q5_K: return deq_qk_45<true>;
    case GGML_TYPE_Q6_K: return deq_q6_k;
    default: return nullptr;
    }
}

// ---- block quantizers: x[32] -> one block at b ------------------------------------------

void q_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)std::clamp(std::round(x[j] * id), -127.0f, 127.0f);
}

// The element of largest magnitude, with its sign (Q4_0 and Q5_0 map it to the most negative q).
float signed_absmax(const float *x, int n = 32) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    return max;
}

// Symmetric 4 / 5 bit: q = clamp(trunc(x/d + 2^(bits-1) + 0.5), 0, 2^bits - 1), d = max / -2^(bits-1).
template <int BITS>
void q_qx_0(const float *x, uint8_t *b) {
    constexpr int off = 1 << (BITS - 1), qmax = (1 << BITS) - 1;
    const float d = signed_absmax(x) / -(float)off, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    uint8_t *qs = b + (BITS == 5 ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = std::clamp((int)std::floor(x[j] * id + (float)off + 0.5f), 0, qmax);
        const int q1 = std::clamp((int)std::floor(x[j + 16] * id + (float)off + 0.5f), 0, qmax);
        qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (BITS == 5) std::memcpy(b + 2, &qh, 4);
}

// Asymmetric 4 / 5 bit: d = (max - min) / (2^bits - 1), m = min, q = round((x - min) / d).
template <int BITS>
void q_qx_1(const float *x, uint8_t *b) {
    constexpr int qmax = (1 << BITS) - 1;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) { mn = std::min(mn, x[j]); mx = std::max(mx, x[j]); }
    const float d = (mx - mn) / (float)qmax, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    put_half(b + 2, mn);
    uint8_t *qs = b + (BITS == 5 ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const int q0 = std::clamp((int)std::floor((x[j] - mn) * id + 0.5f), 0, qmax);
        const int q1 = std::clamp((int)std::floor((x[j + 16] - mn) * id + 0.5f), 0, qmax);
        qs[j] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (BITS == 5) std::memcpy(b + 4, &qh, 4);
}

// ---- K-quant block quantizers: x[256] -> one super-block at b --------------------------------
// Each sub-block first gets its own best scale (and min), found by a short search that scores
// every candidate by the squared error after a least-squares refit; the sub-block scales are then
// rounded to the few bits the format keeps, against a super-block fp16 scale, and every element
// is requantized with the rounded scale the dequantizer will use.

constexpr int SEARCH = 10; // candidate inverse scales: nmax + k/10 steps, k in [-SEARCH, SEARCH]

inline int nearest(float v) { return (int)std::lrint(v); }

// x[n] ~ scale * q - min with q in [0, nmax], scale >= 0, min >= 0 (the offset never goes above 0,
// as ggml's make_qkx2_quants). Start from the min/max fit and try inverse scales around it.
void fit_scale_min(const float *x, int n, int nmax, float *scale, float *min) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) { lo = std::min(lo, x[i]); hi = std::max(hi, x[i]); }
    *scale = (hi - lo) / (float)nmax, *min = -lo;
    if (hi == lo) return;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        const float e = *scale * (float)std::clamp(nearest((x[i] - lo) / *scale), 0, nmax) + lo - x[i];
        best += e * e;
    }
    for (int k = -SEARCH; k <= SEARCH; k++) {
        const float is = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        float sq = 0, sqq = 0, sx = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            const float q = (float)std::clamp(nearest((x[i] - lo) * is), 0, nmax);
            sq += q, sqq += q * q, sx += x[i], sqx += q * x[i];
        }
        const float det = (float)n * sqq - sq * sq;
        if (det <= 0) continue;
        float s = ((float)n * sqx - sq * sx) / det, o = (sqq * sx - sq * sqx) / det;
        if (o > 0) o = 0, s = sqx / sqq;
        if (s <= 0) continue;
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float e = s * (float)std::clamp(nearest((x[i] - o) / s), 0, nmax) + o - x[i];
            err += e * e;
        }
        if (err < best) best = err, *scale = s, *min = -o;
    }
}

// x[n] ~ scale * q with q in [-nmax, nmax - 1]; the scale's sign maps the largest magnitude to
// -nmax, where the range is one longer. Each candidate keeps its least-squares scale.
float fit_scale(const float *x, int n, int nmax) {
    const float big = signed_absmax(x, n);
    if (big == 0.0f) return 0.0f;
    float scale = 0.0f, best = -1.0f;
    for (int k = -SEARCH; k <= SEARCH; k++) {
        const float is = -((float)nmax + 0.1f * (float)k) / big;
        float sqq = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            const float q = (float)std::clamp(nearest(x[i] * is), -nmax, nmax - 1);
            sqq += q * q, sqx += q * x[i];
        }
        // the squared error is sum x^2 - sqx^2 / sqq: the best candidate has the largest sqx^2 / sqq
        if (sqq > 0 && sqx * sqx / sqq > best) best = sqx * sqx / sqq, scale = sqx / sqq;
    }
    return scale;
}

// Q2_K / Q4_K / Q5_K: NSUB sub-blocks of 256 / NSUB, q in [0, NMAX]; scales and mins as SMAX-step
// integers against the super-block d = max scale / SMAX and dmin = max min / SMAX.
template <int NSUB, int NMAX, int SMAX>
void quant_scale_min_k(const float *x, uint8_t *q, int *ls, int *lm, float *d, float *dmin) {
    constexpr int L = 256 / NSUB;
    float sc[NSUB], mn[NSUB], max_sc = 0, max_mn = 0;
    for (int s = 0; s < NSUB; s++) {
        fit_scale_min(x + L * s, L, NMAX, &sc[s], &mn[s]);
        max_sc = std::max(max_sc, sc[s]), max_mn = std::max(max_mn, mn[s]);
    }
    *d = forge_f16_to_f32(forge_f32_to_f16(max_sc / SMAX));
    *dmin = forge_f16_to_f32(forge_f32_to_f16(max_mn / SMAX));
    for (int s = 0; s < NSUB; s++) {
        ls[s] = *d > 0 ? std::clamp(nearest(sc[s] / *d), 0, SMAX) : 0;
        lm[s] = *dmin > 0 ? std::clamp(nearest(mn[s] / *dmin), 0, SMAX) : 0;
        const float dl = *d * (float)ls[s], ml = *dmin * (float)lm[s];
        for (int i = L * s; i < L * s + L; i++) q[i] = (uint8_t)(dl > 0 ? std::clamp(nearest((x[i] + ml) / dl), 0, NMAX) : 0);
    }
}

// Q3_K / Q6_K: 16 sub-blocks of 16, q in [-NMAX, NMAX - 1]; signed scales in [-SMAX, SMAX - 1]
// against d = -(the scale of largest magnitude) / SMAX, which maps that scale to -SMAX.
template <int NMAX, int SMAX>
void quant_scale_k(const float *x, int8_t *q, int *ls, float *d) {
    float sc[16];
    for (int s = 0; s < 16; s++) sc[s] = fit_scale(x + 16 * s, 16, NMAX);
    *d = forge_f16_to_f32(forge_f32_to_f16(-signed_absmax(sc, 16) / SMAX));
    for (int s = 0; s < 16; s++) {
        ls[s] = *d != 0 ? std::clamp(nearest(sc[s] / *d), -SMAX, SMAX - 1) : 0;
        const float dl = *d * (float)ls[s];
        for (int i = 16 * s; i < 16 * s + 16; i++) q[i] = (int8_t)(dl != 0 ? std::clamp(nearest(x[i] / dl), -NMAX, NMAX - 1) : 0);
    }
}

// Q2_K: 2-bit q, 4-bit scale (low nibble) and min (high nibble) per sub-block of 16; element e
// sits in byte 16 + 32 (e / 128) + e % 32 at bit 2 ((e % 128) / 32).
void q_q2_k(const float *x, uint8_t *b) {
    uint8_t q[256];
    int ls[16], lm[16];
    float d, dmin;
    quant_scale_min_k<16, 3, 15>(x, q, ls, lm, &d, &dmin);
    std::memset(b, 0, 84);
    for (int s = 0; s < 16; s++) b[s] = (uint8_t)(ls[s] | lm[s] << 4);
    for (int e = 0; e < 256; e++) b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q[e] << (2 * ((e % 128) / 32)));
    put_half(b + 80, d);
    put_half(b + 82, dmin);
}

// Q3_K: q + 4 in 0..7 split into 2 low bits (laid out as Q2_K's) and a high bit in hmask[e % 32]
// at bit e / 32; 6-bit scales stored + 32, low nibbles in bytes 0-7, high 2 bits in bytes 8-11.
void q_q3_k(const float *x, uint8_t *b) {
    int8_t q[256];
    int ls[16];
    float d;
    quant_scale_k<4, 32>(x, q, ls, &d);
    std::memset(b, 0, 110);
    for (int e = 0; e < 256; e++) {
        const int u = q[e] + 4;
        b[32 + 32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e % 128) / 32)));
        b[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
    }
    for (int s = 0; s < 16; s++) {
        const int u = ls[s] + 32;
        b[96 + s % 8] |= (uint8_t)((u & 15) << (4 * (s / 8)));
        b[104 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
    }
    put_half(b + 108, d);
}

// Q4_K / Q5_K: sub-block s of 32; 64-element chunk c = s / 2 keeps its low nibbles in qs[32 c + l]
// (s even: low half of the byte) and Q5_K's fifth bits in qh[l] at bit s. The 6-bit scale and
// min of s < 4 fill bytes s and s + 4; for s >= 4 their low nibbles share byte s + 4 and their
// top 2 bits go to the free top bits of bytes s - 4 and s (the inverse of scale_min_k4).
template <bool FIVE>
void q_qk_45(const float *x, uint8_t *b) {
    uint8_t q[256];
    int ls[8], lm[8];
    float d, dmin;
    quant_scale_min_k<8, FIVE ? 31 : 15, 63>(x, q, ls, lm, &d, &dmin);
    std::memset(b, 0, FIVE ? 176 : 144);
    put_half(b, d);
    put_half(b + 2, dmin);
    uint8_t *scales = b + 4, *qh = b + 16, *qs = FIVE ? b + 48 : b + 16;
    for (int s = 0; s < 4; s++) {
        scales[s] = (uint8_t)(ls[s] | (ls[s + 4] >> 4) << 6);
        scales[s + 4] = (uint8_t)(lm[s] | (lm[s + 4] >> 4) << 6);
        scales[s + 8] = (uint8_t)((ls[s + 4] & 15) | (lm[s + 4] & 15) << 4);
    }
    for (int e = 0; e < 256; e++) {
        const int s = e / 32, l = e % 32;
        qs[32 * (s / 2) + l] |= (uint8_t)((q[e] & 15) << (4 * (s % 2)));
        if (FIVE) qh[l] |= (uint8_t)((q[e] >> 4) << s);
    }
}

// Q6_K: q + 32 in 0..63; half h = e / 128, group g = (e % 128) / 32, l = e % 32: low nibble in
// ql[64 h + 32 (g % 2) + l] (g >= 2: high half), top 2 bits in qh[32 h + l] at bit 2 g; int8
// scales[e / 16].
void q_q6_k(const float *x, uint8_t *b) {
    int8_t q[256];
    int ls[16];
    float d;
    quant_scale_k<32, 128>(x, q, ls, &d);
    std::memset(b, 0, 210);
    for (int e = 0; e < 256; e++) {
        const int u = q[e] + 32, h = e / 128, g = (e % 128) / 32, l = e % 32;
        b[64 * h + 32 * (g % 2) + l] |= (uint8_t)((u & 15) << (4 * (g / 2)));
        b[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * g));
    }
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)ls[s];
    put_half(b + 208, d);
}

// IQ4_NL: 32 elements, fp16 d and 4-bit indices into KVALUES_IQ4NL (a grid from -127 to 113,
// denser near 0). Two starts: d maps the element of largest magnitude to -127 or to 113. From
// each, every element takes the grid value nearest to x / d, and d is refitted by least squares
// to those values and rounded to fp16; the elements are mapped again with the refitted d of the
// start that leaves the smaller squared error.
void q_iq4_nl(const float *x, uint8_t *b) {
    auto pick = [x](float d, int *idx) {
        for (int j = 0; j < 32; j++) {
            const float v = d != 0.0f ? x[j] / d : 0.0f;
            int best = 0;
            for (int k = 1; k < 16; k++)
                if (std::fabs(v - (float)KVALUES_IQ4NL[k]) < std::fabs(v - (float)KVALUES_IQ4NL[best])) best = k;
            idx[j] = best;
        }
    };
    auto refit = [x](const int *idx, float d) {
        float sxv = 0, svv = 0;
        for (int j = 0; j < 32; j++) sxv += x[j] * (float)KVALUES_IQ4NL[idx[j]], svv += (float)(KVALUES_IQ4NL[idx[j]] * KVALUES_IQ4NL[idx[j]]);
        return forge_f16_to_f32(forge_f32_to_f16(sxv != 0 ? sxv / svv : d));
    };
    const float big = signed_absmax(x);
    float best_d = 0, best_err = INFINITY;
    for (float d : {big / -127.0f, big / 113.0f}) {
        int idx[32];
        pick(d, idx);
        d = refit(idx, d);
        pick(d, idx);
        float err = 0;
        for (int j = 0; j < 32; j++) err += (x[j] - d * (float)KVALUES_IQ4NL[idx[j]]) * (x[j] - d * (float)KVALUES_IQ4NL[idx[j]]);
        if (err < best_err) best_err = err, best_d = d;
    }
    int idx[32];
    pick(best_d, idx);
    put_half(b, best_d);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(idx[j] | idx[j + 16] << 4);
}

using quant_fn = void (*)(const float *, uint8_t *);

quant_fn block_quantizer(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q8_0: return q_q8_0;
    case GGML_TYPE_Q4_0: return q_qx_0<4>;
    case GGML_TYPE_Q5_0: return q_qx_0<5>;
    case GGML_TYPE_Q4_1: return q_qx_1<4>;
    case GGML_TYPE_Q5_1: return q_qx_1<5>;
    case GGML_TYPE_Q2_K: return q_q2_k;
    case GGML_TYPE_Q3_K: return q_q3_k;
    case GGML_TYPE_Q4_K: return q_qk_45<false>;
    case GGML_TYPE_Q5_K: return q_qk_45<true>;
    case GGML_TYPE_Q6_K: return q_q6_k;
    case GGML_TYPE_IQ4_NL: return q_iq4_nl;
    default: return nullptr;
    }
}

bool is_float_type(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

std::string type_label(uint32_t type) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "ggml type %u (%s)", type, ggml_type_name(type));
    return buf;
}

// Common checks of the tensor-level entry points; *rb = bytes per row.
bool check_rows(uint32_t type, bool supported, const char *what, int64_t ne0, int64_t nrows, uint64_t *rb,
                std::string *err) {
    if (!supported) {
        if (err) *err = "cannot " + std::string(what) + " " + type_label(type) + ": unsupported";
        return false;
    }
    if (!ggml_row_size(type, ne0, rb, err)) return false;
    if (nrows < 0) {
        if (err) *err = "negative row count " + std::to_string(nrows);
        return false;
    }
    return true;
}

} // namespace

const ggml_type_traits *ggml_traits(uint32_t type) {
    return type < N_TRAITS && TRAITS[type].name ? &TRAITS[type] : nullptr;
}

const char *ggml_type_name(uint32_t type) {
    const ggml_type_traits *t = ggml_traits(type);
    return t ? t->name : "unknown";
}

uint32_t ggml_type_by_name(const std::string &name) {
    for (uint32_t type = 0; type < 64; type++) {
        const ggml_type_traits *t = ggml_traits(type);
        if (!t || std::strlen(t->name) != name.size()) continue;
        bool same = true;
        for (size_t i = 0; i < name.size(); i++) same = same && std::tolower((unsigned char)t->name[i]) == std::tolower((unsigned char)name[i]);
        if (same) return type;
    }
    return UINT32_MAX;
}

bool ggml_can_dequantize(uint32_t type) { return is_float_type(type) || block_dequantizer(type) != nullptr; }

bool ggml_can_quantize(uint32_t type) { return is_float_type(type) || block_quantizer(type) != nullptr; }

std::string ggml_quantizable_names() {
    std::string out;
    for (uint32_t t = 0; t < N_TRAITS; t++) {
        if (!TRAITS[t].name || !ggml_can_quantize(t)) continue;
        std::string n = TRAITS[t].name;
        for (char &c : n) c = (char)std::tolower((unsigned char)c);
        out += (out.empty() ? "" : ", ") + n;
    }
    return out;
}

bool ggml_row_size(uint32_t type, int64_t ne0, uint64_t *bytes, std::string *err) {
    const ggml_type_traits *t = ggml_traits(type);
    if (!t) {
        if (err) *err = "unknown " + type_label(type);
        return false;
    }
    if (ne0 < 0 || ne0 % t->blck_size != 0) {
        if (err) *err = "row of " + std::to_string(ne0) + " elements is not a multiple of the block size " +
                        std::to_string(t->blck_size) + " of " + type_label(type);
        return false;
    }
    const uint64_t blocks = (uint64_t)ne0 / t->blck_size;
    if (blocks > UINT64_MAX / t->type_size) {
        if (err) *err = "row of " + std::to_string(ne0) + " elements of " + type_label(type) + " overflows 64 bits";
        return false;
    }
    *bytes = blocks * t->type_size;
    return true;
}

void dequantize_row_f32(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    switch (type) {
    case GGML_TYPE_F32: std::memcpy(dst, s, (size_t)n * 4); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = half_at(s + 2 * i);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            std::memcpy(&h, s + 2 * i, 2);
            dst[i] = forge_bf16_to_f32(h);
        }
        return;
    default: break;
    }
    const block_fn fn = block_dequantizer(type);
    const ggml_type_traits *t = ggml_traits(type);
    for (int64_t i = 0; i < n / t->blck_size; i++) fn(s + i * t->type_size, dst + i * t->blck_size);
}

void dequantize_row_bf16(uint32_t type, const void *src, uint16_t *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    if (type == GGML_TYPE_BF16) {
        std::memcpy(dst, s, (size_t)n * 2);
        return;
    }
    if (type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            float f;
            std::memcpy(&f, s + 4 * i, 4);
            dst[i] = forge_f32_to_bf16(f);
        }
        return;
    }
    const ggml_type_traits *t = ggml_traits(type);
    float buf[CHUNK];
    for (int64_t i = 0; i < n; i += CHUNK) {
        const int64_t m = std::min(CHUNK, n - i);
        dequantize_row_f32(type, s + i / t->blck_size * t->type_size, buf, m);
        for (int64_t j = 0; j < m; j++) dst[i + j] = forge_f32_to_bf16(buf[j]);
    }
}

bool dequantize_f32(uint32_t type, const void *src, int64_t ne0, int64_t nrows, float *dst, std::string *err) {
    uint64_t rb;
    if (!check_rows(type, ggml_can_dequantize(type), "dequantize", ne0, nrows, &rb, err)) return false;
#pragma omp parallel for schedule(static) if (use_threads(ne0, nrows))
    for (int64_t r = 0; r < nrows; r++) dequantize_row_f32(type, (const uint8_t *)src + r * rb, dst + r * ne0, ne0);
    return true;
}

bool dequantize_bf16(uint32_t type, const void *src, int64_t ne0, int64_t nrows, uint16_t *dst, std::string *err) {
    uint64_t rb;
    if (!check_rows(type, ggml_can_dequantize(type), "dequantize", ne0, nrows, &rb, err)) return false;
#pragma omp parallel for schedule(static) if (use_threads(ne0, nrows))
    for (int64_t r = 0; r < nrows; r++) dequantize_row_bf16(type, (const uint8_t *)src + r * rb, dst + r * ne0, ne0);
    return true;
}

void quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    uint8_t *d = (uint8_t *)dst;
    switch (type) {
    case GGML_TYPE_F32: std::memcpy(d, src, (size_t)n * 4); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) put_half(d + 2 * i, src[i]);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = forge_f32_to_bf16(src[i]);
            std::memcpy(d + 2 * i, &h, 2);
        }
        return;
    default: break;
    }
    const quant_fn fn = block_quantizer(type);
    const ggml_type_traits *t = ggml_traits(type);
    for (int64_t i = 0; i < n / t->blck_size; i++) fn(src + i * t->blck_size, d + i * t->type_size);
}

bool quantize(uint32_t type, const float *src, int64_t ne0, int64_t nrows, void *dst, std::string *err) {
    uint64_t rb;
    if (!check_rows(type, ggml_can_quantize(type), "quantize to", ne0, nrows, &rb, err)) return false;
    for (int64_t i = 0; i < ne0 * nrows; i++) {
        if (!std::isfinite(src[i])) {
            if (err) *err = "cannot quantize to " + type_label(type) + ": non-finite value at row " +
                            std::to_string(i / ne0) + ", column " + std::to_string(i % ne0);
            return false;
        }
    }
#pragma omp parallel for schedule(static) if (use_threads(ne0, nrows))
    for (int64_t r = 0; r < nrows; r++) quantize_row(type, src + r * ne0, (uint8_t *)dst + r * rb, ne0);
    return true;
}

} // namespace forge
