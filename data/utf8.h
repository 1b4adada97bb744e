// UTF-8 to code points and back, for the tokenizers and the BPE trainer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zgpt {

// Decodes UTF-8; throws naming the byte offset of an invalid sequence.
std::vector<uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, uint32_t code_point);

}  // namespace zgpt
