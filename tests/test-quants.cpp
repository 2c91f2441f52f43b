// tests/test-quants.cpp - models/quants: block geometry; exact dequantization of hand-built
// blocks of every supported type (the test packs chosen scales and quants into bytes following
// formats.md 1.6 and computes the expected values from those logical values, independently of
// the unpacking code); bf16 rounding of the output; quantize -> dequantize error bounds for
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and for Q2_K..Q6_K against those on the same data; the threaded
// tensor paths; errors.
#include "test-util.h"

#include "models/quants.h"

#include <cstring>

using namespace forge;

namespace {

// fp16 values used as scales, with their bit patterns (exact, so nothing depends on a converter)
struct Half { uint16_t bits; float val; };
const Half H_ONE{0x3C00, 1.0f}, H_HALF{0x3800, 0.5f}, H_QUARTER{0x3400, 0.25f}, H_MQUARTER{0xB400, -0.25f},
    H_M1_5{0xBE00, -1.5f}, H_THREE{0x4200, 3.0f}, H_EIGHTH{0x3000, 0.125f};

void put16(std::vector<uint8_t> &b, size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); }

// A quant pattern in 0..mod-1 with no short period (a periodic one hides swapped bit planes).
int pat(int e, int blk, int mod) {
    uint32_t x = (uint32_t)e * 0x9E3779B9u + (uint32_t)blk * 0x85EBCA6Bu + 1u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return (int)(x % (uint32_t)mod);
}

uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Round to nearest even on the bit pattern; NaN -> a quiet NaN.
uint16_t ref_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    uint32_t lo = u & 0xffffu, hi = u >> 16;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
    return (uint16_t)hi;
}

// Dequantizes one row and compares with the expected values (bit-exact), then checks the bf16
// path against RNE of those expected values.
void expect_row(const char *what, uint32_t type, const std::vector<uint8_t> &bytes, const std::vector<float> &want) {
    const int64_t n = (int64_t)want.size();
    uint64_t rb = 0;
    std::string err;
    CHECK(ggml_row_size(type, n, &rb, &err) && rb == bytes.size(), "%s: row size %llu for %zu bytes (%s)", what,
          (unsigned long long)rb, bytes.size(), err.c_str());
    std::vector<float> got(n);
    dequantize_row_f32(type, bytes.data(), got.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (f2u(got[i]) != f2u(want[i]) && bad++ < 4)
            CHECK(false, "%s: element %lld = %.9g, expected %.9g", what, (long long)i, got[i], want[i]);
    }
    std::vector<uint16_t> gb(n);
    dequantize_row_bf16(type, bytes.data(), gb.data(), n);
    for (int64_t i = 0; i < n; i++) {
        if (gb[i] != ref_bf16(want[i]) && bad++ < 4)
            CHECK(false, "%s: bf16 element %lld = 0x%04x, expected 0x%04x", what, (long long)i, gb[i], ref_bf16(want[i]));
    }
}

// ---- block builders: logical values -> bytes (formats.md 1.6), expected values -------------

