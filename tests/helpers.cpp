#include "tests/helpers.h"

#include <cstdlib>

namespace zgpt::test {

namespace {
std::string& reason_storage() {
    static std::string r;
    return r;
}
}  // namespace

void skip_binary(const std::string& reason) {
    if (reason_storage().empty()) reason_storage() = reason;
}
std::string skip_reason() {
    return reason_storage();
}

std::vector<double> numeric_gradient(const std::function<double()>& f, std::vector<double>& x,
                                     double h) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double old = x[i];
        x[i] = old + h;
        const double fp = f();
        x[i] = old - h;
        const double fm = f();
        x[i] = old;
        g[i] = (fp - fm) / (2 * h);
    }
    return g;
}

std::string oracle_dir() {
    if (const char* e = std::getenv("ZGPT_ORACLES"); e && *e) return e;
    return std::string(ZGPT_SOURCE_DIR) + "/../shared/data/oracles";
}

}  // namespace zgpt::test
