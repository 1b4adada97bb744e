// The training loop: wires the model, loaders, optimizer, schedule, metrics and progress display.
#pragma once
#include <string>

#include "train/config.h"

namespace zgpt {

struct TrainResult {
    std::string run_dir;
    int64_t steps = 0;
    double train_loss = 0;              // last step's loss
    double val_loss = -1, val_ce = -1;  // last evaluation; -1 when there was none
    double seconds = 0;
    bool diverged = false;  // stopped at a non-finite loss or gradient norm
};

// Fills model.vocab_size from tokenizer.json beside the training shards when it is 0.
void resolve_vocab_size(Config& c);

TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line);

}  // namespace zgpt