// Q4_0 / Q5_0 / Q4_1 / Q5_1 / Q8_0 / IQ4_NL over nb blocks; q[e] are the stored quants.
void test_legacy(int nb) {
    const int N = 32 * nb;
    std::vector<int> q(N);
    // Q8_0: d = 0.5 (block 0) or -0.25, qs = all of -128..127 spread over the row
    {
        std::vector<uint8_t> b(34 * nb);
        std::vector<float> want(N);
        for (int blk = 0; blk < nb; blk++) {
            const Half d = blk % 2 ? H_MQUARTER : H_HALF;
            put16(b, 34 * blk, d.bits);
            for (int j = 0; j < 32; j++) {
                const int v = pat(32 * blk + j, blk, 256) - 128;
                b[34 * blk + 2 + j] = (uint8_t)(int8_t)v;
                want[32 * blk + j] = d.val * (float)v;
            }
        }
        expect_row("Q8_0", GGML_TYPE_Q8_0, b, want);
    }
    // Q4_0 (d = -0.25), IQ4_NL (d = 0.5): low nibbles are elements 0..15, high nibbles 16..31
    for (uint32_t type : {GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL}) {
        static const int kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const Half d = type == GGML_TYPE_Q4_0 ? H_MQUARTER : H_HALF;
        std::vector<uint8_t> b(18 * nb, 0);
        std::vector<float> want(N);
        for (int e = 0; e < N; e++) q[e] = pat(e, 0, 16);
        for (int blk = 0; blk < nb; blk++) {
            put16(b, 18 * blk, d.bits);
            for (int j = 0; j < 32; j++) {
                const int v = q[32 * blk + j];
                b[18 * blk + 2 + j % 16] |= (uint8_t)(j < 16 ? v : v << 4);
                want[32 * blk + j] = d.val * (float)(type == GGML_TYPE_Q4_0 ? v - 8 : kv[v]);
            }
        }
        expect_row(type == GGML_TYPE_Q4_0 ? "Q4_0" : "IQ4_NL", type, b, want);
    }
    // Q4_1: d = 0.5, m = -1.5
    {
        std::vector<uint8_t> b(20 * nb, 0);
        std::vector<float> want(N);
        for (int blk = 0; blk < nb; blk++) {
            put16(b, 20 * blk, H_HALF.bits);
            put16(b, 20 * blk + 2, H_M1_5.bits);
            for (int j = 0; j < 32; j++) {
                const int v = pat(j, blk, 16);
                b[20 * blk + 4 + j % 16] |= (uint8_t)(j < 16 ? v : v << 4);
                want[32 * blk + j] = 0.5f * (float)v - 1.5f;
            }
        }
        expect_row("Q4_1", GGML_TYPE_Q4_1, b, want);
    }
    // Q5_0 (d = 0.25) / Q5_1 (d = 1, m = 3): element J's fifth bit is bit J of the LE u32 qh
    for (int one = 0; one < 2; one++) {
        const int bs = one ? 24 : 22, qs_at = one ? 8 : 6, qh_at = one ? 4 : 2;
        std::vector<uint8_t> b(bs * nb, 0);
        std::vector<float> want(N);
        for (int blk = 0; blk < nb; blk++) {
            put16(b, bs * blk, one ? H_ONE.bits : H_QUARTER.bits);
            if (one) put16(b, bs * blk + 2, H_THREE.bits);
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) {
                const int v = pat(j, blk, 32);
                b[bs * blk + qs_at + j % 16] |= (uint8_t)(j < 16 ? (v & 15) : (v & 15) << 4);
                qh |= (uint32_t)(v >> 4) << j;
                want[32 * blk + j] = one ? 1.0f * (float)v + 3.0f : 0.25f * (float)(v - 16);
            }
            for (int k = 0; k < 4; k++) b[bs * blk + qh_at + k] = (uint8_t)(qh >> (8 * k));
        }
        expect_row(one ? "Q5_1" : "Q5_0", one ? GGML_TYPE_Q5_1 : GGML_TYPE_Q5_0, b, want);
    }
}

// Q4_K / Q5_K over nb super-blocks: 8 sub-blocks of 32 with 6-bit scales and mins.
void test_q45_k(int nb, bool five) {
    const int bs = five ? 176 : 144, qs_at = five ? 48 : 16;
    std::vector<uint8_t> b(bs * nb, 0);
    std::vector<float> want(256 * nb);
    for (int blk = 0; blk < nb; blk++) {
        uint8_t *B = &b[bs * blk];
        const Half d = blk ? H_QUARTER : H_HALF, dmin = blk ? H_EIGHTH : H_QUARTER;
        put16(b, bs * blk, d.bits);
        put16(b, bs * blk + 2, dmin.bits);
        int sc[8], mn[8];
        for (int s = 0; s < 8; s++) { // values above 15 exercise the split high bits
            sc[s] = (s * 29 + 1 + blk * 7) % 64;
            mn[s] = (s * 43 + 7 + blk * 3) % 64;
        }
        for (int k = 0; k < 4; k++) { // inverse of get_scale_min_k4
            B[4 + k] = (uint8_t)(sc[k] | (sc[k + 4] >> 4) << 6);
            B[4 + k + 4] = (uint8_t)(mn[k] | (mn[k + 4] >> 4) << 6);
            B[4 + k + 8] = (uint8_t)((sc[k + 4] & 15) | (mn[k + 4] & 15) << 4);
        }
        for (int e = 0; e < 256; e++) { // element-wise form: c = e/64, r = e%64, sub = e/32
            const int v = pat(e, blk, five ? 32 : 16);
            const int c = e / 64, r = e % 64, sub = e / 32;
            B[qs_at + 32 * c + r % 32] |= (uint8_t)(r < 32 ? (v & 15) : (v & 15) << 4);
            if (five) B[16 + r % 32] |= (uint8_t)((v >> 4) << sub);
            want[256 * blk + e] = (float)((double)d.val * sc[sub] * v - (double)dmin.val * mn[sub]);
        }
    }
    expect_row(five ? "Q5_K" : "Q4_K", five ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K, b, want);
}

