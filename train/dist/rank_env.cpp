// The rank environment (train/dist/rank_env.h).
#include "train/dist/rank_env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "kernels/core/check.h"

namespace zgpt {

namespace {

// A decimal integer in [lo, hi], or zgpt::Error naming the variable.
int env_int(const char* name, const std::string& value, long lo, long hi, const char* want) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(value.c_str(), &end, 10);
    ZG_CHECK(!value.empty() && end && *end == '\0' && errno == 0,
             std::string("environment: ") + name + "='" + value + "' is not an integer");
    ZG_CHECK(v >= lo && v <= hi,
             std::string("environment: ") + name + "=" + value + " is out of range (" + want + ")");
    return int(v);
}

}  // namespace

RankEnv parse_rank_env(const std::function<const char*(const char*)>& getenv) {
    // Unset and empty are the same: scripts often export an empty variable.
    auto get = [&](const char* name) {
        const char* v = getenv(name);
        return std::string(v ? v : "");
    };
    RankEnv e;
    const char *rank_var = "RANK", *world_var = "WORLD_SIZE", *local_var = "LOCAL_RANK";
    if (!get("RANK").empty() || !get("WORLD_SIZE").empty()) {
        e.source = "torchrun";
    } else if (!get("SLURM_PROCID").empty() && !get("SLURM_NTASKS").empty()) {
        e.source = "slurm";
        rank_var = "SLURM_PROCID";
        world_var = "SLURM_NTASKS";
        local_var = "SLURM_LOCALID";
    } else {
        return e;
    }
    const std::string rank = get(rank_var), world = get(world_var), local = get(local_var);
    ZG_CHECK(!rank.empty(), std::string("environment: ") + world_var + " is set but " + rank_var +
                                " is not (set both, or neither for a single-process run)");
    ZG_CHECK(!world.empty(), std::string("environment: ") + rank_var + " is set but " + world_var +
                                 " is not (set both, or neither for a single-process run)");
    e.world_size = env_int(world_var, world, 1, 1 << 20, "at least 1");
    e.rank = env_int(rank_var, rank, 0, 1 << 20, "0 or more");
    ZG_CHECK(e.rank < e.world_size, std::string("environment: ") + rank_var + "=" + rank +
                                        " is not below " + world_var + "=" + world);
    e.local_rank = local.empty() ? e.rank
                                 : env_int(local_var, local, 0, e.world_size - 1,
                                           ("0.." + std::to_string(e.world_size - 1)).c_str());
    // The node count: what a link-dependent default (parallel.grad_bucket_mb) is chosen by.
    if (e.source == "slurm") {
        // The allocation's nodes: a job step of fewer tasks than nodes spans at most its tasks.
        if (const std::string n = get("SLURM_NNODES"); !n.empty())
            e.nodes = std::min(env_int("SLURM_NNODES", n, 1, 1 << 20, "at least 1"), e.world_size);
    } else {
        const char* local_size_var =
            !get("LOCAL_WORLD_SIZE").empty() ? "LOCAL_WORLD_SIZE" : "OMPI_COMM_WORLD_LOCAL_SIZE";
        if (const std::string n = get(local_size_var); !n.empty()) {
            const int per_node = env_int(local_size_var, n, 1, e.world_size,
                                         ("1.." + std::to_string(e.world_size)).c_str());
            e.nodes = (e.world_size + per_node - 1) / per_node;
        }
    }
    const std::string addr = get("MASTER_ADDR"), port = get("MASTER_PORT");
    if (e.world_size > 1) {
        const std::string why = std::string(" (needed when ") + world_var + "=" + world +
                                " > 1: the host and a free TCP port of rank 0)";
        ZG_CHECK(!addr.empty(), "environment: MASTER_ADDR is not set" + why);
        ZG_CHECK(!port.empty(), "environment: MASTER_PORT is not set" + why);
    }
    e.master_addr = addr;
    if (!port.empty()) e.master_port = env_int("MASTER_PORT", port, 1, 65535, "1..65535");
    // torchrun's agent on node 0 serves its own store on MASTER_PORT (it says so with
    // TORCHELASTIC_USE_AGENT_STORE), so the ranks meet on the port above it.
    std::string agent_store = get("TORCHELASTIC_USE_AGENT_STORE");
    for (char& c : agent_store) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (e.source == "torchrun" && (agent_store == "true" || agent_store == "1") &&
        e.master_port > 0) {
        ZG_CHECK(e.master_port < 65535, "environment: MASTER_PORT=" + port +
                                            " is torchrun's; the ranks meet on the port above "
                                            "it, and there is none");
        e.master_port += 1;
    }
    return e;
}

RankEnv rank_env_from_environment() {
    return parse_rank_env([](const char* name) { return std::getenv(name); });
}

}  // namespace zgpt
