// gguf-tools/gguf-lora.cpp - LoRA adapters between ecosystems, file to file (formats.md 5.1, 5.2):
//
//   gguf-lora to-gguf PEFT_DIR -o OUT.gguf [--arch A | --base MODEL] [--type keep|f32|f16|bf16]
//   gguf-lora to-peft LORA.gguf -o PEFT_DIR [--base-model NAME]
//   gguf-lora merge --base HF_DIR|MODEL.gguf --adapter PEFT_DIR|LORA.gguf -o OUT.gguf|OUT_DIR [--type auto|TYPE]
//
// The work is models/lora-convert.h's, which says how names, ranks and scales map and how a merge
// rounds. Exit status: 0 ok, 1 failure, 2 bad usage.
#include "models/gguf-model.h"
#include "models/lora-convert.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace forge;

namespace {

void usage(FILE *f) {
    std::fprintf(f,
                 "usage:\n"
                 "  gguf-lora to-gguf PEFT_DIR -o OUT.gguf [--arch ARCH | --base MODEL] [--type keep|f32|f16|bf16]\n"
                 "      PEFT adapter (adapter_config.json + adapter_model.safetensors) -> llama.cpp GGUF LoRA.\n"
                 "      ARCH is the base's general.architecture (default: from the adapter's config); --base (HF dir or\n"
                 "      GGUF) also checks every module's shape against the base. --type keep (default) copies the bytes.\n"
                 "  gguf-lora to-peft LORA.gguf -o PEFT_DIR [--base-model NAME]\n"
                 "      GGUF LoRA -> PEFT adapter directory; NAME goes into base_model_name_or_path.\n"
                 "  gguf-lora merge --base HF_DIR|MODEL.gguf --adapter PEFT_DIR|LORA.gguf -o OUT [--type auto|TYPE]\n"
                 "      W + scale * B A for every adapted weight; OUT ending in .gguf is written as GGUF (--type as in\n"
                 "      gguf-convert), any other OUT as an HF directory (model.safetensors + the base's config and tokenizer).\n"
                 "      A GGUF base gives a GGUF OUT with every weight in its own type.\n");
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr), 2;
    const std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help") return usage(stdout), 0;
    std::map<std::string, std::string> opt;
    std::vector<std::string> pos;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-o" || a == "--arch" || a == "--base" || a == "--type" || a == "--base-model" || a == "--adapter") {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "gguf-lora: %s needs a value\n", a.c_str());
                return 2;
            }
            opt[a] = argv[++i];
        } else if (a.size() > 1 && a[0] == '-') {
            std::fprintf(stderr, "gguf-lora: unknown option '%s'\n", a.c_str());
            return usage(stderr), 2;
        } else pos.push_back(a);
    }
    const std::map<std::string, std::set<std::string>> allowed = {{"to-gguf", {"-o", "--arch", "--base", "--type"}},
                                                                  {"to-peft", {"-o", "--base-model"}},
                                                                  {"merge", {"-o", "--base", "--adapter", "--type"}}};
    if (allowed.count(cmd))
        for (const auto &o : opt)
            if (!allowed.at(cmd).count(o.first)) {
                std::fprintf(stderr, "gguf-lora: option %s does not apply to %s\n", o.first.c_str(), cmd.c_str());
                return 2;
            }
    auto get = [&](const char *k, const char *def) { return opt.count(k) ? opt[k] : std::string(def); };
    const std::string out = get("-o", "");
    std::string err;
    LoraFile ad;
    bool ok = false;
    if (cmd == "to-gguf" || cmd == "to-peft") {
        if (pos.size() != 1 || out.empty()) return usage(stderr), 2;
        const std::string type = get("--type", "keep");
        if (cmd == "to-gguf" && type != "keep" && type != "f32" && type != "f16" && type != "bf16") {
            std::fprintf(stderr, "gguf-lora: --type '%s' is not one of keep, f32, f16, bf16\n", type.c_str());
            return 2;
        }
        if (cmd == "to-gguf") {
            struct stat st;
            if (stat(pos[0].c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
                std::fprintf(stderr, "gguf-lora: %s: not a PEFT adapter directory\n", pos[0].c_str());
                return 1;
            }
            LoraBase b;
            std::string arch = get("--arch", "");
            ok = lora_read_peft(pos[0], &ad, &err);
            if (ok && opt.count("--base")) {
                ok = lora_read_base(opt["--base"], &b, &err) && lora_check_base(ad, b, &err);
                if (ok && !arch.empty() && arch != b.arch) ok = false, err = "--arch " + arch + " differs from the base's architecture " + b.arch;
                arch = b.arch;
            }
            if (ok && arch.empty()) ok = lora_peft_arch(ad, &arch, &err);
            ok = ok && lora_write_gguf(ad, arch, type == "keep" ? type : (type == "f32" ? "F32" : type == "f16" ? "F16" : "BF16"), out, &err);
            if (ok) std::printf("%s: %s LoRA, %zu modules, from %s\n", out.c_str(), arch.c_str(), ad.pairs.size(), pos[0].c_str());
        } else {
            ok = lora_read_gguf(pos[0], &ad, &err) && lora_write_peft(ad, out, get("--base-model", ""), &err);
            if (ok) std::printf("%s: PEFT adapter, %zu modules, from %s\n", out.c_str(), ad.pairs.size(), pos[0].c_str());
        }
    } else if (cmd == "merge") {
        const std::string type = get("--type", "auto");
        if (!pos.empty() || out.empty() || !opt.count("--base") || !opt.count("--adapter")) return usage(stderr), 2;
        GgufFileType ft;
        if (type != "auto" && !gguf_file_type_by_name(type, &ft)) {
            std::fprintf(stderr, "gguf-lora: --type '%s' is not one of auto, %s\n", type.c_str(), gguf_file_type_names().c_str());
            return 2;
        }
        const bool tty = isatty(2);
        double kept = NAN;
        ok = lora_read(opt["--adapter"], &ad, &err) && lora_merge(opt["--base"], ad, out, type, &err, [tty](size_t done, size_t total) {
                 if (tty) std::fprintf(stderr, "\r\x1b[Kgguf-lora: merged %zu of %zu weights", done, total);
             }, &kept);
        if (tty) std::fprintf(stderr, "\r\x1b[K");
        if (ok && !std::isnan(kept)) std::fprintf(stderr, "gguf-lora: %s\n", lora_merge_kept_note(kept).c_str());
        if (ok) std::printf("%s: %s merged with %s (%zu weights)\n", out.c_str(), opt["--base"].c_str(), opt["--adapter"].c_str(), ad.pairs.size());
    } else {
        std::fprintf(stderr, "gguf-lora: unknown command '%s'\n", cmd.c_str());
        return usage(stderr), 2;
    }
    if (!ok) {
        std::fprintf(stderr, "gguf-lora: %s\n", err.c_str());
        return 1;
    }
    return 0;
}