// Q6_K: 16 sub-blocks of 16 with signed int8 scales; q in 0..63 stored as 4 + 2 bits, minus 32.
void test_q6_k(int nb) {
    std::vector<uint8_t> b(210 * nb, 0);
    std::vector<float> want(256 * nb);
    for (int blk = 0; blk < nb; blk++) {
        uint8_t *B = &b[210 * blk];
        const Half d = blk ? H_EIGHTH : H_QUARTER;
        put16(b, 210 * blk + 208, d.bits);
        int sc[16];
        for (int s = 0; s < 16; s++) {
            sc[s] = (s * 53 + blk * 11) % 256 - 128;
            B[192 + s] = (uint8_t)(int8_t)sc[s];
        }
        for (int e = 0; e < 256; e++) { // h = e/128, g = (e%128)/32, l = e%32; scale = e/16
            const int v = pat(e, blk, 64);
            const int h = e / 128, g = (e % 128) / 32, l = e % 32;
            const int ql = 64 * h + l + (g & 1 ? 32 : 0);
            B[ql] |= (uint8_t)(g < 2 ? (v & 15) : (v & 15) << 4);
            B[128 + 32 * h + l] |= (uint8_t)((v >> 4) << (2 * g));
            want[256 * blk + e] = (float)((double)d.val * sc[e / 16] * (v - 32));
        }
    }
    expect_row("Q6_K", GGML_TYPE_Q6_K, b, want);
}

// Q2_K: 16 sub-blocks of 16, 4-bit scale (low) and min (high) per sub-block, 2-bit quants.
void test_q2_k(int nb) {
    std::vector<uint8_t> b(84 * nb, 0);
    std::vector<float> want(256 * nb);
    for (int blk = 0; blk < nb; blk++) {
        uint8_t *B = &b[84 * blk];
        const Half d = blk ? H_QUARTER : H_HALF, dmin = H_EIGHTH;
        put16(b, 84 * blk + 80, d.bits);
        put16(b, 84 * blk + 82, dmin.bits);
        for (int s = 0; s < 16; s++) B[s] = (uint8_t)(((s * 5 + blk) % 16) | ((s * 3 + 1) % 16) << 4);
        for (int e = 0; e < 256; e++) { // n = e/128, shift j = (e%128)/32, half hh, l: byte 32n + 16hh + l
            const int v = pat(e, blk, 4);
            const int n = e / 128, j = (e % 128) / 32, hh = (e % 32) / 16, l = e % 16;
            B[16 + 32 * n + 16 * hh + l] |= (uint8_t)(v << (2 * j));
            const int s = B[e / 16];
            want[256 * blk + e] = (float)((double)d.val * (s & 15) * v - (double)dmin.val * (s >> 4));
        }
    }
    expect_row("Q2_K", GGML_TYPE_Q2_K, b, want);
}

// Q3_K: 16 sub-blocks of 16 with 6-bit scales stored +32; 3-bit quants = 2 low bits + hmask bit.
void test_q3_k(int nb) {
    std::vector<uint8_t> b(110 * nb, 0);
    std::vector<float> want(256 * nb);
    for (int blk = 0; blk < nb; blk++) {
        uint8_t *B = &b[110 * blk];
        const Half d = blk ? H_EIGHTH : H_HALF;
        put16(b, 110 * blk + 108, d.bits);
        int S[16]; // stored values 0..63; the scale is S - 32
        for (int s = 0; s < 16; s++) S[s] = (s * 37 + 5 + blk * 13) % 64;
        for (int k = 0; k < 4; k++) { // inverse of the aux[] unpack in formats.md 1.6
            B[96 + k] = (uint8_t)((S[k] & 15) | (S[k + 8] & 15) << 4);
            B[96 + k + 4] = (uint8_t)((S[k + 4] & 15) | (S[k + 12] & 15) << 4);
            B[96 + k + 8] = (uint8_t)((S[k] >> 4) | (S[k + 4] >> 4) << 2 | (S[k + 8] >> 4) << 4 | (S[k + 12] >> 4) << 6);
        }
        for (int e = 0; e < 256; e++) {
            const int v = pat(e, blk, 8) - 4; // -4..3 = low2 + 4*hbit - 4
            const int low = (v + 4) & 3, hbit = (v + 4) >> 2;
            const int n = e / 128, j = (e % 128) / 32, hh = (e % 32) / 16, l = e % 16;
            B[32 + 32 * n + 16 * hh + l] |= (uint8_t)(low << (2 * j));
            B[16 * hh + l] |= (uint8_t)(hbit << (4 * n + j));
            want[256 * blk + e] = (float)((double)d.val * (S[e / 16] - 32) * v);
        }
    }
    expect_row("Q3_K", GGML_TYPE_Q3_K, b, want);
}

