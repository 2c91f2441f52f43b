// models/unicode.cpp - UTF-8 decoding, the \p{L} / \p{N} / \s classes and NFC normalization
// (UAX #15: full canonical decomposition, canonical ordering, canonical composition, with Hangul
// syllables done algorithmically). Data tables: models/unicode-tables.inc.
#include "unicode.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace forge {
namespace unicode {

namespace {

struct CpRange { uint32_t first, last; };
struct CccRange { uint32_t first, last, ccc; };
struct Decomp { uint32_t cp, a, b; };

#include "unicode-tables.inc"

constexpr uint32_t kComposes = 0x80000000u;
constexpr int32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <size_t N> bool in_ranges(const CpRange (&r)[N], int32_t cp) {
    if (cp < 0) return false;
    const CpRange *it = std::upper_bound(r, r + N, (uint32_t)cp, [](uint32_t v, const CpRange &x) { return v < x.first; });
    return it != r && (uint32_t)cp <= (it - 1)->last;
}

const Decomp *find_decomp(int32_t cp) {
    if (cp < 0xC0) return nullptr;
    const size_t n = sizeof(k_decomp) / sizeof(k_decomp[0]);
    const Decomp *it = std::lower_bound(k_decomp, k_decomp + n, (uint32_t)cp, [](const Decomp &d, uint32_t v) { return d.cp < v; });
    return it != k_decomp + n && it->cp == (uint32_t)cp ? it : nullptr;
}

// (first << 21 | second) -> primary composite, built once from k_decomp.
const std::unordered_map<uint64_t, int32_t> &composition_map() {
    static const std::unordered_map<uint64_t, int32_t> map = [] {
        std::unordered_map<uint64_t, int32_t> m;
        for (const Decomp &d : k_decomp)
            if (d.b & kComposes) m[(uint64_t)d.a << 21 | (d.b & ~kComposes)] = (int32_t)d.cp;
        return m;
    }();
    return map;
}

int32_t compose(int32_t a, int32_t b) {
    if (a < 0 || b < 0) return -1;
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
        return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
        return a + (b - kTBase);
    const auto &m = composition_map();
    auto it = m.find((uint64_t)a << 21 | (uint64_t)b);
    return it == m.end() ? -1 : it->second;
}

void decompose(int32_t cp, std::vector<int32_t> *out) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
        int32_t s = cp - kSBase;
        out->push_back(kLBase + s / kNCount);
        out->push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out->push_back(kTBase + s % kTCount);
        return;
    }
    const Decomp *d = find_decomp(cp);
    if (!d) { out->push_back(cp); return; }
    decompose((int32_t)d->a, out);
    if (d->b & ~kComposes) decompose((int32_t)(d->b & ~kComposes), out);
}

// Invalid bytes are carried through the code point buffers as -1 - byte.
int ccc_of(int32_t cp) { return cp < 0 ? 0 : combining_class(cp); }

} // namespace

const char *version() { return FORGE_UNICODE_VERSION; }

int utf8_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 1;
}

