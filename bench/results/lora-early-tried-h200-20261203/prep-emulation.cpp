// Host emulation of lora.cu's prep_run: the 64-bit original against the 32-bit patch, on the
// shapes of the models (the job's element-to-output map, every element written once and equal).
#include <cstdint>
#include <cstdio>
#include <vector>
struct Job { int64_t K, R, M, r, ldbd; int64_t end[3]; bool bdt; };
static float Bv(int64_t c, int64_t m) { return (float)(c * 1000003 + m * 7 + 1); } // B[c][m]
static float Av(int64_t k, int64_t row) { return (float)(row * 100019 + k); }
// out: ac (R*K), bd (M*ldbd), bdt (R*M)
static void old_run(const Job &j, std::vector<float> &ac, std::vector<float> &bd, std::vector<float> &bdt, int grid, int block) {
    const int64_t na = j.R * j.K, nb = na + j.M * j.R, n = nb + (j.bdt ? j.M * j.R : 0);
    auto bdf = [&](int64_t m, int64_t c) { const int blk = m < j.end[0] ? 0 : m < j.end[1] ? 1 : 2; return c / j.r == blk ? 2.0f * Bv(c % j.r, m) : 0.0f; };
    for (int bx = 0; bx < grid; bx++) for (int tx = 0; tx < block; tx++)
        for (int64_t i = bx * (int64_t)block + tx; i < n; i += (int64_t)grid * block) {
            if (i < na) ac[i] = Av(i % j.K, i / j.K);
            else if (i < nb) { const int64_t e = i - na, m = e / j.R, c = e % j.R; bd[m * j.ldbd + c] = bdf(m, c); }
            else { const int64_t e = i - nb, c = e / j.M, m = e % j.M; bdt[e] = bdf(m, c); }
        }
}
static void new_run(const Job &j, std::vector<float> &ac, std::vector<float> &bd, std::vector<float> &bdt, int grid, int block) {
    const uint32_t K = (uint32_t)j.K, R = (uint32_t)j.R, M = (uint32_t)j.M, r = (uint32_t)j.r;
    const uint32_t na = R * K, nb = na + M * R, n = nb + (j.bdt ? M * R : 0);
    const uint32_t end0 = (uint32_t)j.end[0], end1 = (uint32_t)j.end[1];
    auto bdf = [&](uint32_t m, uint32_t c) { const uint32_t blk = m < end0 ? 0 : m < end1 ? 1 : 2, q = c / r; return q == blk ? 2.0f * Bv(c - q * r, m) : 0.0f; };
    for (uint32_t bx = 0; bx < (uint32_t)grid; bx++) for (uint32_t tx = 0; tx < (uint32_t)block; tx++)
        for (uint32_t i = bx * block + tx; i < n; i += grid * block) {
            if (i < na) { const uint32_t row = i / K; ac[i] = Av(i - row * K, row); }
            else if (i < nb) { const uint32_t e = i - na, m = e / R, c = e - m * R; bd[(size_t)m * j.ldbd + c] = bdf(m, c); }
            else { const uint32_t e = i - nb, c = e / M, m = e - c * M; bdt[e] = bdf(m, c); }
        }
}
int main() {
    // (K, r, block row ends) per projection: Qwen2.5-0.5B, Qwen3-0.6B, Gemma2-2B, Gemma3-27B-ish
    struct S { int64_t K, r; std::vector<int64_t> rows; bool fold; } shapes[] = {
        {896, 16, {896, 128, 128}, true}, {896, 16, {896}, false}, {896, 16, {4864, 4864}, true}, {4864, 16, {896}, false},
        {1024, 16, {2048, 1024, 1024}, true}, {2304, 16, {9216, 9216}, true}, {9216, 16, {2304}, false}, {5376, 64, {21504, 21504}, true},
        {100, 8, {24, 40, 8}, true}};
    int bad = 0;
    for (const S &s : shapes) {
        Job j{};
        j.K = s.K; j.r = s.r; j.R = s.r * (int64_t)s.rows.size(); j.M = 0;
        for (size_t b = 0; b < 3; b++) { if (b < s.rows.size()) j.M += s.rows[b]; j.end[b] = j.M; }
        j.ldbd = s.fold ? j.K + j.R : j.R; j.bdt = !s.fold;
        std::vector<float> a0(j.R * j.K, -1), b0(j.M * j.ldbd, -1), t0(j.R * j.M, -1), a1 = a0, b1 = b0, t1 = t0;
        old_run(j, a0, b0, t0, 64, 256);
        new_run(j, a1, b1, t1, 64, 256);
        const bool same = a0 == a1 && b0 == b1 && t0 == t1;
        bad += !same;
        std::printf("K %lld R %lld M %lld: %s\n", (long long)j.K, (long long)j.R, (long long)j.M, same ? "equal" : "DIFFERENT");
    }
    return bad;
}
