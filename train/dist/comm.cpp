// What every communicator shares: element sizes, the rank-order add, and ZeRO-1's arena slices.
#include "train/dist/comm.h"

#include "kernels/core/check.h"

#include <algorithm>
#include <cstring>

namespace zgpt {

size_t comm_type_size(CommType t) {
    return t == CommType::b16 ? 2 : t == CommType::f32 ? 4 : 8;
}

void comm_add(void* acc, const void* x, int64_t n, CommType t) {
    auto run = [&](auto tag) {
        using T = decltype(tag);
        T* a = static_cast<T*>(acc);
        const T* b = static_cast<const T*>(x);
        for (int64_t i = 0; i < n; i++) a[i] += b[i];
    };
    switch (t) {
        case CommType::f32:
            return run(float{});
        case CommType::f64:
            return run(double{});
        case CommType::i64:
            return run(int64_t{});
        case CommType::b16:
            break;
    }
    throw Error("a sum over the ranks does not take 16-bit words");
}

ArenaSlice arena_slice(int64_t n, int ranks, int rank) {
    const int64_t S = (n + ranks - 1) / ranks;
    ArenaSlice s;
    s.lo = std::min(n, S * rank);
    s.hi = std::min(n, s.lo + S);
    return s;
}

std::vector<float> all_gather_slices(Communicator& c, const float* mine, int64_t n) {
    const int64_t R = c.size(), S = (n + R - 1) / R;
    const ArenaSlice own = arena_slice(n, c.size(), c.rank());
    std::vector<float> send(S, 0.0f), all(S * R);  // equal blocks: the last ones padded
    std::copy(mine, mine + (own.hi - own.lo), send.begin());
    c.all_gather(send.data(), all.data(), S, CommType::f32);
    all.resize(n);
    return all;
}

std::string broadcast_text(Communicator& c, const std::string& text, int root) {
    int64_t n = int64_t(text.size());
    c.broadcast(&n, 1, CommType::i64, root);
    std::vector<int64_t> words(size_t((n + 7) / 8));  // whole 8-byte words
    // (an empty text has no words: memcpy with the null pointer of an empty vector is undefined)
    if (c.rank() == root && !text.empty()) std::memcpy(words.data(), text.data(), text.size());
    if (!words.empty()) c.broadcast(words.data(), int64_t(words.size()), CommType::i64, root);
    return std::string(reinterpret_cast<const char*>(words.data()), size_t(n));
}

std::vector<std::string> gather_texts(Communicator& c, const std::string& text) {
    std::vector<std::string> all;
    for (int r = 0; r < c.size(); r++) {
        std::string theirs = broadcast_text(c, text, r);  // every rank takes part
        if (c.rank() == 0) all.push_back(std::move(theirs));
    }
    return all;
}

}  // namespace zgpt
