// One error family for the whole project: every failed check throws zgpt::Error with file:line and
// a message that says what was expected. Callers (tests, the CLI) decide whether to exit.
#pragma once
#include <stdexcept>
#include <string>

namespace zgpt {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace zgpt

#define ZG_CHECK(cond, msg)                                                           \
    do {                                                                              \
        if (!(cond)) ::zgpt::fail_check(#cond, __FILE__, __LINE__, std::string(msg)); \
    } while (0)
