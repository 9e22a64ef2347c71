// The few collective operations folder mode needs, so one code path serves a single
// process and `mpirun -n R` (MPI, optional target CKPTKIT_MPI). Every call is collective:
// every rank must make the same calls in the same order.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace ckpt {

/// A group of cooperating processes (ranks 0..size-1). The serial one has size 1.
class Comm {
public:
    virtual ~Comm() = default;
    virtual int rank() const = 0;   ///< this process, 0..size()-1
    virtual int size() const = 0;   ///< number of ranks
    /// Every rank's `mine`, in rank order, on every rank (MPI_Allgatherv of bytes).
    virtual std::vector<std::string> allgather(const std::string& mine) = 0;
    /// Rank 0's `value` on every rank.
    std::string broadcast(const std::string& value) { return allgather(rank() == 0 ? value : std::string())[0]; }
    /// Wait until every rank got here.
    void barrier() { allgather(std::string()); }
};

/// The world of this process: MPI_COMM_WORLD when the tools were built with MPI and the
/// process was started by an MPI launcher (mpirun, mpiexec, srun: OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE or PMIX_RANK in the environment; MPI_Init is then called once, MPI_Finalize at
/// exit), else a serial world of one. Never throws for the serial case.
Comm& world_comm();

/// A world of one, whatever launched the process (ckptkit.dcp's writer: each torch rank
/// compresses its own files).
Comm& serial_comm();

/// True when the tools were built with MPI (CKPTKIT_MPI).
bool mpi_built();

}  // namespace ckpt
