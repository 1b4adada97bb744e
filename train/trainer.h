// The training loop: wires the model, loaders, optimizer, schedule, metrics and progress display.
#pragma once
#include <string>

#include "data/loader.h"
#include "train/config.h"
#include "train/dist/comm.h"

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

// The training loader's options of `rank` of `world_size` ranks: what the trainer reads, batch
// by batch (tools/dev/parity_inputs.cpp dumps the same batches for the PyTorch parity check).
LoaderOptions train_loader_options(const Config& cfg, int rank, int world_size);

// One run. With parallel.local_ranks > 1, that many ranks as threads of this process.
TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line);

// This process's rank of a run over `world` (every rank calls it with the same config). Rank 0
// writes the run directory, metrics and checkpoints and returns the run's result.
TrainResult train(Config cfg, const std::string& config_path, const std::string& command_line,
                  Communicator& world);

// parallel.local_ranks ranks as threads over the local communicator; rank 0's result. A rank that
// throws stops the others (their collectives throw) and the first failure is rethrown.
TrainResult train_local_ranks(const Config& cfg, const std::string& config_path,
                              const std::string& command_line);

}  // namespace zgpt
