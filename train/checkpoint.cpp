#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/file_read.h"
#include "kernels/core/check.h"
#include "train/run_dir.h"

namespace zgpt {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'Z', 'G', 'P', 'T', 'C', 'K', 'P', 'T'};

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

nlohmann::json table_json(const ParameterTable& t) {
    nlohmann::json a = nlohmann::json::array();
    for (const ParamSpec& s : t.specs()) a.push_back({{"name", s.name}, {"shape", s.shape}});
    return a;
}

void append(std::vector<unsigned char>& buf, const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    buf.insert(buf.end(), b, b + n);
}

int64_t step_of(const fs::path& p) {  // ckpt_<step>.bin
    const std::string s = p.filename().string();
    if (s.rfind("ckpt_", 0) != 0 || p.extension() != ".bin") return -1;
    try {
        return std::stoll(s.substr(5, s.size() - 9));
    } catch (...) {
        return -1;
    }
}

// A header field that must be an integer: 1.5 or "2" is refused, not truncated or converted.
int64_t header_int(const nlohmann::json& h, const char* key) {
    const nlohmann::json& v = h.at(key);
    if (!v.is_number_integer())
        throw Error(std::string(key) + " = " + v.dump() + " is not an integer");
    return v.get<int64_t>();
}

// The same model: every option that shapes its weights or its forward pass.
bool same_model(const ModelConfig& a, const ModelConfig& b) {
    return a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_embd == b.n_embd &&
           a.block_size == b.block_size && a.vocab_size == b.vocab_size &&
           a.tie_embeddings == b.tie_embeddings && a.bias == b.bias && a.qk_norm == b.qk_norm &&
           a.ln_eps == b.ln_eps && a.norm == b.norm && a.position == b.position &&
           a.rope_theta == b.rope_theta && a.mlp == b.mlp &&
           mlp_hidden_size(a) == mlp_hidden_size(b) && kv_heads(a) == kv_heads(b);
}

