#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/helpers.h"

int main(int argc, char** argv) {
    if (const std::string reason = zgpt::test::skip_reason(); !reason.empty()) {
        std::printf("SKIPPED: %s\n", reason.c_str());
        return 77;  // ctest: SKIP_RETURN_CODE
    }
    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    return ctx.run();
}
