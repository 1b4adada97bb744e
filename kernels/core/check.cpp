#include "kernels/core/check.h"

namespace zgpt {

void fail_check(const char* expr, const char* file, int line, const std::string& msg) {
    throw Error(msg + " [check `" + expr + "` failed at " + file + ":" + std::to_string(line) +
                "]");
}

}  // namespace zgpt