int32_t decode_utf8(std::string_view s, size_t i, int *len) {
    const unsigned char *p = (const unsigned char *)s.data() + i;
    size_t avail = s.size() - i;
    *len = 1;
    if (p[0] < 0x80) return p[0];
    int n = utf8_len(p[0]);
    if (n == 1 || (size_t)n > avail) return -1;
    int32_t cp = p[0] & (0x7F >> n);
    for (int k = 1; k < n; k++) {
        if ((p[k] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (p[k] & 0x3F);
    }
    static const int32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *len = n;
    return cp;
}

void append_utf8(std::string *out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back((char)cp);
    } else if (cp < 0x800) {
        out->push_back((char)(0xC0 | cp >> 6));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | cp >> 12));
        out->push_back((char)(0x80 | (cp >> 6 & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | cp >> 18));
        out->push_back((char)(0x80 | (cp >> 12 & 0x3F)));
        out->push_back((char)(0x80 | (cp >> 6 & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

bool is_letter(int32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(k_letters, cp);
}

bool is_number(int32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(k_numbers, cp);
}

bool is_whitespace(int32_t cp) {
    if (cp < 0) return false;
    if (cp < 0x100) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

bool is_python_space(int32_t cp) { return is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

int combining_class(int32_t cp) {
    if (cp < 0x300) return 0;
    const size_t n = sizeof(k_ccc) / sizeof(k_ccc[0]);
    const CccRange *it = std::upper_bound(k_ccc, k_ccc + n, (uint32_t)cp, [](uint32_t v, const CccRange &x) { return v < x.first; });
    return it != k_ccc && (uint32_t)cp <= (it - 1)->last ? (int)(it - 1)->ccc : 0;
}

namespace {

// Full NFC of one segment (code points, invalid bytes as -1 - byte), in place.
void nfc_segment(std::vector<int32_t> &buf) {
    // canonical ordering: stable sort of each run of non-starters by combining class
    for (size_t i = 0; i < buf.size();) {
        if (ccc_of(buf[i]) == 0) { i++; continue; }
        size_t j = i;
        while (j < buf.size() && ccc_of(buf[j]) != 0) j++;
        std::stable_sort(buf.begin() + (long)i, buf.begin() + (long)j,
                         [](int32_t a, int32_t b) { return ccc_of(a) < ccc_of(b); });
        i = j;
    }
    // canonical composition
    if (buf.empty()) return;
    size_t starter = 0, out = 1;
    int last_class = ccc_of(buf[0]) ? 256 : 0;
    for (size_t i = 1; i < buf.size(); i++) {
        int32_t ch = buf[i];
        int cls = ccc_of(ch);
        int32_t comp = compose(buf[starter], ch);
        if (comp >= 0 && (last_class < cls || last_class == 0) && ccc_of(buf[starter]) == 0) {
            buf[starter] = comp;
            continue;
        }
        if (cls == 0) starter = out;
        last_class = cls;
        buf[out++] = ch;
    }
    buf.resize(out);
}

// Per code point below kQuickLimit: bit 0 = NFC_Quick_Check is No or Maybe (the code point
// changes under NFC, or may compose with what precedes it), bit 1 = combining class != 0.
// Nothing at or above kQuickLimit decomposes, composes or combines.
constexpr int32_t kQuickLimit = 0x30000;
const std::vector<uint8_t> &quick_flags() {
    static const std::vector<uint8_t> flags = [] {
        std::vector<uint8_t> f((size_t)kQuickLimit, 0);
        for (const CccRange &r : k_ccc)
            for (uint32_t c = r.first; c <= r.last; c++) f[c] |= 2;
        for (const Decomp &d : k_decomp) {
            if (d.b & kComposes) f[d.b & ~kComposes] |= 1; // a second character of a composition
            else f[d.cp] |= 1;                             // singleton, excluded or non-starter decomposition
        }
        for (int32_t c = kVBase; c < kVBase + kVCount; c++) f[(size_t)c] |= 1;
        for (int32_t c = kTBase + 1; c < kTBase + kTCount; c++) f[(size_t)c] |= 1;
        return f;
    }();
    return flags;
}

} // namespace

// The text is cut before every starter whose NFC_Quick_Check is Yes (and before invalid bytes):
// NFC never acts across such a boundary. Segments whose characters are all Yes and in canonical
// order are already NFC and copied; the others are decomposed, reordered and recomposed.
std::string nfc(std::string_view s) {
    bool simple = true; // code points below U+0300 are never changed or composed with
    for (unsigned char c : s)
        if (c >= 0xCC) { simple = false; break; }
    if (simple) return std::string(s);

    const std::vector<uint8_t> &flags = quick_flags();
    std::string out;
    out.reserve(s.size());
    std::vector<int32_t> buf;
    size_t seg = 0;
    bool dirty = false;
    int last_ccc = 0;
    auto flush = [&](size_t end) {
        if (!dirty) {
            out.append(s.substr(seg, end - seg));
            return;
        }
        buf.clear();
        for (size_t i = seg; i < end;) {
            int len;
            int32_t cp = decode_utf8(s, i, &len);
            if (cp < 0) buf.push_back(-1 - (unsigned char)s[i]);
            else decompose(cp, &buf);
            i += (size_t)len;
        }
        nfc_segment(buf);
        for (int32_t cp : buf) {
            if (cp < 0) out.push_back((char)(unsigned char)(-1 - cp));
            else append_utf8(&out, (uint32_t)cp);
        }
    };
    for (size_t i = 0; i < s.size();) {
        int len;
        int32_t cp = decode_utf8(s, i, &len);
        uint8_t f = cp >= 0x300 && cp < kQuickLimit ? flags[(size_t)cp] : 0;
        if (f == 0) { // a boundary
            flush(i);
            seg = i;
            dirty = false;
            last_ccc = 0;
        } else {
            int c = f & 2 ? combining_class(cp) : 0;
            if ((f & 1) || (c != 0 && c < last_ccc)) dirty = true;
            last_ccc = c;
        }
        i += (size_t)len;
    }
    flush(s.size());
    return out;
}

} // namespace unicode
} // namespace forge
