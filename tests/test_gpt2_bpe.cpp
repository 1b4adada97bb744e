// GPT-2 BPE: known encodings from an independent implementation, exact round trips of arbitrary
// bytes, parallel == serial, and the encode speed. Needs OpenAI's encoder.json + vocab.bpe:
// $ZGPT_GPT2_DIR, else <source>/../shared/data/gpt2; the binary is skipped with the path otherwise.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/gpt2_bpe.h"
#include "tests/helpers.h"

using namespace zgpt;

namespace {

std::string gpt2_dir() {
    if (const char* e = std::getenv("ZGPT_GPT2_DIR"); e && *e) return e;
    return std::string(ZGPT_SOURCE_DIR) + "/../shared/data/gpt2";
}

const bool kHaveFiles = [] {
    if (!std::filesystem::exists(gpt2_dir() + "/encoder.json") ||
        !std::filesystem::exists(gpt2_dir() + "/vocab.bpe"))
        test::skip_binary("GPT-2 encoder.json / vocab.bpe not found in " + gpt2_dir() +
                          " (set ZGPT_GPT2_DIR)");
    return true;
}();

std::shared_ptr<const Gpt2Bpe> tokenizer() {
    static std::shared_ptr<const Gpt2Bpe> t =
        Gpt2Bpe::load(gpt2_dir() + "/encoder.json", gpt2_dir() + "/vocab.bpe");
    return t;
}

// Generated with Hugging Face tokenizers 0.x (ByteLevel BPE on OpenAI's GPT-2 encoder.json +
// vocab.bpe, add_prefix_space=False): an independent implementation of the GPT-2 encoding.
struct KnownEncoding {
    const char* text;
    std::vector<uint32_t> ids;
};
const std::vector<KnownEncoding> kKnownEncodings = {
    {"Hello world", {15496, 995}},
    {"Hello, world!", {15496, 11, 995, 0}},
    {"I'm sure they'll say it's fine, won't they?",
     {40, 1101, 1654, 484, 1183, 910, 340, 338, 3734, 11, 1839, 470, 484, 30}},
    {"The year 2024 had 366 days; pi is 3.14159.",
     {464, 614, 48609, 550, 44856, 1528, 26, 31028, 318, 513, 13, 1415, 19707, 13}},
    {"na\xc3"
     "\xaf"
     "ve caf\xc3"
     "\xa9"
     " r\xc3"
     "\xa9"
     "sum\xc3"
     "\xa9"
     "",
     {2616, 38776, 40304, 40560, 16345, 2634}},
    {"\xe6"
     "\x97"
     "\xa5"
     "\xe6"
     "\x9c"
     "\xac"
     "\xe8"
     "\xaa"
     "\x9e"
     "\xe3"
     "\x81"
     "\xae"
     "\xe3"
     "\x83"
     "\x86"
     "\xe3"
     "\x82"
     "\xad"
     "\xe3"
     "\x82"
     "\xb9"
     "\xe3"
     "\x83"
     "\x88"
     "\xe3"
     "\x81"
     "\xa7"
     "\xe3"
     "\x81"
     "\x99"
     "\xe3"
     "\x80"
     "\x82"
     "",
     {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302, 30640, 33623, 16764}},
    {"emoji: \xf0"
     "\x9f"
     "\x99"
     "\x82"
     "\xf0"
     "\x9f"
     "\x91"
     "\x8d"
     "\xf0"
     "\x9f"
     "\x8f"
     "\xbd"
     "\xf0"
     "\x9f"
     "\x9a"
     "\x80"
     "",
     {368, 31370, 25, 32485, 41840, 235, 8582, 237, 121, 8582, 248, 222}},
    {"  leading and   multiple   spaces  ",
     {220, 3756, 290, 220, 220, 3294, 220, 220, 9029, 220, 220}},
    {"line one\x0a"
     "line two\x0a"
     "\x0a"
     "\x09"
     "indented\x0d"
     "\x0a"
     "",
     {1370, 530, 198, 1370, 734, 628, 197, 521, 4714, 201, 198}},
    {"!!! ??? ... --- ***", {10185, 34913, 2644, 11420, 17202}},
    {"GPT-2's tokenizer <|endoftext|> text",
     {38, 11571, 12, 17, 338, 11241, 7509, 1279, 91, 437, 1659, 5239, 91, 29, 2420}},
    {"ALLCAPS and CamelCase and snake_case_words",
     {1847, 5639, 44580, 290, 43281, 20448, 290, 17522, 62, 7442, 62, 10879}},
    {"xxx abababababababababababababababababababab",
     {31811, 450, 397, 397, 397, 397, 397, 397, 397, 397, 397,
      397,   397, 397, 397, 397, 397, 397, 397, 397, 397}},
    {"\xc3"
     "\x9c"
     "n\xc3"
     "\xaf"
     "c\xc3"
     "\xb6"
     "d\xc3"
     "\xa9"
     " \xc3"
     "\x9f"
     "tra\xc3"
     "\x9f"
     "e \xce"
     "\xa9"
     "\xce"
     "\xbc"
     "\xce"
     "\xad"
     "\xce"
     "\xb3"
     "\xce"
     "\xb1"
     " \xd0"
     "\x9f"
     "\xd1"
     "\x80"
     "\xd0"
     "\xb8"
     "\xd0"
     "\xb2"
     "\xd0"
     "\xb5"
     "\xd1"
     "\x82"
     " \xd0"
     "\xbc"
     "\xd0"
     "\xb8"
     "\xd1"
     "\x80"
     "",
     {127,   250,   77,    26884, 66,    9101,  67,  2634,  6184,  253,   9535,
      39683, 68,    7377,  102,   34703, 138,   255, 42063, 17394, 12466, 253,
      21169, 18849, 38857, 16843, 20375, 12466, 120, 18849, 21169}},
    {"\xc2"
     "\xa0"
     "non-breaking\xe2"
     "\x80"
     "\x89"
     "thin\xe3"
     "\x80"
     "\x80"
     "ideographic spaces",
     {1849, 13159, 12, 13395, 447, 231, 40871, 5099, 222, 485, 6826, 9029}},
    {"tabs\x09"
     "\x09"
     "and\x0b"
     "vertical",
     {8658, 82, 197, 197, 392, 199, 1851, 605}},
    {"1234567890 0.5 -3 +7 1e10",
     {10163, 2231, 30924, 3829, 657, 13, 20, 532, 18, 1343, 22, 352, 68, 940}},
    {"'s 't 're 've 'm 'll 'd ''quoted''",
     {338, 705, 83, 705, 260, 705, 303, 705, 76, 705, 297, 705, 67, 10148, 421, 5191, 7061}},
    {"   ", {220, 220, 220}},
    {"a", {64}},
};

}  // namespace