// One line: a refusal is reported on one line of the log, whatever its message holds.
std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const ParameterTable& table,
                            const CheckpointState& s, int keep) {
    const size_t n = size_t(table.total());
    ZG_CHECK(s.params.size() == n && s.m.size() == n && s.v.size() == n,
             "save_checkpoint: state does not match the parameter table");
    nlohmann::json h{{"format_version", kCheckpointVersion},
                     {"step", s.step},
                     {"tokens", s.tokens},
                     {"loader",
                      {{"epoch", s.loader.epoch},
                       {"batch", s.loader.batch},
                       {"windows_per_batch", s.loader_windows_per_batch}}},
                     {"adam_steps", s.adam_steps},
                     {"config", s.config_yaml},
                     {"timed_choices", s.timed_choices},
                     {"total", table.total()},
                     {"tensors", table_json(table)}};
    const std::string header = h.dump();
    std::vector<unsigned char> buf;
    buf.reserve(32 + header.size() + 12 * n + 8);
    const uint32_t version = kCheckpointVersion, zero = 0;
    const uint64_t hlen = header.size();
    append(buf, kMagic, 8);
    append(buf, &version, 4);
    append(buf, &zero, 4);
    append(buf, &hlen, 8);
    append(buf, header.data(), header.size());
    append(buf, s.params.data(), 4 * n);
    append(buf, s.m.data(), 4 * n);
    append(buf, s.v.data(), 4 * n);
    const uint64_t sum = fnv1a(buf.data(), buf.size());
    append(buf, &sum, 8);

    fs::create_directories(dir);
    const fs::path final_path = fs::path(dir) / ("ckpt_" + std::to_string(s.step) + ".bin");
    // Test hook: die half-way through this write (the kill-during-checkpoint test).
    const char* crash = std::getenv("ZGPT_TEST_KILL_IN_CHECKPOINT_AT_STEP");
    if (crash && std::atoll(crash) == s.step) {
        const int fd =
            ::open((final_path.string() + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0 && ::write(fd, buf.data(), buf.size() / 2) > 0) ::fsync(fd);
        std::raise(SIGKILL);
    }
    write_file_atomic(final_path.string(), buf.data(), buf.size(), true);
    // The newest `keep` of this one and the older ones stay. Files named like newer steps are
    // left alone: they are what a resume refused (damaged, another model), and a prune by name
    // would keep them and delete the checkpoint just written.
    int kept = 1;
    for (const std::string& p : list_checkpoints(dir)) {
        if (step_of(p) >= s.step) continue;
        std::error_code ec;
        if (++kept > std::max(keep, 1)) fs::remove(p, ec);
    }
    return final_path.string();
}

CheckpointState load_checkpoint(const std::string& path, const ParameterTable& table) {
    auto fail = [&](const std::string& why) {
        throw Error("checkpoint " + path + " refused: " + why);
    };
    // A FIFO or a device would block or never end, and a file far larger than any checkpoint of
    // this model (a sparse file, say) is not read whole to find that out.
    const uint64_t most = 24 + (uint64_t(1) << 30) + 12 * uint64_t(table.total()) + 8;
    const std::string raw = read_regular_file(path, "checkpoint", most);
    const std::vector<unsigned char> buf(raw.begin(), raw.end());
    if (buf.size() < 32 || std::memcmp(buf.data(), kMagic, 8) != 0) fail("not a zgpt checkpoint");
    uint32_t version;
    uint64_t hlen;
    std::memcpy(&version, buf.data() + 8, 4);
    std::memcpy(&hlen, buf.data() + 16, 8);
    if (version != kCheckpointVersion)
        fail("format version " + std::to_string(version) + ", this build reads version " +
             std::to_string(kCheckpointVersion));
    const size_t n = size_t(table.total());
    const size_t expect = 24 + hlen + 12 * n + 8;
    if (hlen > buf.size() || buf.size() != expect)
        fail("size " + std::to_string(buf.size()) + " bytes, expected " + std::to_string(expect) +
             " (truncated, or a model of another size)");
    uint64_t sum;
    std::memcpy(&sum, buf.data() + buf.size() - 8, 8);
    if (fnv1a(buf.data(), buf.size() - 8) != sum) fail("checksum mismatch (corrupt file)");
    nlohmann::json h;
    try {
        h = nlohmann::json::parse(buf.begin() + 24, buf.begin() + 24 + std::ptrdiff_t(hlen));
    } catch (const std::exception& e) {
        fail(std::string("unreadable header: ") + e.what());
    }
    if (!h.is_object()) fail("the header is not a JSON object");
    if (!h.contains("tensors") || !h["tensors"].is_array())
        fail("the header has no tensor table (\"tensors\": a list)");
    const nlohmann::json want = table_json(table);
    if (const nlohmann::json& got = h["tensors"]; got != want) {
        for (size_t i = 0; i < std::max(got.size(), want.size()); i++) {
            if (i >= got.size() || i >= want.size() || got[i] != want[i])
                fail("another model shape: the checkpoint has " +
                     (i < got.size() ? got[i].dump() : std::string("no tensor")) +
                     " where the model has " +
                     (i < want.size() ? want[i].dump() : std::string("no tensor")));
        }
    }
    CheckpointState s;
    try {  // a field missing or of another type: refused like any other corruption
        s.step = header_int(h, "step");
        s.tokens = header_int(h, "tokens");
        const nlohmann::json& loader = h.at("loader");
        if (!loader.is_object()) throw Error("loader is not an object");
        s.loader.epoch = header_int(loader, "epoch");
        s.loader.batch = header_int(loader, "batch");
        s.loader_windows_per_batch =
            loader.contains("windows_per_batch") ? header_int(loader, "windows_per_batch") : 0;
        s.adam_steps = header_int(h, "adam_steps");
        s.config_yaml = h.at("config").get<std::string>();
        s.timed_choices = h.value("timed_choices", std::string());
    } catch (const std::exception& e) {
        fail(std::string("header field: ") + e.what());
    }
    const int64_t kHuge = int64_t(1) << 48;  // beyond any run; keeps the loader's products exact
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"step", s.step},
                                  {"tokens", s.tokens},
                                  {"loader.epoch", s.loader.epoch},
                                  {"loader.batch", s.loader.batch},
                                  {"loader.windows_per_batch", s.loader_windows_per_batch},
                                  {"adam_steps", s.adam_steps}})
        if (v < 0 || v > kHuge)
            fail(std::string("header field ") + name + " = " + std::to_string(v) +
                 " is out of range");
    // The trainer stops before it would save a non-finite weight or moment (a diverged run keeps
    // its last good checkpoint), so one found here is damage the checksum did not catch.
    const unsigned char* body = buf.data() + 24 + hlen;
    for (auto [v, what] : {std::pair{&s.params, "weight"}, {&s.m, "AdamW m"}, {&s.v, "AdamW v"}}) {
        v->resize(n);
        std::memcpy(v->data(), body, 4 * n);
        body += 4 * n;
        for (size_t i = 0; i < v->size(); i++)
            if (!std::isfinite((*v)[i]))
                fail(std::string(what) + " " + std::to_string(i) + " is not finite (" +
                     std::to_string((*v)[i]) + ")");
    }
    return s;
}