void test_float_types() {
    const std::vector<float> fv = {1.0f, -2.5f, 3.0e-30f, -0.0f, 65504.0f, u2f(0x7f800000u), 1.00390625f, u2f(0x3f818000u)};
    std::vector<uint8_t> b(fv.size() * 4);
    std::memcpy(b.data(), fv.data(), b.size());
    expect_row("F32", GGML_TYPE_F32, b, fv); // includes bf16 ties: 1 + 2^-8 -> 1, 0x3f818000 -> 0x3f82
    CHECK(ref_bf16(1.00390625f) == 0x3f80 && ref_bf16(u2f(0x3f818000u)) == 0x3f82, "reference RNE");

    // F16: normal, negative, the smallest subnormal, the largest finite, infinity
    const uint16_t hb[] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0xFC00, 0x3555};
    const float hv[] = {1.0f, -2.0f, 5.9604644775390625e-8f, 65504.0f, -u2f(0x7f800000u), 0.333251953125f};
    b.assign(sizeof hb, 0);
    std::memcpy(b.data(), hb, sizeof hb);
    expect_row("F16", GGML_TYPE_F16, b, std::vector<float>(hv, hv + 6));

    const uint16_t bb[] = {0x3F80, 0xC040, 0x0001, 0x7F7F};
    const float bv[] = {1.0f, -3.0f, u2f(0x00010000u), u2f(0x7f7f0000u)};
    b.assign(sizeof bb, 0);
    std::memcpy(b.data(), bb, sizeof bb);
    expect_row("BF16", GGML_TYPE_BF16, b, std::vector<float>(bv, bv + 4));

    // bf16 -> bf16 is a bit copy (a signalling NaN keeps its payload); f32 NaN -> quiet NaN
    const uint16_t nan16 = 0x7F81;
    uint16_t out = 0;
    dequantize_row_bf16(GGML_TYPE_BF16, &nan16, &out, 1);
    CHECK(out == 0x7F81, "bf16 NaN copy 0x%04x", out);
    const float nan32 = u2f(0x7f800001u), big = u2f(0x7f7fffffu);
    dequantize_row_bf16(GGML_TYPE_F32, &nan32, &out, 1);
    CHECK((out & 0x7f80) == 0x7f80 && (out & 0x7f) != 0, "f32 NaN -> bf16 0x%04x", out);
    dequantize_row_bf16(GGML_TYPE_F32, &big, &out, 1);
    CHECK(out == 0x7f80, "FLT_MAX rounds to bf16 inf: 0x%04x", out);
}

