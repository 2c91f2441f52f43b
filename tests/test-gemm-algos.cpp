// The file that keeps a run's GEMM algorithms (forge_cuda_gemm_algos_save / _load, forge.h): a
// missing or malformed file is -1, a file of another GPU or cuBLASLt version -2, and a file of this
// one loads and saves back byte for byte. No GPU is needed: the choices are host data. A build
// without CUDA has the no-op forms (save writes nothing, load returns 0).
#include "test-util.h"

#include <fstream>
#include <sstream>
#include <unistd.h>

static std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return f ? s.str() : std::string();
}
static void write(const std::string &path, const std::string &text) { std::ofstream(path, std::ios::binary) << text; }

int main() {
    char dir[] = "/tmp/forge-gemm-algos-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr, "mkdtemp");
    const std::string d = dir, empty = d + "/empty.txt";
    CHECK(forge_cuda_gemm_algos_save(empty.c_str()) == FORGE_OK, "save");
    const std::string text = slurp(empty);
    if (text.empty()) { // built without CUDA
        CHECK(forge_cuda_gemm_algos_load(empty.c_str()) == 0, "load without CUDA");
        return test_finish("test-gemm-algos");
    }
    // the header names the format, cuBLASLt's version and the GPU; nothing has been chosen yet
    const std::string header = text.substr(0, text.find('\n') + 1);
    CHECK(header.compare(0, 19, "forge-gemm-algos 1 ") == 0 && text == header, "a fresh process saves only the header: '%s'", text.c_str());
    CHECK(forge_cuda_gemm_algos_load((d + "/missing.txt").c_str()) == -1, "a missing file is -1");
    write(d + "/bad.txt", "not a forge file\n");
    CHECK(forge_cuda_gemm_algos_load((d + "/bad.txt").c_str()) == -1, "a foreign file is -1");
    write(d + "/other.txt", "forge-gemm-algos 1 1 Some_Other_GPU\n0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 a b c d e f 10 11\n");
    CHECK(forge_cuda_gemm_algos_load((d + "/other.txt").c_str()) == -2, "another GPU's file is -2");
    write(d + "/cut.txt", header + "0 4096 896 896 896 896 896 0 10 10 -1 256 256 256 0 33554432 1 2 3\n");
    CHECK(forge_cuda_gemm_algos_load((d + "/cut.txt").c_str()) == -1, "a cut line is -1");
    // two choices (key: handle 0, M, N, K, ...; the algorithm's 8 words in hex), in key order
    const std::string entries = "0 512 896 4864 4864 896 896 0 10 10 -1 256 256 256 0 33554432 42 ff00 0 0 0 0 0 7\n"
                                "0 4096 1152 896 896 896 1152 0 10 10 10 256 256 256 256 33554432 1 2 3 4 5 6 7 ffffffffffffffff\n";
    write(d + "/two.txt", header + entries);
    CHECK(forge_cuda_gemm_algos_load((d + "/two.txt").c_str()) == 2, "two choices loaded");
    CHECK(forge_cuda_gemm_algos_save((d + "/again.txt").c_str()) == FORGE_OK, "save again");
    CHECK(slurp(d + "/again.txt") == header + entries, "saved back byte for byte:\n%s", slurp(d + "/again.txt").c_str());
    CHECK(access((d + "/again.txt.tmp").c_str(), F_OK) != 0, "no temporary file left");
    for (const char *f : {"empty.txt", "bad.txt", "other.txt", "cut.txt", "two.txt", "again.txt"}) unlink((d + "/" + f).c_str());
    rmdir(dir);
    return test_finish("test-gemm-algos");
}
