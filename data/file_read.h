// Every file a tool reads that a user names (configs, sweep files, tokenizer files, encoder.json
// and vocab.bpe, safetensors, checkpoints, token shards) is opened here first. A FIFO would block
// the read until a writer comes, a device (/dev/zero) never ends, a directory reads as nothing,
// and a file far larger than any of its kind (a sparse file) would be read whole before anything
// could be said about it: each is refused at once, with an error that names the file.
#pragma once
#include <cstdint>
#include <string>

namespace zgpt {

// Far beyond any real config, sweep file, tokenizer file or JSON beside a run, and small enough
// to read into memory.
constexpr uint64_t kSmallFileMax = uint64_t(256) << 20;

// Opens path read-only without blocking and checks that it is a regular file of at most
// max_bytes; returns the descriptor (the caller closes it) and the file's size in *bytes. Throws
// zgpt::Error "<what> <path> refused: ..." otherwise.
int open_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                      uint64_t* bytes);

// The whole of a regular file of at most max_bytes (open_regular_file's checks).
std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes = kSmallFileMax);

}  // namespace zgpt
