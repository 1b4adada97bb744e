#include "data/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/file_read.h"
#include "data/gpt2_bpe.h"
#include "data/utf8.h"
#include "kernels/core/check.h"

namespace zgpt {

Tokenizer Tokenizer::byte_level() {
    Tokenizer t;
    t.type_ = "byte";
    return t;
}

Tokenizer Tokenizer::gpt2(const std::string& dir) {
    Tokenizer t;
    t.type_ = "gpt2";
    t.bpe_dir_ = dir;
    t.bpe_ = Gpt2Bpe::load(dir + "/encoder.json", dir + "/vocab.bpe");
    return t;
}

int64_t Tokenizer::document_separator() const {
    return bpe_ ? int64_t(bpe_->end_of_text()) : -1;
}

std::vector<uint32_t> Tokenizer::default_prompt() const {
    if (document_separator() >= 0) return {uint32_t(document_separator())};
    try {
        return encode("\n");
    } catch (const Error&) {  // no newline in a char vocabulary
        return {0};
    }
}

static void index_chars(std::vector<uint32_t>& chars, std::vector<int32_t>& id_of) {
    id_of.assign(chars.empty() ? 0 : chars.back() + 1, -1);
    for (size_t i = 0; i < chars.size(); i++) id_of[chars[i]] = int32_t(i);
}

Tokenizer Tokenizer::char_level_from_text(std::string_view text) {
    Tokenizer t;
    t.type_ = "char";
    std::vector<bool> seen(0x110000, false);
    for (uint32_t cp : utf8_decode(text)) seen[cp] = true;
    for (uint32_t cp = 0; cp < seen.size(); cp++)
        if (seen[cp]) t.chars_.push_back(cp);
    index_chars(t.chars_, t.id_of_char_);
    return t;
}

int64_t Tokenizer::vocab_size() const {
    if (bpe_) return bpe_->vocab_size();
    return type_ == "byte" ? 256 : int64_t(chars_.size());
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
    if (bpe_) return bpe_->encode_parallel(text);
    if (type_ == "byte") {
        const auto* p = reinterpret_cast<const unsigned char*>(text.data());
        return std::vector<uint32_t>(p, p + text.size());
    }
    std::vector<uint32_t> ids = utf8_decode(text);
    for (size_t i = 0; i < ids.size(); i++) {
        const uint32_t cp = ids[i];
        const int32_t id = cp < id_of_char_.size() ? id_of_char_[cp] : -1;
        if (id < 0) {
            std::string ch;
            utf8_append(ch, cp);
            char code[16];
            std::snprintf(code, sizeof code, "U+%04X", unsigned(cp));
            throw Error("character '" + ch + "' (" + code + ") is not in the char vocabulary");
        }
        ids[i] = uint32_t(id);
    }
    return ids;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
    if (bpe_) return bpe_->decode(ids);
    std::string out;
    for (uint32_t id : ids) {
        ZG_CHECK(id < uint64_t(vocab_size()), "token id " + std::to_string(id) + " out of range");
        if (type_ == "byte")
            out += char(id);
        else
            utf8_append(out, chars_[id]);
    }
    return out;
}

void Tokenizer::save(const std::string& path) const {
    nlohmann::json j;
    j["type"] = type_;
    j["vocab_size"] = vocab_size();
    if (type_ == "gpt2") {
        namespace fs = std::filesystem;
        const fs::path to = fs::path(path).parent_path();
        for (const char* f : {"encoder.json", "vocab.bpe"})
            if (!fs::exists(to / f) || !fs::equivalent(fs::path(bpe_dir_) / f, to / f))
                fs::copy_file(fs::path(bpe_dir_) / f, to / f, fs::copy_options::overwrite_existing);
        j["encoder"] = "encoder.json";
        j["merges"] = "vocab.bpe";
        j["document_separator"] = "<|endoftext|>";
    }
    if (type_ == "char") {
        std::vector<std::string> chars;
        for (uint32_t cp : chars_) {
            std::string s;
            utf8_append(s, cp);
            chars.push_back(s);
        }
        j["chars"] = chars;
    }
    std::ofstream f(path);
    ZG_CHECK(f.good(), "cannot write " + path);
    f << j.dump(1) << "\n";
    ZG_CHECK(f.good(), "failed writing " + path);
}

Tokenizer Tokenizer::load(const std::string& path) {
    const std::string text = read_regular_file(path, "tokenizer file");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
        throw Error(path + ": not valid JSON: " + e.what());
    }
    // Every other defect (a field missing or of the wrong type, a bad entry) names the file too.
    try {
        ZG_CHECK(j.is_object(), "not a JSON object");
        ZG_CHECK(j.contains("type") && j["type"].is_string(), "needs \"type\": char, byte or gpt2");
        Tokenizer t;
        t.type_ = j["type"].get<std::string>();
        if (t.type_ == "char") {
            ZG_CHECK(j.contains("chars") && j["chars"].is_array(), "needs \"chars\": a list");
            for (const auto& s : j["chars"]) {
                ZG_CHECK(s.is_string(), "each entry of chars must be a string");
                const auto cps = utf8_decode(s.get<std::string>());
                ZG_CHECK(cps.size() == 1, "each entry of chars must be one character");
                // sorted and distinct: a repeated character would give two ids one meaning
                ZG_CHECK(t.chars_.empty() || t.chars_.back() < cps[0],
                         "chars must be sorted, each character once");
                t.chars_.push_back(cps[0]);
            }
            ZG_CHECK(!t.chars_.empty(), "chars is empty");
            index_chars(t.chars_, t.id_of_char_);
        } else if (t.type_ == "gpt2") {
            return gpt2(std::filesystem::path(path).parent_path().string());
        } else {
            ZG_CHECK(t.type_ == "byte", "unknown tokenizer type '" + t.type_ + "'");
        }
        return t;
    } catch (const std::exception& e) {
        throw Error(path + ": " + e.what());
    }
}

}  // namespace zgpt
