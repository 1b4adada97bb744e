#include "data/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <omp.h>
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/file_read.h"
#include "data/utf8.h"
#include "kernels/core/check.h"

namespace zgpt {

namespace {

// GPT-2's pre-tokenizer (contractions, letters, numbers, other symbols, whitespace runs).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

std::vector<uint32_t> gpt2_byte_to_code_point() {
    std::vector<uint32_t> cp(256, 0);
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; b++) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) cp[b] = printable[b] ? uint32_t(b) : next++;
    return cp;
}

namespace {

std::string pair_key(std::string_view a, std::string_view b) {
    std::string k;
    k.reserve(1 + a.size() + b.size());
    k.push_back(char(a.size()));  // the length keeps (a, b) unambiguous
    k.append(a);
    k.append(b);
    return k;
}

// Length of the valid UTF-8 sequence at p[0..n), or 0 when it is invalid.
size_t utf8_length(const unsigned char* p, size_t n) {
    const unsigned c = p[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] >> 6) != 2) return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

}  // namespace

struct Gpt2PreTokenizer::Regex {
    pcre2_code* code = nullptr;
    ~Regex() {
        if (code) pcre2_code_free(code);
    }
};

Gpt2PreTokenizer::Gpt2PreTokenizer() : regex_(std::make_unique<Regex>()) {
    int err = 0;
    PCRE2_SIZE off = 0;
    regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    ZG_CHECK(regex_->code, "cannot compile the GPT-2 pre-tokenizer regex");
    pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;

void* Gpt2PreTokenizer::new_match_data() const {
    return pcre2_match_data_create_from_pattern(regex_->code, nullptr);
}

void Gpt2PreTokenizer::free_match_data(void* md) {
    pcre2_match_data_free(static_cast<pcre2_match_data*>(md));
}

size_t Gpt2PreTokenizer::valid_utf8_length(const unsigned char* p, size_t n) {
    return utf8_length(p, n);
}

size_t Gpt2PreTokenizer::next_piece(const unsigned char* p, size_t pos, size_t run_end,
                                    size_t subject_end, void* md) const {
    auto* m = static_cast<pcre2_match_data*>(md);
    const int rc = pcre2_match(regex_->code, p, subject_end, pos, PCRE2_NO_UTF_CHECK, m, nullptr);
    ZG_CHECK(rc > 0, "GPT-2 pre-tokenizer failed to match");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m);
    ZG_CHECK(ov[0] == pos && ov[1] <= run_end,
             "GPT-2 pre-tokenizer: a piece crossed a split point");
    return ov[1];
}

Gpt2Bpe::~Gpt2Bpe() = default;

std::shared_ptr<const Gpt2Bpe> Gpt2Bpe::load(const std::string& encoder_json,
                                             const std::string& vocab_bpe) {
    std::shared_ptr<Gpt2Bpe> t(new Gpt2Bpe());
    // code point -> byte, to turn GPT-2's printable token strings back into raw bytes
    const std::vector<uint32_t> cp_of = gpt2_byte_to_code_point();
    std::unordered_map<uint32_t, unsigned char> byte_of;
    for (int b = 0; b < 256; b++) byte_of[cp_of[b]] = (unsigned char)b;
    auto to_bytes = [&](const std::string& s, const std::string& file) {
        std::string out;
        for (uint32_t cp : utf8_decode(s)) {
            auto it = byte_of.find(cp);
            ZG_CHECK(it != byte_of.end(), file + ": token '" + s + "' is not byte-level");
            out.push_back(char(it->second));
        }
        return out;
    };
    nlohmann::json enc;
    try {
        enc = nlohmann::json::parse(read_regular_file(encoder_json, "GPT-2 encoder file"));
    } catch (const nlohmann::json::exception& e) {
        throw Error(encoder_json + ": not valid JSON: " + e.what());
    }
    ZG_CHECK(enc.is_object() && !enc.empty(), encoder_json + ": expected a token -> id object");
    t->bytes_of_.resize(enc.size());
    std::vector<const std::string*> token_of(enc.size(), nullptr);  // each id given once
    for (auto it = enc.begin(); it != enc.end(); ++it) {
        // an integer id below the token count: get<uint32_t> would wrap 2^40 and truncate 3.5
        ZG_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                     it.value().get<int64_t>() < int64_t(enc.size()),
                 encoder_json + ": token '" + it.key() + "' has id " + it.value().dump() +
                     ", not an integer from 0 to " + std::to_string(enc.size() - 1));
        const uint32_t id = it.value().get<uint32_t>();
        ZG_CHECK(!token_of[id], encoder_json + ": id " + std::to_string(id) +
                                    " is given to two tokens, '" + *token_of[id] + "' and '" +
                                    it.key() + "'");
        token_of[id] = &it.key();
        if (it.key() == "<|endoftext|>") {
            t->eot_ = id;
            t->bytes_of_[id] = it.key();  // decodes to its text
            continue;
        }
        const std::string b = to_bytes(it.key(), encoder_json);
        t->bytes_of_[id] = b;
        t->id_of_[b] = id;
    }
    for (int b = 0; b < 256; b++) {
        auto it = t->id_of_.find(std::string(1, char(b)));
        ZG_CHECK(it != t->id_of_.end(), encoder_json + ": no token for byte " + std::to_string(b));
        t->byte_id_[b] = it->second;
    }
    std::istringstream merges(read_regular_file(vocab_bpe, "GPT-2 merges file"));
    std::string line;
    int rank = 0;
    while (std::getline(merges, line)) {
        if (line.empty() || line.rfind("#version", 0) == 0) continue;
        const auto sp = line.find(' ');
        ZG_CHECK(sp != std::string::npos, vocab_bpe + ": malformed merge line '" + line + "'");
        t->rank_[pair_key(to_bytes(line.substr(0, sp), vocab_bpe),
                          to_bytes(line.substr(sp + 1), vocab_bpe))] = rank++;
    }
    ZG_CHECK(rank > 0, vocab_bpe + ": no merges");
    return t;
}

