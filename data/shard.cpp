#include "data/shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "data/file_read.h"
#include "kernels/core/check.h"

namespace zgpt {

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens) {
    const uint32_t max_id = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
    const int version = max_id < 65536 ? 1 : 2;
    int32_t header[kShardHeaderInts] = {};
    header[0] = kShardMagic;
    header[1] = version;
    header[2] = int32_t(tokens.size());
    ZG_CHECK(tokens.size() <= size_t(INT32_MAX), path + ": too many tokens for one shard");
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    ZG_CHECK(f, "cannot open " + tmp + " for writing: " + std::strerror(errno));
    bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
    if (version == 1) {
        std::vector<uint16_t> t16(tokens.begin(), tokens.end());
        ok = ok && std::fwrite(t16.data(), 2, t16.size(), f) == t16.size();
    } else {
        ok = ok && std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size();
    }
    ok = (std::fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (std::fclose(f) == 0) && ok;
    ZG_CHECK(ok, "failed writing " + tmp);
    ZG_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename " + tmp + " to " + path);
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
    const size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
    // at most INT32_MAX tokens of 4 bytes
    uint64_t size = 0;
    const int fd =
        open_regular_file(path, "token shard", header_bytes + 4 * uint64_t(INT32_MAX), &size);
    const size_t bytes = size_t(size);
    if (bytes < header_bytes) {
        ::close(fd);
        throw Error(path + ": not a token shard (" + std::to_string(bytes) +
                    " bytes, shorter than the 1024-byte header)");
    }
    map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    ZG_CHECK(map_ != MAP_FAILED, "cannot map " + path);
    map_bytes_ = bytes;
    const int32_t* h = static_cast<const int32_t*>(map_);
    auto fail = [&](const std::string& msg) {
        ::munmap(map_, map_bytes_);
        map_ = nullptr;
        throw Error(path + ": " + msg);
    };
    if (h[0] != kShardMagic)
        fail("bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(kShardMagic) +
             "): not a token shard");
    if (h[1] != 1 && h[1] != 2)
        fail("unsupported version " + std::to_string(h[1]) + " (expected 1: uint16, 2: uint32)");
    version_ = h[1];
    n_tokens_ = h[2];
    const size_t expect = header_bytes + size_t(n_tokens_) * (version_ == 1 ? 2 : 4);
    if (n_tokens_ < 0 || bytes != expect)
        fail("size " + std::to_string(bytes) + " bytes, but the header promises " +
             std::to_string(n_tokens_) + " tokens (" + std::to_string(expect) +
             " bytes): truncated or corrupt");
    body_ = static_cast<const unsigned char*>(map_) + header_bytes;
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      body_(o.body_),
      version_(o.version_),
      n_tokens_(o.n_tokens_) {
    o.map_ = nullptr;
}

TokenShard::~TokenShard() {
    if (map_) ::munmap(map_, map_bytes_);
}

void TokenShard::check_vocab(int64_t vocab_size) const {
    for (int64_t i = 0; i < n_tokens_; i++)
        if ((*this)[i] >= uint64_t(vocab_size))
            throw Error(path_ + ": token " + std::to_string((*this)[i]) + " at position " +
                        std::to_string(i) + " is >= vocab_size " + std::to_string(vocab_size));
}

std::vector<std::string> glob_paths(const std::string& pattern) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> out;
    if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    ZG_CHECK(!out.empty(), "no files match '" + pattern + "'");
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace zgpt