void test_geometry() {
    struct G { uint32_t t; uint32_t blck, size; const char *name; };
    const G gs[] = {{0, 1, 4, "F32"},        {1, 1, 2, "F16"},        {2, 32, 18, "Q4_0"},     {3, 32, 20, "Q4_1"},
                    {6, 32, 22, "Q5_0"},     {7, 32, 24, "Q5_1"},     {8, 32, 34, "Q8_0"},     {10, 256, 84, "Q2_K"},
                    {11, 256, 110, "Q3_K"},  {12, 256, 144, "Q4_K"},  {13, 256, 176, "Q5_K"},  {14, 256, 210, "Q6_K"},
                    {15, 256, 292, "Q8_K"},  {20, 32, 18, "IQ4_NL"},  {26, 1, 4, "I32"},       {30, 1, 2, "BF16"},
                    {16, 256, 66, "IQ2_XXS"}, {39, 32, 17, "MXFP4"}};
    for (const G &g : gs) {
        const ggml_type_traits *t = ggml_traits(g.t);
        CHECK(t && t->blck_size == g.blck && t->type_size == g.size && !std::strcmp(t->name, g.name), "traits of %u", g.t);
    }
    for (uint32_t t : {4u, 5u, 31u, 33u, 36u, 38u, 43u, 1000u}) CHECK(!ggml_traits(t), "id %u should be unknown", t);
    for (uint32_t t : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 20u, 30u})
        CHECK(ggml_can_dequantize(t), "can dequantize %u", t);
    for (uint32_t t : {9u, 15u, 16u, 24u, 26u, 39u}) CHECK(!ggml_can_dequantize(t), "cannot dequantize %u", t);
    for (uint32_t t : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 30u}) CHECK(ggml_can_quantize(t), "can quantize %u", t);
    for (uint32_t t : {9u, 15u, 16u, 24u, 26u, 39u}) CHECK(!ggml_can_quantize(t), "cannot quantize %u", t);
    uint64_t rb = 0;
    std::string err;
    CHECK(ggml_row_size(GGML_TYPE_Q4_K, 896, &rb, &err) == false && err.find("block size 256") != std::string::npos,
          "896 is not a Q4_K row: %s", err.c_str());
    CHECK(ggml_row_size(GGML_TYPE_Q5_0, 896, &rb, &err) && rb == 28 * 22, "Q5_0 row bytes %llu", (unsigned long long)rb);
    CHECK(!ggml_row_size(4, 32, &rb, &err) && err.find("ggml type 4") != std::string::npos, "removed id: %s", err.c_str());
    CHECK(!ggml_row_size(GGML_TYPE_F64, INT64_MAX, &rb, &err) && err.find("overflow") != std::string::npos, "%s", err.c_str());
}

// ---- quantizers ------------------------------------------------------------------------------

// quantize -> dequantize on random rows; each element within the type's bound (fp16 scales add
// a relative 2^-11 to the scale and to Q4_1/Q5_1's minimum).
void test_roundtrip() {
    Rng rng(7);
    const double h = 1.0 / 2048;
    for (uint32_t type : {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1}) {
        const int64_t n = 32 * 40, rows = 8;
        std::vector<float> x(n * rows);
        for (int64_t i = 0; i < n * rows; i++) x[i] = rng.uniform(-1, 1) * (1 + (float)((i / 32) % 5)) + (i % 97 == 0 ? 0.7f : 0.0f);
        for (int j = 0; j < 32; j++) x[32 + j] = 0.0f; // an all-zero block: d = 0, no NaN
        uint64_t rb = 0;
        std::string err;
        ggml_row_size(type, n, &rb, &err);
        std::vector<uint8_t> q(rb * rows);
        CHECK(quantize(type, x.data(), n, rows, q.data(), &err), "quantize %s: %s", ggml_type_name(type), err.c_str());
        std::vector<float> y(n * rows);
        CHECK(dequantize_f32(type, q.data(), n, rows, y.data(), &err), "%s", err.c_str());
        double worst = 0, sq = 0;
        for (int64_t b0 = 0; b0 < n * rows; b0 += 32) {
            float mn = x[b0], mx = x[b0], amax = 0, smax = 0;
            for (int j = 0; j < 32; j++) {
                const float v = x[b0 + j];
                mn = std::min(mn, v), mx = std::max(mx, v);
                if (std::fabs(v) > amax) amax = std::fabs(v), smax = v;
            }
            for (int j = 0; j < 32; j++) {
                const double v = x[b0 + j], e = std::fabs(v - y[b0 + j]);
                double bound;
                switch (type) {
                case GGML_TYPE_Q8_0: bound = amax / 127.0 * (0.5 + 127 * h); break;
                case GGML_TYPE_Q4_0:
                case GGML_TYPE_Q5_0: { // d = smax / -half; the element at -smax clamps: one step
                    const double half = type == GGML_TYPE_Q4_0 ? 8 : 16, d = std::fabs(smax) / half;
                    const bool clamped = smax != 0 && v / (smax / -half) + half > 2 * half - 0.5;
                    bound = d * ((clamped ? 1.0 : 0.5) + half * h);
                    break;
                }
                default: { // Q4_1, Q5_1
                    const double steps = type == GGML_TYPE_Q4_1 ? 15 : 31, d = (mx - mn) / steps;
                    bound = d * (0.5 + steps * h) + std::fabs(mn) * h;
                }
                }
                bound += 1e-6;
                if (!(e <= bound)) {
                    CHECK(false, "%s: element %lld: x %.7g y %.7g error %.3g > bound %.3g", ggml_type_name(type),
                          (long long)(b0 + j), v, (double)y[b0 + j], e, bound);
                    return;
                }
                worst = std::max(worst, e / (bound + 1e-12));
                sq += e * e;
            }
        }
        // the all-zero block reads back as zeros
        for (int j = 0; j < 32; j++) CHECK(y[32 + j] == 0.0f, "%s: zero block element %d = %g", ggml_type_name(type), j, y[32 + j]);
        std::printf("  %s round trip: rms error %.3g, worst error / bound %.3f\n", ggml_type_name(type),
                    std::sqrt(sq / (double)(n * rows)), worst);
        // the threaded tensor path equals row-by-row quantization
        std::vector<uint8_t> q1(rb);
        quantize_row(type, x.data() + 3 * n, q1.data(), n);
        CHECK(!std::memcmp(q1.data(), q.data() + 3 * rb, rb), "%s: quantize row 3 differs", ggml_type_name(type));
    }

    // Q8_0 bytes: x = j/31 -> amax 1, d = 1/127 (fp16 0x2008), q = round(j*127/31)
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)j / 31.0f;
    uint8_t blk[34];
    quantize_row(GGML_TYPE_Q8_0, x, blk, 32);
    uint16_t d;
    std::memcpy(&d, blk, 2);
    CHECK(d == 0x2008, "Q8_0 d bits 0x%04x", d);
    for (int j = 0; j < 32; j++)
        CHECK((int8_t)blk[2 + j] == (int)std::lround(j * 127.0 / 31.0), "Q8_0 q[%d] = %d", j, (int8_t)blk[2 + j]);

    // F16 / BF16 conversion through quantize
    const float fx[2] = {1.0f / 3.0f, -1.00390625f};
    uint16_t hb[2];
    CHECK(quantize(GGML_TYPE_BF16, fx, 2, 1, hb, nullptr) && hb[0] == 0x3eab && hb[1] == 0xbf80, "bf16 %04x %04x", hb[0], hb[1]);
    CHECK(quantize(GGML_TYPE_F16, fx, 2, 1, hb, nullptr) && hb[0] == 0x3555 && hb[1] == 0xbc04, "f16 %04x %04x", hb[0], hb[1]);
}