void Gpt2Bpe::encode_piece(std::string_view piece, std::vector<uint32_t>& out,
                           std::unordered_map<std::string, std::vector<uint32_t>>& cache) const {
    if (piece.size() == 1) {
        out.push_back(byte_id_[(unsigned char)piece[0]]);
        return;
    }
    const std::string key(piece);
    if (auto it = cache.find(key); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
    }
    // Merge the lowest-ranked adjacent pair until no pair has a rank.
    std::vector<std::string_view> parts;
    for (size_t i = 0; i < piece.size(); i++) parts.push_back(piece.substr(i, 1));
    while (parts.size() > 1) {
        int best = INT_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < parts.size(); i++) {
            auto it = rank_.find(pair_key(parts[i], parts[i + 1]));
            if (it != rank_.end() && it->second < best) {
                best = it->second;
                at = i;
            }
        }
        if (best == INT_MAX) break;
        // merge every occurrence of that pair, left to right
        const std::string_view a = parts[at], b = parts[at + 1];
        std::vector<std::string_view> merged;
        for (size_t i = 0; i < parts.size(); i++) {
            if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
                merged.push_back(std::string_view(parts[i].data(), a.size() + b.size()));
                i++;
            } else {
                merged.push_back(parts[i]);
            }
        }
        parts.swap(merged);
    }
    std::vector<uint32_t> ids;
    for (std::string_view p : parts) {
        auto it = id_of_.find(std::string(p));
        ZG_CHECK(it != id_of_.end(), "GPT-2 BPE: merged piece has no token (inconsistent vocab)");
        ids.push_back(it->second);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    cache.emplace(key, std::move(ids));
}

void Gpt2Bpe::encode_into(std::string_view text, size_t begin, size_t end,
                          std::vector<uint32_t>& out,
                          std::unordered_map<std::string, std::vector<uint32_t>>& cache) const {
    pre_.split(text, begin, end, [&](std::string_view piece, bool invalid_byte) {
        if (invalid_byte)
            out.push_back(byte_id_[(unsigned char)piece[0]]);  // its own byte token
        else
            encode_piece(piece, out, cache);
    });
}

std::vector<uint32_t> Gpt2Bpe::encode(std::string_view text) const {
    std::vector<uint32_t> out;
    std::unordered_map<std::string, std::vector<uint32_t>> cache;
    encode_into(text, 0, text.size(), out, cache);
    return out;
}

std::vector<uint32_t> Gpt2Bpe::encode_parallel(std::string_view text) const {
    // Split points: just after a '\n' whose next byte is not whitespace. No pre-tokenizer piece
    // crosses such a point, so the pieces (and the ids) are those of the whole text.
    constexpr size_t kTarget = size_t(1) << 20;
    std::vector<size_t> cuts = {0};
    for (size_t at = kTarget; at < text.size(); at += kTarget) {
        size_t k = std::max(at, cuts.back() + 1);
        while (k < text.size() && !(text[k - 1] == '\n' && !std::isspace((unsigned char)text[k])))
            k++;
        if (k >= text.size()) break;
        cuts.push_back(k);
    }
    cuts.push_back(text.size());
    const int64_t n = int64_t(cuts.size()) - 1;
    std::vector<std::vector<uint32_t>> parts(n);
#pragma omp parallel
    {
        std::unordered_map<std::string, std::vector<uint32_t>> cache;  // one per thread
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < n; c++) encode_into(text, cuts[c], cuts[c + 1], parts[c], cache);
    }
    std::vector<uint32_t> out;
    size_t total = 0;
    for (const auto& v : parts) total += v.size();
    out.reserve(total);
    for (const auto& v : parts) out.insert(out.end(), v.begin(), v.end());
    return out;
}

std::string Gpt2Bpe::decode(const std::vector<uint32_t>& ids) const {
    std::string s;
    for (uint32_t id : ids) {
        ZG_CHECK(id < bytes_of_.size(),
                 "GPT-2 BPE: token id " + std::to_string(id) + " out of range");
        s += bytes_of_[id];
    }
    return s;
}

}  // namespace zgpt
