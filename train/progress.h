// The one-line progress display: step, loss, tokens/s and ETA. On a terminal it redraws one line;
// otherwise (logs, CI) it prints a line every log_every steps.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

namespace zgpt {

struct ProgressInfo {
    int64_t step = 0, max_steps = 0;
    int64_t steps_done = 0;  // in this process (a resumed run starts past 0): paces the ETA
    double loss = 0, ce = 0, z_loss = 0, lr = 0, grad_norm = 0, tok_per_s = 0, elapsed_s = 0;
    double mfu = -1;  // < 0: unknown (not shown)
};

// Tokens/s over the last `window` steps, from the steps' own times: what the run trains at now.
// The evaluations and checkpoints between steps, and the first step's warm-up, leave it once they
// are out of the window (the ETA uses the whole run's pace instead).
class RecentRate {
  public:
    explicit RecentRate(int64_t window);
    void add(double seconds, int64_t tokens);
    double tokens_per_s() const;  // 0 before the first step

  private:
    std::deque<std::pair<double, int64_t>> steps_;  // (seconds, tokens), the newest last
    size_t window_;
};

std::string format_duration(double seconds);  // "3m12s"
std::string format_progress(const ProgressInfo& p);

class Progress {
  public:
    explicit Progress(int64_t log_every);
    void update(const ProgressInfo& p);
    void message(const std::string& line);  // a line of its own (validation, notices)
    void finish();

  private:
    int64_t log_every_;
    bool tty_;
    bool pending_ = false;  // a redrawn line is on screen without its newline
};

}  // namespace zgpt