TEST_CASE("known GPT-2 encodings (Hugging Face tokenizers on the same files)") {
    const auto t = tokenizer();
    CHECK(t->vocab_size() == 50257);
    CHECK(t->end_of_text() == 50256);
    for (const KnownEncoding& k : kKnownEncodings) {
        CAPTURE(k.text);
        CHECK(t->encode(k.text) == k.ids);
        CHECK(t->decode(k.ids) == k.text);
    }
}

TEST_CASE("round trip of arbitrary bytes: invalid UTF-8, emoji, control bytes, random data") {
    const auto t = tokenizer();
    const std::vector<std::string> texts = {"plain ascii",
                                            "emoji 🙂👍🏽 and ZWJ 👩‍👩‍👧",
                                            "\xff\xfe invalid \xc3\x28 \xe2\x82 \xf0\x9f\x98",
                                            std::string("nul\0inside", 10),
                                            "\x80\x81\x82 lone continuations",
                                            "surrogate \xed\xa0\x80 bytes"};
    for (const std::string& s : texts) CHECK(t->decode(t->encode(s)) == s);
    Rng rng(5);
    for (int trial = 0; trial < 50; trial++) {
        std::string s(size_t(rng.below(300)), '\0');
        for (char& c : s) c = char(rng.below(256));
        CHECK(t->decode(t->encode(s)) == s);
    }
}

TEST_CASE("parallel encoding equals serial encoding; encode speed") {
    const auto t = tokenizer();
    std::ostringstream ss;
    Rng rng(9);
    const char* words[] = {"the",   " quick", " brown", " fox",   "'s",    " 1984",
                           ",",     "\n",     "\n\n",   " \n",    "  ",    "Ünïcödé",
                           " 日本", "🙂",   "\t",     " jumps", " over", "\xff"};
    for (int i = 0; i < 600000; i++) ss << words[rng.below(18)];
    const std::string text = ss.str();  // ~3 MB: several parallel chunks
    const auto t0 = std::chrono::steady_clock::now();
    const auto serial = t->encode(text);
    const auto t1 = std::chrono::steady_clock::now();
    const auto parallel = t->encode_parallel(text);
    const auto t2 = std::chrono::steady_clock::now();
    CHECK(parallel == serial);
    CHECK(t->decode(parallel) == text);
    const double mb = double(text.size()) / 1e6;
    MESSAGE("encode: " << mb / std::chrono::duration<double>(t1 - t0).count() << " MB/s serial, "
                       << mb / std::chrono::duration<double>(t2 - t1).count() << " MB/s parallel");
}