// Standard normal values (Box-Muller).
float gaussian(Rng &rng) {
    const double u1 = ((double)(rng.next() >> 40) + 0.5) / 16777216.0, u2 = (double)(rng.next() >> 40) / 16777216.0;
    return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// quantize -> dequantize of rows of n elements; returns the relative RMS error |y - x| / |x|.
double rel_rms(uint32_t type, const std::vector<float> &x, int64_t n, std::vector<float> *y, std::vector<uint8_t> *q = nullptr) {
    uint64_t rb = 0;
    std::string err;
    ggml_row_size(type, n, &rb, &err);
    const int64_t rows = (int64_t)x.size() / n;
    std::vector<uint8_t> qq(rb * rows);
    y->assign(x.size(), 0.0f);
    CHECK(quantize(type, x.data(), n, rows, qq.data(), &err) && dequantize_f32(type, qq.data(), n, rows, y->data(), &err),
          "%s: %s", ggml_type_name(type), err.c_str());
    if (q) *q = qq;
    double se = 0, sx = 0;
    for (size_t i = 0; i < x.size(); i++) se += ((double)(*y)[i] - x[i]) * ((double)(*y)[i] - x[i]), sx += (double)x[i] * x[i];
    return sx > 0 ? std::sqrt(se / sx) : std::sqrt(se);
}

// The K-quants against the 32-element types of about as many bits, on the same rows: gaussian,
// uniform with an offset (all positive), gaussian with one outlier of 30 sigma, and a row of
// special blocks (zeros, constants of either sign, values of 0.01 whose scales are fp16
// subnormals). Bits per weight: Q2_K 2.625, Q3_K 3.4375, Q4_K 4.5, Q5_K 5.5, Q6_K 6.5625; Q4_0
// 4.5, Q4_1 5, Q5_1 6, Q8_0 8.5. Bounds on the ratio of relative RMS errors, 5-15% above the
// measured ones (printed):
//  * Q4_K <= 1.0 x Q4_1 and Q5_K <= 1.0 x Q5_1 (measured 0.90-0.95): half a bit less, but a
//    scale fitted per 32 elements by least squares rather than min/max. On the offset row 1.9
//    (measured 1.7): the format's min is never above 0, so q = 0 stands for at most 0 and the
//    range spans 0..3.5 instead of Q4_1's 1.5..3.5, 1.75 times the step;
//  * Q6_K <= 3.6 x Q8_0 (measured 2.9-3.3): two bits fewer, 4x the step, fitted scales per 16;
//  * Q3_K <= 1.9 x Q4_0 (1.2-1.7) and Q2_K <= 3.5 x Q4_0 (2.1-3.2): one and two bits fewer,
//    fitted scales per 16.
//  * IQ4_NL <= 1.0 x Q4_0 (measured 0.88-0.90), 1.35 on the offset row (1.20): the same bits, a
//    least-squares scale, and a grid denser near 0, which fits bell-shaped blocks better and
//    blocks far from 0 worse. (IQ4_NL's blocks are 32 elements, like Q4_0's.)
// Then per type: quantize is deterministic and equals quantize_row, zeros stay zeros, constants
// come back within their fp16 scale's rounding, and quantizing the dequantized row again moves
// it by at most 2% of the first error on the gaussian and offset rows (measured 0-1%: the stored
// q's are those of the rounded scales). Where a sub-block's dequantized values take only a few
// levels (the outlier's, the tiny ones) several scales reproduce them exactly and the search may
// pick another, which moves the super-block scale and so every sub-block's rounding: there the
// bound is 60% of the first error (measured up to 52%, Q2_K's 4-bit scales; 14% for Q5_K).
void test_kquant_roundtrip() {
    const int64_t n = 256 * 8;
    std::vector<std::vector<float>> rows(4, std::vector<float>(n));
    Rng rng(21);
    for (int64_t i = 0; i < n; i++) {
        rows[0][i] = gaussian(rng);
        rows[1][i] = rng.uniform(-1, 1) + 2.5f;
        rows[2][i] = gaussian(rng);
        rows[3][i] = 0.01f * gaussian(rng);
    }
    rows[2][777] = 30.0f;
    for (int64_t i = 0; i < 256; i++) rows[3][i] = 0.0f, rows[3][256 + i] = 0.75f, rows[3][512 + i] = -1.3f;
    const char *names[4] = {"gaussian", "uniform+2.5", "outlier", "special"};
    struct K { uint32_t type, ref; double bound[3]; }; // bound on the ratio for rows 0-2
    const K ks[] = {{GGML_TYPE_Q4_K, GGML_TYPE_Q4_1, {1.0, 1.9, 1.0}}, {GGML_TYPE_Q5_K, GGML_TYPE_Q5_1, {1.0, 1.9, 1.0}},
                    {GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, {3.6, 3.6, 3.6}}, {GGML_TYPE_Q3_K, GGML_TYPE_Q4_0, {1.9, 1.9, 1.9}},
                    {GGML_TYPE_Q2_K, GGML_TYPE_Q4_0, {3.5, 3.5, 3.5}}, {GGML_TYPE_IQ4_NL, GGML_TYPE_Q4_0, {1.0, 1.35, 1.0}}};
    for (const K &k : ks) {
        const char *tn = ggml_type_name(k.type);
        CHECK(ggml_can_quantize(k.type), "%s can be quantized", tn);
        for (int r = 0; r < 4; r++) {
            std::vector<float> y, yr, y2;
            std::vector<uint8_t> q, q2;
            const double e = rel_rms(k.type, rows[r], n, &y, &q), er = rel_rms(k.ref, rows[r], n, &yr);
            rel_rms(k.type, rows[r], n, &y2, &q2);
            CHECK(q == q2, "%s %s: quantize is not deterministic", tn, names[r]);
            const double fix = rel_rms(k.type, y, n, &y2); // requantization of the dequantized row
            std::printf("  %-4s %-11s: relative rms error %.4f, %s %.4f (ratio %.2f); requantized %.2g\n", tn, names[r], e,
                        ggml_type_name(k.ref), er, e / er, fix);
            if (r < 3) CHECK(e <= k.bound[r] * er, "%s %s: relative rms error %.4f > %.2f x %s's %.4f", tn, names[r], e, k.bound[r],
                             ggml_type_name(k.ref), er);
            CHECK(fix <= (r < 2 ? 0.02 : 0.6) * e, "%s %s: requantizing the dequantized row moves it by %.3g (first error %.3g)", tn, names[r], fix, e);
            if (r != 3) continue;
            for (int64_t i = 0; i < 256; i++) CHECK(y[i] == 0.0f, "%s: zero block element %lld = %g", tn, (long long)i, y[i]);
            for (int64_t i = 256; i < 768; i++)
                CHECK(std::fabs(y[i] - rows[3][i]) <= 2e-3 * std::fabs(rows[3][i]), "%s: constant block element %lld = %.7g, not %.7g", tn,
                      (long long)i, y[i], rows[3][i]);
            // the row path equals the tensor path
            std::vector<uint8_t> q1(q.size());
            quantize_row(k.type, rows[3].data(), q1.data(), n);
            CHECK(q1 == q, "%s: quantize_row differs from quantize", tn);
        }
        if (ggml_traits(k.type)->blck_size != 256) continue;
        std::string err;
        uint8_t blk[256];
        CHECK(!quantize(k.type, rows[0].data(), 128, 1, blk, &err) && err.find("block size 256") != std::string::npos &&
                  err.find(tn) != std::string::npos,
              "%s: a row of 128 must be refused: %s", tn, err.c_str());
    }
}

// The threaded tensor paths equal the row functions on a big tensor of random bytes (any bits:
// NaN and inf scales included, compared bit for bit).
void test_tensor_paths() {
    Rng rng(11);
    for (uint32_t type : {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_0, GGML_TYPE_F16}) {
        const int64_t ne0 = 512, rows = 300;
        uint64_t rb = 0;
        ggml_row_size(type, ne0, &rb, nullptr);
        std::vector<uint8_t> src(rb * rows);
        for (auto &c : src) c = (uint8_t)rng.next();
        std::vector<float> all(ne0 * rows), row(ne0);
        std::vector<uint16_t> allb(ne0 * rows), rowb(ne0);
        std::string err;
        CHECK(dequantize_f32(type, src.data(), ne0, rows, all.data(), &err), "%s", err.c_str());
        CHECK(dequantize_bf16(type, src.data(), ne0, rows, allb.data(), &err), "%s", err.c_str());
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            dequantize_row_f32(type, src.data() + r * rb, row.data(), ne0);
            dequantize_row_bf16(type, src.data() + r * rb, rowb.data(), ne0);
            bad += std::memcmp(row.data(), all.data() + r * ne0, ne0 * 4) != 0;
            bad += std::memcmp(rowb.data(), allb.data() + r * ne0, ne0 * 2) != 0;
            for (int64_t i = 0; i < ne0; i++) bad += rowb[i] != ref_bf16(row[i]);
        }
        CHECK(bad == 0, "%s: %d tensor/row mismatches", ggml_type_name(type), bad);
    }
}

