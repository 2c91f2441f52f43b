// models/locate.cpp - model names to paths, and chat templates (locate.h).
#include "locate.h"

#include "json.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <sys/stat.h>

namespace forge {

bool is_dir(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

std::string lower(std::string s) {
    for (char &c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}

// qwen2.5-0.5b-instruct -> Qwen/Qwen2.5-0.5B-Instruct; gemma-2-2b-it -> google/gemma-2-2b-it
std::string hf_repo_guess(const std::string &name) {
    std::string n = lower(name);
    if (n.compare(0, 5, "gemma") == 0) return "google/" + n;
    if (n.compare(0, 4, "qwen") != 0) return "";
    std::string out = "Qwen/";
    std::string part;
    for (size_t i = 0; i <= n.size(); i++) {
        if (i < n.size() && n[i] != '-') { part += n[i]; continue; }
        if (!part.empty() && (std::isdigit((unsigned char)part[0]) || part[0] == '.') && part.back() == 'b') part.back() = 'B';
        else if (!part.empty()) part[0] = (char)std::toupper((unsigned char)part[0]);
        out += (out.size() > 5 ? "-" : "") + part;
        part.clear();
    }
    return out;
}

// <hub>/models--Org--Name/snapshots/<rev> holding config.json (refs/main first, else the newest)
std::string hf_snapshot(const std::string &repo_dir) {
    std::string rev;
    if (read_text_file(repo_dir + "/refs/main", &rev)) {
        while (!rev.empty() && std::isspace((unsigned char)rev.back())) rev.pop_back();
        if (is_file(repo_dir + "/snapshots/" + rev + "/config.json")) return repo_dir + "/snapshots/" + rev;
    }
    std::string best;
    time_t best_t = 0;
    for (const std::string &s : dir_entries(repo_dir + "/snapshots")) {
        struct stat st;
        std::string d = repo_dir + "/snapshots/" + s;
        if (stat((d + "/config.json").c_str(), &st) == 0 && (best.empty() || st.st_mtime > best_t)) best = d, best_t = st.st_mtime;
    }
    return best;
}

bool fail(std::string *err, const std::string &msg) {
    *err = msg;
    return false;
}

} // namespace

std::vector<std::string> dir_entries(const std::string &dir) {
    std::vector<std::string> out;
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.') out.push_back(e->d_name);
        closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}

bool read_text_file(const std::string &path, std::string *out) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char buf[65536];
    size_t n;
    out->clear();
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
    std::fclose(f);
    return true;
}

std::string absolute_path(const std::string &p) {
    char buf[4096];
    return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

bool model_locate(const std::string &m, ModelLocation *out, std::string *err) {
    const std::string lm = lower(m);
    if (is_file(m) && lm.size() > 5 && lm.compare(lm.size() - 5, 5, ".gguf") == 0) return *out = {m, absolute_path(m), true}, true;
    if (is_dir(m)) {
        if (!is_file(m + "/config.json"))
            return fail(err, m + ": the directory has no config.json (an HF model directory needs config.json, *.safetensors and tokenizer.json)");
        return *out = {m, absolute_path(m), false}, true;
    }
    if (is_file(m)) return fail(err, m + ": not a .gguf file or an HF model directory");
    std::vector<std::string> looked;
    auto try_dir = [&](const std::string &base) -> bool {
        const std::string d = base + "/" + m, f = d + ".gguf";
        looked.push_back(d + "[.gguf]");
        if (is_dir(d) && is_file(d + "/config.json")) *out = {d, absolute_path(d), false};
        else if (is_file(f)) *out = {f, absolute_path(f), true};
        else return false;
        return true;
    };
    auto env = [](const char *name) -> const char * {
        const char *v = std::getenv(name);
        return v && *v ? v : nullptr;
    };
    if (env("FORGE_MODELS") && try_dir(env("FORGE_MODELS"))) return true;
    if (!env("FORGE_MODELS")) looked.push_back("$FORGE_MODELS (not set)");
    std::string hub;
    if (env("HF_HUB_CACHE")) hub = env("HF_HUB_CACHE");
    else if (env("HF_HOME")) hub = std::string(env("HF_HOME")) + "/hub";
    else if (env("HOME")) hub = std::string(env("HOME")) + "/.cache/huggingface/hub";
    if (!hub.empty()) {
        looked.push_back(hub + "/models--*--" + m + "/snapshots/* (any case)");
        const std::string want = lm, want_id = lower(hf_repo_guess(m));
        for (const std::string &e : dir_entries(hub)) {
            size_t sep = e.find("--", 8);
            if (e.compare(0, 8, "models--") != 0 || sep == std::string::npos) continue;
            std::string org = e.substr(8, sep - 8), name = e.substr(sep + 2), id = org + "/" + name;
            if (lower(name) != want && lower(id) != want && lower(id) != want_id) continue;
            std::string snap = hf_snapshot(hub + "/" + e);
            if (!snap.empty()) return *out = {snap, id, false}, true;
        }
    }
    if (try_dir("./models")) return true;
    std::string where;
    for (const std::string &l : looked) where += "\n  " + l;
    std::string repo = m.find('/') != std::string::npos ? m : hf_repo_guess(m);
    return fail(err, m + ": model not found. Looked in:" + where + "\nGet it with:\n  huggingface-cli download " +
                         (repo.empty() ? "<org>/<repo>" : repo) + "\nor pass -m /path/to/model-dir (config.json + *.safetensors + tokenizer.json) or -m FILE.gguf");
}

std::string hf_chat_template(const std::string &dir) {
    json::Value c;
    std::string err, text;
    if (is_file(dir + "/tokenizer_config.json") && json::parse_file(dir + "/tokenizer_config.json", &c, &err)) {
        const json::Value &t = c["chat_template"];
        if (t.is_string()) return t.str();
        for (size_t i = 0; i < t.size(); i++)
            if (t.at(i)["name"].str() == "default") return t.at(i)["template"].str();
    }
    return read_text_file(dir + "/chat_template.jinja", &text) ? text : "";
}

} // namespace forge
