#include "data/bpe_trainer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "data/gpt2_bpe.h"
#include "data/utf8.h"
#include "kernels/core/check.h"

namespace zgpt {

namespace {

using Pair = uint64_t;  // (first id << 32) | second id
Pair make_pair_key(uint32_t a, uint32_t b) {
    return (uint64_t(a) << 32) | b;
}

struct Word {
    std::vector<uint32_t> ids;
    int64_t count = 0;
};

}  // namespace

BpeTrainResult train_bpe(const std::vector<std::string>& texts, int64_t vocab_size,
                         const std::string& out_dir) {
    ZG_CHECK(vocab_size >= 257, "vocab_size must be at least 257 (256 bytes + <|endoftext|>)");
    // 1. distinct pieces and their counts
    Gpt2PreTokenizer pre;
    std::unordered_map<std::string, int64_t> piece_count;
    for (const std::string& t : texts)
        pre.split(t, 0, t.size(),
                  [&](std::string_view piece, bool) { piece_count[std::string(piece)]++; });
    std::vector<Word> words;
    words.reserve(piece_count.size());
    for (const auto& [piece, count] : piece_count) {
        Word w;
        for (unsigned char c : piece) w.ids.push_back(c);
        w.count = count;
        words.push_back(std::move(w));
    }
    // 2. pair counts, where each pair occurs, and a max-heap of (count, pair) with lazy updates
    std::unordered_map<Pair, int64_t> pair_count;
    std::unordered_map<Pair, std::unordered_set<uint32_t>> where;
    for (uint32_t wi = 0; wi < words.size(); wi++)
        for (size_t k = 0; k + 1 < words[wi].ids.size(); k++) {
            const Pair p = make_pair_key(words[wi].ids[k], words[wi].ids[k + 1]);
            pair_count[p] += words[wi].count;
            where[p].insert(wi);
        }
    auto cmp = [](const std::pair<int64_t, Pair>& x, const std::pair<int64_t, Pair>& y) {
        return x.first < y.first || (x.first == y.first && x.second > y.second);
    };
    std::priority_queue<std::pair<int64_t, Pair>, std::vector<std::pair<int64_t, Pair>>,
                        decltype(cmp)>
        heap(cmp);
    for (const auto& [p, c] : pair_count) heap.push({c, p});

    std::vector<std::string> bytes_of;  // token id -> bytes
    std::unordered_map<std::string, uint32_t> id_of;
    for (int b = 0; b < 256; b++) {
        bytes_of.push_back(std::string(1, char(b)));
        id_of[bytes_of.back()] = uint32_t(b);
    }
    std::vector<std::pair<uint32_t, uint32_t>> merges;
    auto add = [&](Pair p, int64_t delta, uint32_t wi) {
        int64_t& c = pair_count[p];
        c += delta;
        if (delta > 0) where[p].insert(wi);
        if (c > 0) heap.push({c, p});
    };
    // 3. merge until the vocabulary (with <|endoftext|>) is full or nothing repeats
    while (int64_t(bytes_of.size()) + 1 < vocab_size && !heap.empty()) {
        const auto [count, best] = heap.top();
        heap.pop();
        auto it = pair_count.find(best);
        if (it == pair_count.end() || it->second != count) continue;  // stale entry
        if (count < 2) break;
        const uint32_t a = uint32_t(best >> 32), b = uint32_t(best & 0xffffffffu);
        const std::string merged = bytes_of[a] + bytes_of[b];
        uint32_t id;
        if (auto e = id_of.find(merged); e != id_of.end()) {
            id = e->second;  // the same bytes reached by another merge path
        } else {
            id = uint32_t(bytes_of.size());
            bytes_of.push_back(merged);
            id_of[merged] = id;
        }
        merges.emplace_back(a, b);
        const std::unordered_set<uint32_t> affected = std::move(where[best]);
        where.erase(best);
        pair_count.erase(best);
        for (uint32_t wi : affected) {
            // The word's pairs out, the merge applied, its new pairs in: simple and exact, and
            // words are short.
            Word& w = words[wi];
            for (size_t k = 0; k + 1 < w.ids.size(); k++) {
                const Pair p = make_pair_key(w.ids[k], w.ids[k + 1]);
                if (p != best) add(p, -w.count, wi);
            }
            std::vector<uint32_t> out;
            for (size_t k = 0; k < w.ids.size(); k++) {
                if (k + 1 < w.ids.size() && w.ids[k] == a && w.ids[k + 1] == b) {
                    out.push_back(id);
                    k++;
                } else {
                    out.push_back(w.ids[k]);
                }
            }
            w.ids.swap(out);
            for (size_t k = 0; k + 1 < w.ids.size(); k++)
                add(make_pair_key(w.ids[k], w.ids[k + 1]), w.count, wi);
        }
    }
    // 4. write GPT-2's format: byte-level strings, merges in order, <|endoftext|> last
    const std::vector<uint32_t> cp = gpt2_byte_to_code_point();
    auto printable = [&](const std::string& bytes) {
        std::string s;
        for (unsigned char c : bytes) utf8_append(s, cp[c]);
        return s;
    };
    nlohmann::json enc = nlohmann::json::object();
    for (uint32_t i = 0; i < bytes_of.size(); i++) enc[printable(bytes_of[i])] = i;
    enc["<|endoftext|>"] = bytes_of.size();
    std::filesystem::create_directories(out_dir);
    std::ofstream(out_dir + "/encoder.json") << enc.dump() << "\n";
    std::ofstream m(out_dir + "/vocab.bpe");
    m << "#version: 0.2\n";
    for (const auto& [x, y] : merges)
        m << printable(bytes_of[x]) << ' ' << printable(bytes_of[y]) << "\n";
    ZG_CHECK(m.good(), "failed writing " + out_dir + "/vocab.bpe");
    return {int64_t(bytes_of.size()) + 1, int64_t(merges.size())};
}

}  // namespace zgpt