void test_errors() {
    std::string err;
    float y[256];
    uint8_t src[256] = {};
    CHECK(!dequantize_f32(16, src, 256, 1, y, &err) && err.find("IQ2_XXS") != std::string::npos &&
              err.find("unsupported") != std::string::npos, "IQ2_XXS: %s", err.c_str());
    CHECK(!dequantize_bf16(GGML_TYPE_Q8_0, src, 100, 1, (uint16_t *)y, &err) && err.find("100") != std::string::npos &&
              err.find("block size 32") != std::string::npos, "Q8_0 row 100: %s", err.c_str());
    for (float &v : y) v = 1.0f;
    CHECK(!quantize(GGML_TYPE_Q8_K, y, 256, 1, src, &err) && err.find("Q8_K") != std::string::npos &&
              err.find("unsupported") != std::string::npos, "quantize Q8_K: %s", err.c_str());
    float x[64] = {};
    x[40] = std::nanf("");
    CHECK(!quantize(GGML_TYPE_Q8_0, x, 32, 2, src, &err) && err.find("row 1, column 8") != std::string::npos,
          "NaN: %s", err.c_str());
}

} // namespace

int main() {
    test_geometry();
    test_float_types();
    for (int nb : {1, 3}) {
        test_legacy(nb);
        test_q45_k(nb, false);
        test_q45_k(nb, true);
        test_q6_k(nb);
        test_q2_k(nb);
        test_q3_k(nb);
    }
    test_roundtrip();
    test_kquant_roundtrip();
    test_tensor_paths();
    test_errors();
    return test_finish("test-quants");
}
