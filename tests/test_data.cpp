// Shards, the loader (determinism, disjoint ranks, resume), tokenizers and clear data errors.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/loader.h"
#include "data/safetensors.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "kernels/core/check.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
    const fs::path d = fs::temp_directory_path() / ("zgpt_test_data_" + name);
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

// Two shards whose token i is i in shard 0 and 10000 + i in shard 1: every token is unique, so a
// window's first token identifies it.
fs::path make_shards() {
    const fs::path d = temp_dir("shards");
    std::vector<uint32_t> a(3001), b(2001);
    for (size_t i = 0; i < a.size(); i++) a[i] = uint32_t(i);
    for (size_t i = 0; i < b.size(); i++) b[i] = uint32_t(10000 + i);
    write_shard((d / "train_000000.bin").string(), a);
    write_shard((d / "train_000001.bin").string(), b);
    return d;
}

std::vector<int32_t> take(DataLoader& l, int64_t B, int64_t T, int batches) {
    std::vector<int32_t> all, in(B * T), tg(B * T);
    for (int i = 0; i < batches; i++) {
        l.next_batch(in.data(), tg.data());
        all.insert(all.end(), in.begin(), in.end());
    }
    return all;
}

}  // namespace

TEST_CASE("shard round trip, uint16 and uint32 versions") {
    const fs::path d = temp_dir("roundtrip");
    write_shard((d / "a.bin").string(), {1, 2, 65535});
    write_shard((d / "b.bin").string(), {1, 70000});
    TokenShard a((d / "a.bin").string()), b((d / "b.bin").string());
    CHECK(a.version() == 1);
    CHECK(b.version() == 2);
    CHECK(a.size() == 3);
    CHECK(a[2] == 65535u);
    CHECK(b[1] == 70000u);
    CHECK(fs::file_size(d / "a.bin") == 1024 + 3 * 2);
}

TEST_CASE("bad shards give a clear error naming the file") {
    const fs::path d = temp_dir("bad");
    write_shard((d / "good.bin").string(), {1, 2, 3, 4, 5, 6, 7, 8});
    {  // wrong magic
        std::vector<char> bytes(1024 + 16, 0);
        std::ofstream((d / "magic.bin").string(), std::ios::binary)
            .write(bytes.data(), bytes.size());
    }
    fs::copy_file(d / "good.bin", d / "trunc.bin");
    fs::resize_file(d / "trunc.bin", 1024 + 7);
    CHECK_THROWS_WITH_AS(TokenShard((d / "magic.bin").string()),
                         doctest::Contains("magic.bin: bad magic"), Error);
    CHECK_THROWS_WITH_AS(TokenShard((d / "trunc.bin").string()),
                         doctest::Contains("trunc.bin: size 1031 bytes"), Error);
    LoaderOptions o;
    o.batch_size = 1;
    o.seq_len = 2;
    o.vocab_size = 5;  // token 5..8 are out of range
    CHECK_THROWS_WITH_AS(DataLoader((d / "good.bin").string(), o),
                         doctest::Contains("good.bin: token 5 at position 4 is >= vocab_size 5"),
                         Error);
    CHECK_THROWS_WITH_AS(DataLoader((d / "none_*.bin").string(), o),
                         doctest::Contains("no files match"), Error);
    o.vocab_size = 0;
    o.batch_size = 100;
    CHECK_THROWS_WITH_AS(DataLoader((d / "good.bin").string(), o),
                         doctest::Contains("fewer than one batch needs"), Error);
}

TEST_CASE("loader: targets are inputs shifted by one; sequential order without shuffle") {
    const fs::path d = make_shards();
    LoaderOptions o;
    o.batch_size = 2;
    o.seq_len = 8;
    o.shuffle = false;
    DataLoader l((d / "train_*.bin").string(), o);
    std::vector<int32_t> in(16), tg(16);
    l.next_batch(in.data(), tg.data());
    for (int i = 0; i < 8; i++) {
        CHECK(in[i] == i);
        CHECK(tg[i] == i + 1);
        CHECK(in[8 + i] == 8 + i);
    }
}

TEST_CASE("loader: same seed same data, other seed other data, new order each epoch") {
    const fs::path d = make_shards();
    LoaderOptions o;
    o.batch_size = 3;
    o.seq_len = 16;
    o.seed = 7;
    DataLoader a((d / "train_*.bin").string(), o), b((d / "train_*.bin").string(), o);
    const int per_epoch = int(a.batches_per_epoch());
    CHECK(take(a, 3, 16, 2 * per_epoch) == take(b, 3, 16, 2 * per_epoch));
    o.seed = 8;
    DataLoader c((d / "train_*.bin").string(), o);
    a.reset();
    CHECK(take(a, 3, 16, 4) != take(c, 3, 16, 4));
    a.reset();
    const auto e0 = take(a, 3, 16, per_epoch), e1 = take(a, 3, 16, per_epoch);
    CHECK(e0 != e1);
}

