// Checkpoint files: exact round trip, and every way a file can be wrong is refused with its reason.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "kernels/check.h"
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
