// Training a byte-level BPE vocabulary: the most frequent pair merges first, the vocabulary has the
// asked size, Gpt2Bpe loads it, text round-trips and compresses, and training is deterministic.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/bpe_trainer.h"
#include "data/gpt2_bpe.h"
#include "data/utf8.h"
#include "tests/helpers.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {
std::string read(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
}  // namespace

TEST_CASE("train_bpe: first merge, size, round trip, compression, determinism") {
    std::ostringstream ss;
    Rng rng(4);
    const char* words[] = {"the", " the", " cat",  " sat",  " on",  " mat",
                           ".",   "\n",   " über", " 🙂", " aaaa"};
    for (int i = 0; i < 20000; i++) ss << words[rng.below(11)];
    const std::string text = ss.str() + "\xff\xfe";  // invalid bytes are pieces too
    const fs::path a = fs::temp_directory_path() / "zgpt_bpe_a",
                   b = fs::temp_directory_path() / "zgpt_bpe_b";
    const BpeTrainResult r = train_bpe({text}, 300, a.string());
    CHECK(r.vocab_size == 300);
    CHECK(r.merges >= 43);
    train_bpe({text}, 300, b.string());
    CHECK(read(a / "vocab.bpe") == read(b / "vocab.bpe"));  // deterministic
    CHECK(read(a / "encoder.json") == read(b / "encoder.json"));
    // the first merge is the most frequent adjacent pair of the pieces
    std::istringstream merges(read(a / "vocab.bpe"));
    std::string header, first;
    std::getline(merges, header);
    std::getline(merges, first);
    CHECK(header == "#version: 0.2");
    // count the pairs of the pieces independently; ties go to the lowest (first byte, second byte)
    std::map<std::pair<int, int>, int64_t> count;
    Gpt2PreTokenizer().split(text, 0, text.size(), [&](std::string_view piece, bool) {
        for (size_t k = 0; k + 1 < piece.size(); k++)
            count[{(unsigned char)piece[k], (unsigned char)piece[k + 1]}]++;
    });
    std::pair<int, int> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [pair, c] : count)
        if (c > best_count) best = pair, best_count = c;
    const std::vector<uint32_t> cp = gpt2_byte_to_code_point();
    std::string want;
    utf8_append(want, cp[best.first]);
    want += ' ';
    utf8_append(want, cp[best.second]);
    CHECK(first == want);
    const auto bpe = Gpt2Bpe::load((a / "encoder.json").string(), (a / "vocab.bpe").string());
    CHECK(bpe->vocab_size() == 300);
    CHECK(bpe->end_of_text() == 299);
    const auto ids = bpe->encode(text);
    CHECK(bpe->decode(ids) == text);
    CHECK(double(text.size()) / double(ids.size()) > 3.0);  // whole words became single tokens
    CHECK_THROWS(train_bpe({text}, 100, a.string()));
}
