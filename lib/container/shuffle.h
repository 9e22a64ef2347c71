// HDF5's byte-shuffle filter (H5Z_FILTER_SHUFFLE, id 2) as plain functions that vectorise.
// libhdf5 does not let a program replace a predefined filter, and its byte-at-a-time loop
// is slow (a visible part of a restore once /raw was shuffled, container format 3;
// docs/benchmarks.md, "Measurements behind the code's choices"), so
// DatasetReader (h5.h) reads shuffled chunks with H5Dread_chunk and undoes zstd and the
// shuffle itself; Appender writes them so when enable_direct_chunk_writes() is on (h5.h
// says when). Other readers (h5py, h5dump) use libhdf5's filter on the same chunks.
#pragma once
#include <cstddef>

namespace ckpt::container {

/// libhdf5's shuffle of nbytes bytes of `size`-byte elements (H5Zshuffle.c): byte k of
/// every whole element into the k-th run, the bytes past the last whole element at the
/// end; 1-byte types and fewer than two elements pass unchanged. unshuffle_bytes is the
/// inverse. Vectorised for size 4 (AVX2 clone), a plain loop otherwise.
void shuffle_bytes(const unsigned char* src, unsigned char* dst, std::size_t nbytes, std::size_t size);
void unshuffle_bytes(const unsigned char* src, unsigned char* dst, std::size_t nbytes, std::size_t size);

}  // namespace ckpt::container