CheckpointHeader read_checkpoint_header(const std::string& path) {
    const int fd = open_regular_file(path, "checkpoint", UINT64_MAX, nullptr);
    auto read_all = [&](void* p, size_t n) {
        size_t done = 0;
        while (done < n) {
            const ssize_t r = ::read(fd, static_cast<char*>(p) + done, n - done);
            if (r > 0)
                done += size_t(r);
            else if (!(r < 0 && errno == EINTR))
                break;
        }
        return done == n;
    };
    char fixed[24] = {};
    const bool whole = read_all(fixed, 24) && std::memcmp(fixed, kMagic, 8) == 0;
    uint64_t hlen = 0;
    std::memcpy(&hlen, fixed + 16, 8);
    std::string header;
    std::string why = !whole                        ? "not a zgpt checkpoint"
                      : hlen >= (uint64_t(1) << 30) ? "implausible header"
                                                    : "";
    if (why.empty()) {
        header.resize(hlen);
        if (!read_all(header.data(), hlen)) why = "truncated header";
    }
    ::close(fd);
    if (!why.empty()) throw Error("checkpoint " + path + " refused: " + why);
    try {
        const nlohmann::json h = nlohmann::json::parse(header);
        if (!h.is_object()) throw Error("not a JSON object");
        return {header_int(h, "step"), h.at("config").get<std::string>()};
    } catch (const std::exception& e) {
        throw Error("checkpoint " + path + " refused: unreadable header: " + e.what());
    }
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
    std::vector<std::pair<int64_t, std::string>> found;
    if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
            if (const int64_t st = step_of(e.path()); st >= 0)
                found.emplace_back(st, e.path().string());
    std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<std::string> out;
    for (auto& [st, p] : found) out.push_back(p);
    return out;
}

std::string latest_valid_checkpoint(const std::string& dir, const CheckpointLoader& load,
                                    std::vector<std::string>* refused, CheckpointState* state) {
    for (const std::string& p : list_checkpoints(dir)) {
        try {
            CheckpointState s = load(p);
            if (state) *state = std::move(s);
            return p;
        } catch (const std::exception& e) {  // ours, the JSON and YAML parsers', the file system's
            std::string why = one_line(e.what());
            if (why.find(p) == std::string::npos) why = "checkpoint " + p + " refused: " + why;
            std::fprintf(stderr, "warning: %s\n", why.c_str());
            if (refused) refused->push_back(why);
        }
    }
    return "";
}

std::string latest_valid_checkpoint(const std::string& dir, const ParameterTable& table,
                                    std::vector<std::string>* refused, CheckpointState* state) {
    return latest_valid_checkpoint(
        dir, [&](const std::string& p) { return load_checkpoint(p, table); }, refused, state);
}

RunCheckpoint load_run_checkpoint(const std::string& run_dir, const std::string& checkpoint_file) {
    ZG_CHECK(run_dir.empty() != checkpoint_file.empty(),
             "give a run directory or a checkpoint file");
    const std::string dir = run_dir.empty() ? fs::path(checkpoint_file).parent_path().string()
                                            : run_dir + "/checkpoints";
    std::optional<ModelConfig> run_model;
    if (const fs::path c = fs::path(run_dir) / "config.yaml"; !run_dir.empty() && fs::exists(c))
        run_model = load_config(c.string()).model;
    RunCheckpoint r;
    // The model comes from the config inside the checkpoint; in a run folder it must be the run's
    // own (config.yaml): a checkpoint of another model there is refused like a damaged one.
    auto load = [&](const std::string& path) {
        r.config = load_config_text(read_checkpoint_header(path).config_yaml, path);
        if (!run_dir.empty() && run_model)
            ZG_CHECK(same_model(r.config.model, *run_model),
                     "checkpoint " + path + " refused: its model is not the run's (" + run_dir +
                         "/config.yaml)");
        return load_checkpoint(path, make_gpt_layout(r.config.model).table);
    };
    if (!checkpoint_file.empty()) {
        r.path = checkpoint_file;
        r.state = load(r.path);
        return r;
    }
    ZG_CHECK(!list_checkpoints(dir).empty(), "no checkpoint in " + dir);
    r.path = latest_valid_checkpoint(dir, load, nullptr, &r.state);
    ZG_CHECK(!r.path.empty(), "no valid checkpoint in " + dir);
    return r;
}

}  // namespace zgpt
