// Checkpoint files: exact round trip, and every way a file can be wrong is refused with its reason.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kernels/core/check.h"
#include "model/parameters.h"
#include "tests/helpers.h"
#include "train/checkpoint.h"
#include "train/timed_choices.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {

ModelConfig small(int n_embd = 16) {
    ModelConfig c;
    c.n_layer = 1;
    c.n_head = 2;
    c.n_embd = n_embd;
    c.block_size = 8;
    c.vocab_size = 11;
    return c;
}

CheckpointState state_for(const ParameterTable& t, int64_t step) {
    Rng rng{uint64_t(step)};
    CheckpointState s;
    s.step = step;
    s.tokens = step * 100;
    s.loader = {2, 7};
    s.adam_steps = step;
    s.config_yaml = "train:\n  seed: 1\n";
    s.timed_choices = "768 2304 65536 1 0 0 1 0 4294967295 16 2\n";
    s.params = test::random_vector<float>(rng, t.total());
    s.m = test::random_vector<float>(rng, t.total());
    s.v = test::random_vector<float>(rng, t.total());
    return s;
}

fs::path fresh_dir(const std::string& name) {
    const fs::path d = fs::temp_directory_path() / ("zgpt_ckpt_" + name);
    fs::remove_all(d);
    return d;
}

}  // namespace

TEST_CASE("checkpoint round trip is exact; only the newest K are kept") {
    const GptLayout g = make_gpt_layout(small());
    const fs::path d = fresh_dir("roundtrip");
    for (int64_t step : {5, 10, 15, 20})
        save_checkpoint(d.string(), g.table, state_for(g.table, step), 3);
    const auto all = list_checkpoints(d.string());
    REQUIRE(all.size() == 3);
    CHECK(fs::path(all[0]).filename() == "ckpt_20.bin");
    CHECK(fs::path(all[2]).filename() == "ckpt_10.bin");
    const CheckpointState want = state_for(g.table, 20), got = load_checkpoint(all[0], g.table);
    CHECK(got.step == 20);
    CHECK(got.tokens == 2000);
    CHECK(got.loader.epoch == 2);
    CHECK(got.loader.batch == 7);
    CHECK(got.adam_steps == 20);
    CHECK(got.config_yaml == want.config_yaml);
    CHECK(got.timed_choices == want.timed_choices);
    CHECK(got.params == want.params);  // bit for bit
    CHECK(got.m == want.m);
    CHECK(got.v == want.v);
}

TEST_CASE("truncated, corrupt, other-version and other-shape checkpoints are refused") {
    const GptLayout g = make_gpt_layout(small());
    const fs::path d = fresh_dir("bad");
    const std::string p5 = save_checkpoint(d.string(), g.table, state_for(g.table, 5), 5);
    const std::string p10 = save_checkpoint(d.string(), g.table, state_for(g.table, 10), 5);
    const std::string copy = (d / "copy.bin").string();
    auto reset = [&] { fs::copy_file(p10, copy, fs::copy_options::overwrite_existing); };
    auto patch = [&](size_t offset, char value) {
        std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(offset));
        f.put(value);
    };
    reset();
    fs::resize_file(copy, fs::file_size(copy) - 100);
    CHECK_THROWS_WITH_AS(load_checkpoint(copy, g.table),
                         doctest::Contains("copy.bin refused: size"), Error);
    reset();
    patch(fs::file_size(copy) / 2, 0x55);
    CHECK_THROWS_WITH_AS(load_checkpoint(copy, g.table), doctest::Contains("checksum mismatch"),
                         Error);
    reset();
    patch(8, 9);  // format version 9
    CHECK_THROWS_WITH_AS(load_checkpoint(copy, g.table), doctest::Contains("format version 9"),
                         Error);
    reset();
    patch(0, 'X');
    CHECK_THROWS_WITH_AS(load_checkpoint(copy, g.table), doctest::Contains("not a zgpt checkpoint"),
                         Error);
    // another model: same parameter count, other shapes (n_head does not change the table; a
    // wider model changes sizes)
    const GptLayout other = make_gpt_layout(small(24));
    CHECK_THROWS_WITH_AS(load_checkpoint(p10, other.table), doctest::Contains("refused"), Error);
    ModelConfig untied = small();
    untied.tie_embeddings = false;
    CHECK_THROWS_AS(load_checkpoint(p10, make_gpt_layout(untied).table), Error);

    // the newest file corrupt: latest_valid_checkpoint falls back to the previous one and says why
    {
        std::fstream f(p10, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(200);
        f.put(0x11);
    }
    fs::remove(copy);
    std::vector<std::string> refused;
    CheckpointState s;
    CHECK(latest_valid_checkpoint(d.string(), g.table, &refused, &s) == p5);
    CHECK(s.step == 5);
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].find("ckpt_10.bin refused: checksum mismatch") != std::string::npos);
    // a temporary file of an interrupted write is never a candidate
    std::ofstream(d / "ckpt_99.bin.tmp") << "half";
    CHECK(list_checkpoints(d.string()).size() == 2);
}