TEST_CASE("loader: ranks read disjoint windows, each its full share of the epoch") {
    const fs::path d = make_shards();
    const int world = 3;
    std::vector<std::set<int32_t>> starts(world);  // first token of each window
    int64_t per_epoch = 0;
    for (int r = 0; r < world; r++) {
        LoaderOptions o;
        o.batch_size = 2;
        o.seq_len = 10;
        o.seed = 3;
        o.rank = r;
        o.world_size = world;
        DataLoader l((d / "train_*.bin").string(), o);
        per_epoch = l.batches_per_epoch();
        std::vector<int32_t> in(20), tg(20);
        for (int64_t k = 0; k < per_epoch; k++) {
            l.next_batch(in.data(), tg.data());
            for (int b = 0; b < 2; b++) starts[r].insert(in[b * 10]);
        }
    }
    std::set<int32_t> all;
    for (int r = 0; r < world; r++) {
        CHECK(int64_t(starts[r].size()) == per_epoch * 2);
        for (int32_t s : starts[r]) CHECK(all.insert(s).second);  // never seen by another rank
    }
}

TEST_CASE("loader: a saved position resumes the exact same stream") {
    const fs::path d = make_shards();
    LoaderOptions o;
    o.batch_size = 2;
    o.seq_len = 12;
    o.seed = 11;
    DataLoader a((d / "train_*.bin").string(), o);
    take(a, 2, 12, int(a.batches_per_epoch()) + 3);  // into the second epoch
    const LoaderPosition p = a.position();
    CHECK(p.epoch == 1);
    const auto expected = take(a, 2, 12, 40);
    DataLoader b((d / "train_*.bin").string(), o);
    b.set_position(p);
    CHECK(take(b, 2, 12, 40) == expected);
}

TEST_CASE("char and byte tokenizers: round trip, save/load, clear errors") {
    const std::string text = "Hello, wörld! 🙂\nHello again.";
    const Tokenizer c = Tokenizer::char_level_from_text(text);
    const auto ids = c.encode(text);
    CHECK(c.decode(ids) == text);
    CHECK(ids.size() == 28);  // code points, not bytes
    const fs::path d = temp_dir("tok");
    c.save((d / "tokenizer.json").string());
    const Tokenizer l = Tokenizer::load((d / "tokenizer.json").string());
    CHECK(l.vocab_size() == c.vocab_size());
    CHECK(l.encode(text) == ids);
    CHECK_THROWS_WITH_AS(c.encode("xyz"), doctest::Contains("not in the char vocabulary"), Error);
    CHECK_THROWS_WITH_AS(Tokenizer::char_level_from_text("ok\xff"),
                         doctest::Contains("invalid UTF-8 at byte offset 2"), Error);
    const Tokenizer b = Tokenizer::byte_level();
    const std::string raw = "a\xff\x00z";
    CHECK(b.decode(b.encode(raw)) == raw);
    CHECK(b.vocab_size() == 256);
}

TEST_CASE("safetensors reader: values and a truncated file") {
    const fs::path d = temp_dir("st");
    const std::string header =
        R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
    const uint64_t n = header.size();
    const float vals[2] = {1.5f, -2.0f};
    {
        std::ofstream f((d / "a.safetensors").string(), std::ios::binary);
        f.write(reinterpret_cast<const char*>(&n), 8);
        f << header;
        f.write(reinterpret_cast<const char*>(vals), 8);
    }
    const SafeTensors st = SafeTensors::load((d / "a.safetensors").string());
    CHECK(st.as_double("x") == std::vector<double>{1.5, -2.0});
    CHECK(st.metadata()["k"] == "v");
    fs::resize_file(d / "a.safetensors", 8 + n + 4);
    CHECK_THROWS_WITH_AS(SafeTensors::load((d / "a.safetensors").string()),
                         doctest::Contains("lies outside the file"), Error);
}

TEST_CASE("loader, random sampling (nanoGPT's): valid windows, repeatable, resumable") {
    const fs::path d = make_shards();
    LoaderOptions o;
    o.batch_size = 4;
    o.seq_len = 16;
    o.seed = 5;
    o.sampling = Sampling::random;
    DataLoader a((d / "train_*.bin").string(), o), b((d / "train_*.bin").string(), o);
    std::vector<int32_t> in(64), tg(64);
    std::set<int32_t> starts;
    for (int k = 0; k < 50; k++) {
        a.next_batch(in.data(), tg.data());
        for (int i = 0; i < 64; i++) {
            CHECK(tg[i] == in[i] + 1);  // consecutive tokens: never across a shard boundary
            if (i % 16 == 0) starts.insert(in[i]);
        }
    }
    CHECK(starts.size() > 150);  // offsets are not aligned to a grid of T
    CHECK(take(b, 4, 16, 50) == [&] {
        a.reset();
        return take(a, 4, 16, 50);
    }());
    const LoaderPosition p = a.position();
    const auto expected = take(a, 4, 16, 10);
    b.set_position(p);
    CHECK(take(b, 4, 16, 10) == expected);
}
