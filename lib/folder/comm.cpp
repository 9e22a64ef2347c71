// Comm for one process (always built) and, with CKPTKIT_HAVE_MPI, MPI_COMM_WORLD.
#include "folder/comm.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#ifdef CKPTKIT_HAVE_MPI
#include <mpi.h>
#endif

namespace ckpt {

namespace {

/// A world of one: allgather returns what it was given.
class SerialComm final : public Comm {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::vector<std::string> allgather(const std::string& mine) override { return {mine}; }
};

#ifdef CKPTKIT_HAVE_MPI
/// MPI_COMM_WORLD; MPI_Finalize runs when the process exits normally (static destructor).
class MpiComm final : public Comm {
    int rank_ = 0, size_ = 1;

public:
    MpiComm() {
        int provided = 0;
        if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            throw std::runtime_error("MPI_Init failed");
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }
    ~MpiComm() override {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::vector<std::string> allgather(const std::string& mine) override {
        // Wait for every rank without spinning: Open MPI's blocking collectives busy-poll,
        // so a rank that finished its files would take a core from one still working.
        MPI_Request req;
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        for (int done = 0;;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (done) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        const long long n = static_cast<long long>(mine.size());
        std::vector<long long> lens(static_cast<std::size_t>(size_));
        MPI_Allgather(&n, 1, MPI_LONG_LONG, lens.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
        std::vector<int> counts(lens.size()), displs(lens.size());
        long long total = 0;
        for (std::size_t i = 0; i < lens.size(); ++i) {
            if (lens[i] > (1ll << 30)) throw std::runtime_error("MPI message over 1 GiB");
            counts[i] = static_cast<int>(lens[i]);
            displs[i] = static_cast<int>(total);
            total += lens[i];
        }
        if (total > (1ll << 31) - 1) throw std::runtime_error("MPI messages over 2 GiB in all");
        std::string all(static_cast<std::size_t>(total), '\0');
        MPI_Allgatherv(mine.data(), counts[static_cast<std::size_t>(rank_)], MPI_BYTE, all.data(), counts.data(),
                       displs.data(), MPI_BYTE, MPI_COMM_WORLD);
        std::vector<std::string> out;
        for (std::size_t i = 0; i < lens.size(); ++i) out.push_back(all.substr(std::size_t(displs[i]), std::size_t(counts[i])));
        return out;
    }
};

#endif

/// An MPI launcher (mpirun, mpiexec, srun) started this process.
bool launched_by_mpi() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(v)) return true;
    return false;
}

}  // namespace

Comm& serial_comm() {
    static SerialComm serial;
    return serial;
}

Comm& world_comm() {
#ifdef CKPTKIT_HAVE_MPI
    if (launched_by_mpi()) {
        static MpiComm mpi;
        return mpi;
    }
#endif
    static SerialComm serial;
#ifndef CKPTKIT_HAVE_MPI
    static const bool warned = [] {
        if (launched_by_mpi())
            spdlog::warn("started by an MPI launcher, but built without MPI (CKPTKIT_MPI): every rank does the whole job");
        return true;
    }();
    (void)warned;
#endif
    return serial;
}

bool mpi_built() {
#ifdef CKPTKIT_HAVE_MPI
    return true;
#else
    return false;
#endif
}

}  // namespace ckpt