#include <sys/stat.h>

TEST_CASE("out-of-range header fields, directories and FIFOs named like checkpoints are refused") {
    const GptLayout g = make_gpt_layout(small());
    const fs::path d = fresh_dir("hostile");
    save_checkpoint(d.string(), g.table, state_for(g.table, 5), 10);  // the valid one
    // checksum-valid files whose fields are out of range
    CheckpointState neg = state_for(g.table, 6);
    neg.tokens = -1;
    save_checkpoint(d.string(), g.table, neg, 10);
    CheckpointState huge = state_for(g.table, 7);
    huge.loader.epoch = int64_t(1) << 60;
    save_checkpoint(d.string(), g.table, huge, 10);
    CHECK_THROWS_WITH_AS(load_checkpoint((d / "ckpt_6.bin").string(), g.table),
                         doctest::Contains("header field tokens = -1 is out of range"), Error);
    CHECK_THROWS_WITH_AS(load_checkpoint((d / "ckpt_7.bin").string(), g.table),
                         doctest::Contains("header field loader.epoch"), Error);
    // a directory and a FIFO with checkpoint names: refused at once (a FIFO would block a read)
    fs::create_directories(d / "ckpt_8.bin");
    REQUIRE(mkfifo((d / "ckpt_9.bin").c_str(), 0600) == 0);
    std::vector<std::string> refused;
    CheckpointState st;
    const std::string got = latest_valid_checkpoint(d.string(), g.table, &refused, &st);
    CHECK(fs::path(got).filename() == "ckpt_5.bin");
    CHECK(st.step == 5);
    REQUIRE(refused.size() == 4);
    CHECK(refused[0].find("ckpt_9.bin refused: not a regular file") != std::string::npos);
    CHECK(refused[1].find("ckpt_8.bin refused: not a regular file") != std::string::npos);
    CHECK_THROWS_WITH_AS(read_checkpoint_header((d / "ckpt_9.bin").string()),
                         doctest::Contains("not a regular file"), Error);
}

TEST_CASE("a checkpoint with a non-finite weight or moment is refused, and resume falls back") {
    const GptLayout g = make_gpt_layout(small());
    const fs::path d = fresh_dir("nonfinite");
    save_checkpoint(d.string(), g.table, state_for(g.table, 5), 10);  // the valid one
    // checksum-valid files: the trainer never writes one (it stops before), so it is damage
    CheckpointState nan_weight = state_for(g.table, 6);
    nan_weight.params[3] = std::numeric_limits<float>::quiet_NaN();
    save_checkpoint(d.string(), g.table, nan_weight, 10);
    CheckpointState inf_moment = state_for(g.table, 7);
    inf_moment.v.back() = std::numeric_limits<float>::infinity();
    save_checkpoint(d.string(), g.table, inf_moment, 10);
    CHECK_THROWS_WITH_AS(load_checkpoint((d / "ckpt_6.bin").string(), g.table),
                         doctest::Contains("weight 3 is not finite"), Error);
    const std::string last_v = "AdamW v " + std::to_string(g.table.total() - 1) + " is not finite";
    CHECK_THROWS_WITH_AS(load_checkpoint((d / "ckpt_7.bin").string(), g.table),
                         doctest::Contains(last_v.c_str()), Error);
    std::vector<std::string> refused;
    CheckpointState st;
    const std::string got = latest_valid_checkpoint(d.string(), g.table, &refused, &st);
    CHECK(fs::path(got).filename() == "ckpt_5.bin");
    CHECK(st.step == 5);
    CHECK(refused.size() == 2);
}

