#include "train/progress.h"

#include <algorithm>

#include <unistd.h>

#include <cstdio>

namespace zgpt {

std::string format_duration(double s) {
    if (!(s >= 0) || s > 1e8) return "?";
    const int64_t t = int64_t(s + 0.5);
    char buf[32];
    if (t >= 3600)
        std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600),
                      (long long)(t % 3600 / 60));
    else if (t >= 60)
        std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
    else
        std::snprintf(buf, sizeof buf, "%llds", (long long)t);
    return buf;
}

RecentRate::RecentRate(int64_t window) : window_(size_t(std::max<int64_t>(window, 1))) {}

void RecentRate::add(double seconds, int64_t tokens) {
    steps_.emplace_back(seconds, tokens);
    if (steps_.size() > window_) steps_.pop_front();
}

double RecentRate::tokens_per_s() const {
    double seconds = 0, tokens = 0;
    for (const auto& [s, n] : steps_) {
        seconds += s;
        tokens += double(n);
    }
    return seconds > 0 ? tokens / seconds : 0.0;
}

std::string format_progress(const ProgressInfo& p) {
    const double eta =
        p.steps_done > 0 ? p.elapsed_s / double(p.steps_done) * double(p.max_steps - p.step) : -1;
    char mfu[32] = "";
    if (p.mfu >= 0) std::snprintf(mfu, sizeof mfu, " | mfu %.1f%%", 100.0 * p.mfu);
    char buf[288];
    std::snprintf(buf, sizeof buf,
                  "step %lld/%lld | loss %.4f (ce %.4f z %.2e) | lr %.2e | |g| %.3f | %.0f tok/s%s "
                  "| eta %s",
                  (long long)p.step, (long long)p.max_steps, p.loss, p.ce, p.z_loss, p.lr,
                  p.grad_norm, p.tok_per_s, mfu, format_duration(eta).c_str());
    return buf;
}

Progress::Progress(int64_t log_every) : log_every_(log_every), tty_(isatty(fileno(stdout))) {}

void Progress::update(const ProgressInfo& p) {
    const std::string line = format_progress(p);
    if (tty_) {
        std::printf("\r\033[K%s", line.c_str());
        pending_ = true;
    } else if (p.step % log_every_ == 0 || p.step == p.max_steps || p.step == 1) {
        std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
}

void Progress::message(const std::string& line) {
    if (pending_) std::printf("\n");
    pending_ = false;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

void Progress::finish() {
    if (pending_) std::printf("\n");
    pending_ = false;
    std::fflush(stdout);
}

}  // namespace zgpt
