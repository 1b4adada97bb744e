// The kernels' choices made by timing (kernels.matmul_search: the GEMM algorithm of each shape),
// kept for the runs of one runs folder in <train.out_dir>/gemm_choices.txt, so that two runs of a
// config run the same algorithms. The text is Backend::timed_choices()'s: a first line naming
// cuBLASLt's version and the GPU, then one line per shape ending in the candidate's index.
#pragma once
#include <string>

#include "train/config.h"
#include "train/dist/comm.h"

namespace zgpt {

std::string timed_choices_path(const TrainConfig& t);

// The file's text; empty when there is none or it cannot be read (the choices are timed again).
std::string read_timed_choices(const std::string& path);

// mine, with the lines of `other` whose shapes mine lacks; mine alone when the first lines (the
// library and GPU) differ. Lines come out sorted by shape.
std::string merge_timed_choices(const std::string& mine, const std::string& other);

// Every rank's choices merged, the same text on every rank (collective): for each shape the line
// of the lowest rank that ran it (rank 0's for a shape all ran; a vocab-parallel shard of another
// size than rank 0's runs shapes of its own). With rank 0's text alone, such a rank would time its
// own shapes again on resume, and might choose otherwise. A rank whose text is for another GPU or
// cuBLASLt (its first line) is left out, and rank 0 says so.
std::string all_ranks_choices(Communicator& comm, const std::string& mine);

}  // namespace zgpt
