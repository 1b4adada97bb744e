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

#include "kernels/check.h"
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
    const std::vector<std::string> all = list_checkpoints(dir);
    for (size_t i = size_t(std::max(keep, 1)); i < all.size(); i++) fs::remove(all[i]);
    return final_path.string();
}

CheckpointState load_checkpoint(const std::string& path, const ParameterTable& table) {
    auto fail = [&](const std::string& why) {
        throw Error("checkpoint " + path + " refused: " + why);
    };
    // Before reading: a FIFO or a device would block or never end, and a file far larger than
    // any checkpoint of this model (a sparse file, say) is not read whole to find that out.
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) fail("not a regular file");
    const uint64_t most = 24 + (uint64_t(1) << 30) + 12 * uint64_t(table.total()) + 8;
    if (fs::file_size(path, ec) > most || ec) fail("larger than any checkpoint of this model");
    std::ifstream f(path, std::ios::binary);
    ZG_CHECK(f.good(), "cannot read checkpoint " + path);
    std::vector<unsigned char> buf((std::istreambuf_iterator<char>(f)),
                                   std::istreambuf_iterator<char>());
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
    const nlohmann::json want = table_json(table);
    if (h.at("tensors") != want) {
        const auto& got = h.at("tensors");
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
        s.step = h.at("step").get<int64_t>();
        s.tokens = h.at("tokens").get<int64_t>();
        s.loader.epoch = h.at("loader").at("epoch").get<int64_t>();
        s.loader.batch = h.at("loader").at("batch").get<int64_t>();
        s.loader_windows_per_batch = h.at("loader").value("windows_per_batch", int64_t(0));
        s.adam_steps = h.at("adam_steps").get<int64_t>();
        s.config_yaml = h.at("config").get<std::string>();
        s.timed_choices = h.value("timed_choices", std::string());
    } catch (const nlohmann::json::exception& e) {
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
    std::error_code ec;
    ZG_CHECK(fs::is_regular_file(path, ec), "checkpoint " + path + " refused: not a regular file");
    std::ifstream f(path, std::ios::binary);
    ZG_CHECK(f.good(), "cannot read checkpoint " + path);
    char fixed[24] = {};
    f.read(fixed, 24);
    ZG_CHECK(f.gcount() == 24 && std::memcmp(fixed, kMagic, 8) == 0,
             "checkpoint " + path + " refused: not a zgpt checkpoint");
    uint64_t hlen = 0;
    std::memcpy(&hlen, fixed + 16, 8);
    ZG_CHECK(hlen < (uint64_t(1) << 30), "checkpoint " + path + " refused: implausible header");
    std::string header(hlen, '\0');
    f.read(header.data(), std::streamsize(hlen));
    ZG_CHECK(uint64_t(f.gcount()) == hlen, "checkpoint " + path + " refused: truncated header");
    try {
        const nlohmann::json h = nlohmann::json::parse(header);
        return {h.at("step").get<int64_t>(), h.at("config").get<std::string>()};
    } catch (const nlohmann::json::exception& e) {
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

std::string latest_valid_checkpoint(const std::string& dir, const ParameterTable& table,
                                    std::vector<std::string>* refused, CheckpointState* state) {
    for (const std::string& p : list_checkpoints(dir)) {
        try {
            CheckpointState s = load_checkpoint(p, table);
            if (state) *state = std::move(s);
            return p;
        } catch (const Error& e) {
            if (refused) refused->push_back(e.what());
        }
    }
    return "";
}

RunCheckpoint load_run_checkpoint(const std::string& run_dir, const std::string& checkpoint_file) {
    ZG_CHECK(run_dir.empty() != checkpoint_file.empty(),
             "give a run directory or a checkpoint file");
    const std::string dir = run_dir.empty() ? fs::path(checkpoint_file).parent_path().string()
                                            : run_dir + "/checkpoints";
    RunCheckpoint r;
    r.path = checkpoint_file;
    if (r.path.empty()) {
        const auto all = list_checkpoints(dir);
        ZG_CHECK(!all.empty(), "no checkpoint in " + dir);
        r.path = all.front();
    }
    // the model's shape comes from the config inside the checkpoint
    r.config = load_config_text(read_checkpoint_header(r.path).config_yaml, r.path);
    const GptLayout layout = make_gpt_layout(r.config.model);
    if (!checkpoint_file.empty()) {
        r.state = load_checkpoint(r.path, layout.table);
    } else {  // the newest that loads (an older one if the newest is damaged)
        std::vector<std::string> refused;
        r.path = latest_valid_checkpoint(dir, layout.table, &refused, &r.state);
        for (const auto& why : refused) std::fprintf(stderr, "warning: %s\n", why.c_str());
        ZG_CHECK(!r.path.empty(), "no valid checkpoint in " + dir);
    }
    return r;
}

}  // namespace zgpt