TEST_CASE("timed kernel choices: the runs folder's file merges runs of other shapes, per GPU") {
    const std::string head = "# cuBLASLt 130100, NVIDIA H100 80GB HBM3, 132 SMs\n";
    const std::string mine = head + "8 8 8 0 1 1 1 1 0 16 3\n1 2 3 0 0 1 1 0 0 16 0\n";
    const std::string other = head + "1 2 3 0 0 1 1 0 0 16 5\n4 5 6 1 0 0 1 0 0 16 2\n";
    // mine wins where both have a shape; the other's extra shape is added; sorted by shape
    CHECK(zgpt::merge_timed_choices(mine, other) ==
          head + "1 2 3 0 0 1 1 0 0 16 0\n4 5 6 1 0 0 1 0 0 16 2\n8 8 8 0 1 1 1 1 0 16 3\n");
    // another GPU's file is replaced by mine, not mixed in
    CHECK(zgpt::merge_timed_choices(mine,
                                    "# cuBLASLt 130100, NVIDIA H200, 132 SMs\n4 5 6 1 0 0 1 "
                                    "0 0 16 2\n") == mine);
    CHECK(zgpt::merge_timed_choices("", other) == other);
    CHECK(zgpt::merge_timed_choices(mine, "") == mine);
    zgpt::TrainConfig t;
    t.out_dir = (std::filesystem::temp_directory_path() / "zgpt_test_choices").string();
    std::filesystem::remove_all(t.out_dir);
    CHECK(zgpt::read_timed_choices(zgpt::timed_choices_path(t)).empty());  // none yet
    std::filesystem::create_directories(t.out_dir);
    std::ofstream(zgpt::timed_choices_path(t)) << mine;
    CHECK(zgpt::read_timed_choices(zgpt::timed_choices_path(t)) == mine);
}

namespace {

// Rewrites a checkpoint's JSON header (and its checksum, so only the header is wrong).
void rewrite_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(path, std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t hlen = 0;
    std::memcpy(&hlen, raw.data() + 16, 8);
    nlohmann::json h = nlohmann::json::parse(raw.substr(24, hlen));
    edit(h);
    const std::string nh = h.dump();
    std::string out = raw.substr(0, 16);
    const uint64_t n = nh.size();
    out.append(reinterpret_cast<const char*>(&n), 8);
    out += nh;
    out += raw.substr(24 + hlen, raw.size() - 24 - hlen - 8);
    uint64_t sum = 0xcbf29ce484222325ull;
    for (unsigned char c : out) sum = (sum ^ c) * 0x100000001b3ull;
    out.append(reinterpret_cast<const char*>(&sum), 8);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

}  // namespace

TEST_CASE("checksum-valid headers of the wrong shape are refused, and resume falls back") {
    const GptLayout g = make_gpt_layout(small());
    const fs::path d = fresh_dir("header_shape");
    save_checkpoint(d.string(), g.table, state_for(g.table, 5), 10);  // the valid one
    const std::vector<std::pair<int, std::function<void(nlohmann::json&)>>> bad = {
        {6,
         [](nlohmann::json& h) {
             h = nlohmann::json::array({1, 2});
         }},
        {7, [](nlohmann::json& h) { h = nullptr; }},
        {8, [](nlohmann::json& h) { h.erase("tensors"); }},
        {9, [](nlohmann::json& h) { h["step"] = 9.5; }},  // an integer written as a float
        {10, [](nlohmann::json& h) { h["loader"]["batch"] = 1.5; }},
        {11, [](nlohmann::json& h) { h["loader"] = "x"; }},
    };
    for (const auto& [step, edit] : bad) {
        const std::string p = save_checkpoint(d.string(), g.table, state_for(g.table, step), 10);
        rewrite_header(p, edit);
        CHECK_THROWS_WITH_AS(load_checkpoint(p, g.table), doctest::Contains("refused"), Error);
    }
    CHECK_THROWS_WITH_AS(load_checkpoint((d / "ckpt_9.bin").string(), g.table),
                         doctest::Contains("step = 9.5 is not an integer"), Error);
    std::vector<std::string> refused;
    CheckpointState st;
    const std::string got = latest_valid_checkpoint(d.string(), g.table, &refused, &st);
    CHECK(fs::path(got).filename() == "ckpt_5.bin");
    CHECK(st.step == 5);
    REQUIRE(refused.size() == bad.size());
    for (const std::string& r : refused) {  // one line each, naming the file
        CHECK(r.find('\n') == std::string::npos);
        CHECK(r.find(d.string() + "/ckpt_") != std::string::npos);
    }
    // whatever the loader throws (here a plain std::exception), the next older one is tried
    refused.clear();
    const std::string older = latest_valid_checkpoint(
        d.string(),
        [&](const std::string& p) {
            if (p.find("ckpt_5") == std::string::npos) throw std::runtime_error("not this one");
            return load_checkpoint(p, g.table);
        },
        &refused, &st);
    CHECK(fs::path(older).filename() == "ckpt_5.bin");
    CHECK(refused.size() == bad.size());
    CHECK(refused[0].find("ckpt_11.bin refused: not this one") != std::string::npos);
}

TEST_CASE("a run folder's readers take its newest checkpoint that loads, of the run's model") {
    const ModelConfig m = small();
    const GptLayout g = make_gpt_layout(m);
    const fs::path run = fresh_dir("run_fallback");
    const std::string model_yaml =
        "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, vocab_size: 11}\n"
        "data: {train: shards/train_*.bin}\n";
    fs::create_directories(run / "checkpoints");
    std::ofstream(run / "config.yaml") << model_yaml;
    const std::string ck = (run / "checkpoints").string();
    CheckpointState good = state_for(g.table, 5);
    good.config_yaml = model_yaml;
    save_checkpoint(ck, g.table, good, 10);
    // newer ones that must each be refused: another model, a bad header, a link to /dev/null,
    // a FIFO and a directory
    const GptLayout wide = make_gpt_layout(small(24));
    CheckpointState other = state_for(wide.table, 6);
    other.config_yaml =
        "model: {n_layer: 1, n_head: 2, n_embd: 24, block_size: 8, vocab_size: 11}\n"
        "data: {train: shards/train_*.bin}\n";
    save_checkpoint(ck, wide.table, other, 10);
    CheckpointState bad_header = good;
    bad_header.step = 7;
    rewrite_header(save_checkpoint(ck, g.table, bad_header, 10),
                   [](nlohmann::json& h) { h.erase("tensors"); });
    fs::create_symlink("/dev/null", run / "checkpoints/ckpt_8.bin");
    REQUIRE(mkfifo((run / "checkpoints/ckpt_9.bin").c_str(), 0600) == 0);
    fs::create_directories(run / "checkpoints/ckpt_10.bin");
    const RunCheckpoint r = load_run_checkpoint(run.string(), "");
    CHECK(fs::path(r.path).filename() == "ckpt_5.bin");
    CHECK(r.state.step == 5);
    CHECK(r.state.params == good.params);
    CHECK(r.config.model.n_embd == 16);
    // the file itself, asked for by name, is read as it is: its own model
    const RunCheckpoint w = load_run_checkpoint("", ck + "/ckpt_6.bin");
    CHECK(w.config.model.n_embd == 24);
    CHECK_THROWS_WITH_AS(load_run_checkpoint("", ck + "/ckpt_7.bin"),
                         doctest::Contains("ckpt_7.bin refused"), Error);
}
