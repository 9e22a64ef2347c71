// Thin RAII layer over the HDF5 C API for the .ckz.h5 container (formats/container.md):
// 1-D chunked datasets compressed with the registered zstd filter (id 32015, the id that
// h5py + hdf5plugin read), each carrying an `xxh3` checksum attribute of its
// uncompressed bytes, appended in bounded chunks and read back by range.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/chunk_buffer.h"
#include "common/xxh3.h"

namespace ckpt::container {

/// HDF5 filter id of Zstandard (registered by the HDF Group for HDF5Plugin-Zstandard).
constexpr H5Z_filter_t kZstdFilter = 32015;

/// Register our zstd filter implementation (idempotent; libzstd does the work), and turn off
/// libhdf5's automatic error printing in the calling thread (errors are exceptions).
void register_zstd_filter();

/// Let Appender write its chunks itself (H5Dwrite_chunk after shuffle_bytes and zstd:
/// libhdf5's own byte-shuffle loop is slow, and its pipeline copies and zero-fills each
/// chunk: docs/benchmarks.md, "Measurements behind the code's choices"). After a failed
/// H5Dwrite_chunk (a file-size limit, a full disk) libhdf5 1.10 can no longer close the
/// file, and its exit handler then crashes the program; so this calls H5dont_atexit() and
/// turns direct writes on only when that took effect, which needs it to come before any
/// other HDF5 call (first thing in main: libhdf5 registers its handler when it initialises,
/// and H5dont_atexit then fails). A program that turns it on closes its HDF5 files itself
/// (ckpt-compress does; a failed one is deleted). Returns whether direct writes are on;
/// otherwise libhdf5's pipeline writes, as before.
bool enable_direct_chunk_writes();
/// Direct writes on or off without the exit-handler change: for tests that never fail a
/// write (the two paths write the same chunk bytes).
void set_direct_chunk_writes(bool on);
/// The filter class, also exported by the h5zstd plugin (HDF5_PLUGIN_PATH) for h5py.
extern const H5Z_class2_t kZstdClass;

/// Owning hid_t with the right close function.
class Handle {
public:
    Handle() = default;
    Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
    Handle& operator=(Handle&& o) noexcept;
    ~Handle();
    hid_t get() const { return id_; }
    /// Flush and close now, reporting failure (disk full, file-size limit), instead of the
    /// destructor's silent close. Throws std::runtime_error.
    void close_checked();
    explicit operator bool() const { return id_ >= 0; }

private:
    hid_t id_ = -1;
    herr_t (*close_)(hid_t) = nullptr;
};

/// Create a new file (truncating) or open one read-only. Throws std::runtime_error;
/// open_file throws BadInput(path) for a path that is missing ("no such file"), a folder or
/// unreadable, and for a file shorter than its superblock states ("truncated (N of M
/// bytes)": a copy or a download cut short, hdf5_extent).
Handle create_file(const std::string& path);
Handle open_file(const std::string& path);

/// A file's size and the end its HDF5 superblock states: the end-of-file address plus the
/// superblock's offset (a user block); eof = 0 where the superblock version or its field
/// sizes are not ones this reads (versions 0-3, 2/4/8-byte offsets). HDF5 looks for its
/// signature at 0, 512, 1024, 2048, ... (HDF5 file format spec, "Superblock").
struct Hdf5Extent {
    uint64_t size = 0, eof = 0;
};
/// hdf5_extent of `path`; nullopt without the HDF5 signature. Throws std::system_error
/// (errno) when the file cannot be opened or read.
std::optional<Hdf5Extent> hdf5_extent(const std::string& path);
/// Create an intermediate group path such as "/moments/codes".
void make_groups(hid_t file, const std::string& path);
bool exists(hid_t file, const std::string& path);

/// Scalar attributes on any object (dataset, group, file root "/").
void set_attr(hid_t obj, const std::string& name, const std::string& value);
void set_attr(hid_t obj, const std::string& name, double value);
void set_attr(hid_t obj, const std::string& name, uint64_t value);
/// Readers throw std::runtime_error naming the attribute when missing or mistyped.
std::string get_attr_string(hid_t obj, const std::string& name);
double get_attr_double(hid_t obj, const std::string& name);
uint64_t get_attr_u64(hid_t obj, const std::string& name);

/// Appender's `level` for data zstd cannot shrink (entropy-coded codes): the dataset's zstd
/// filter is declared optional and declines a chunk, so libhdf5 stores it as it is and sets
/// the filter's bit in the chunk's filter mask (every HDF5 reader honours it). A zstd frame
/// of incompressible bytes is only larger, and trying costs a compressor pass. A chunk that
/// ends in at least 4 KiB of zeros (the last one, zero-filled past the data, as a rule) is
/// compressed (zstd's default level).
constexpr int kZstdStore = 0;

/// zstd match-finder parameters (ZSTD_c_hashLog, ZSTD_c_minMatch); 0 keeps the level's.
/// planes > 1: the chunk is that many byte planes of equal size (HDF5's shuffle of
/// planes-byte elements); the leading planes that a sample shows incompressible (the low
/// mantissa bytes of float weights) go into the frame as raw blocks, and zstd compresses
/// only the rest (zstd_compress_chunk). The frame is an ordinary zstd frame to readers.
struct ZstdMatch {
    int hash_log = 0;
    int min_match = 0;
    int planes = 0;
};

/// Appends elements of one native type to a new extendible 1-D dataset.
/// Buffers one chunk, so memory is bounded by chunk_bytes.
class Appender {
public:
    /// type: H5T_NATIVE_UINT8 / INT32 / UINT32 / UINT64 ...; elem: its size in bytes.
    /// shuffle: HDF5's byte-shuffle filter (built into libhdf5) before zstd, which groups
    /// the i-th byte of every element (FP32 exponents together: smaller and faster).
    /// Chunks are shuffled, compressed (or stored, kZstdStore) and written here when
    /// enable_direct_chunk_writes() is on: the bytes and filter masks libhdf5's pipeline
    /// writes (a partial last chunk zero-filled, then filtered whole); otherwise, and for
    /// a shuffled kZstdStore dataset (none exists), through libhdf5's pipeline.
    /// DatasetReader reads directly.
    /// match: zstd's hashLog and minMatch for this dataset (stored after the level in the
    /// filter's parameters; decompression needs neither); zeros: the level's own.
    Appender(hid_t file, const std::string& path, hid_t type, std::size_t elem,
             std::size_t chunk_bytes = 1 << 20, int level = 3, bool shuffle = false, ZstdMatch match = {});
    void append(const void* data, std::size_t count);
    /// Append bytes in any amount (a dataset of bytes stored as elem-byte elements):
    /// finish() zero-pads the last element and writes the exact length as the `bytes`
    /// attribute. Not to be mixed with append().
    void append_bytes(const void* data, std::size_t n);
    /// append_bytes without a copy: room at the end of the chunk being filled for up to n
    /// bytes (n is set to what fits: >= 1 when it was >= 1). The caller writes them there
    /// (a pread, say) and then calls commit_bytes(n); nothing else in between.
    unsigned char* room_bytes(std::size_t& n);
    /// The n bytes written at room_bytes' pointer, appended (as append_bytes would).
    void commit_bytes(std::size_t n);
    /// append_bytes that calls no libhdf5 function (direct() datasets only; throws
    /// std::logic_error otherwise): whole chunks are queued, not compressed or written, so
    /// another thread may stage while this dataset's thread calls libhdf5 for other
    /// datasets; that thread then calls settle(). Nothing else on this Appender meanwhile.
    void stage_bytes(const void* data, std::size_t n);
    /// Compress and write the batches stage_bytes queued (on the thread that calls libhdf5):
    /// the same batches, so the same file bytes, as append_bytes would have written.
    void settle();
    /// Flush, write `xxh3` (over the stored elements) and `count` attributes; returns
    /// stored (compressed) bytes.
    uint64_t finish();
    uint64_t count() const { return count_; }
    /// Whether this dataset's chunks are written directly (enable_direct_chunk_writes).
    bool direct() const { return direct_; }
    /// xxh3 of the elements flushed so far (after finish(): the `xxh3` attribute's value).
    uint64_t xxh3() const { return XXH3_64bits_digest(hash_.get()); }

private:
    /// Buffer (and hash) nbytes, flush whole chunks; write false: a full batch is queued for
    /// settle, not compressed and written (stage_bytes).
    void push(const void* data, std::size_t nbytes, bool write = true);
    /// The bookkeeping of n bytes written at room_bytes' pointer (write: as push's).
    void commit(std::size_t n, bool write = true);
    void count_bytes(std::size_t n);  ///< a byte-mode append's count (append_bytes, commit_bytes, stage_bytes)
    void flush();
    /// Direct writes: the whole chunks queued in full_ shuffled and zstd-compressed in the
    /// worker pool (codec::parallel_items), the batch hashed in order beside them, then
    /// written in order from this thread (libhdf5 is called from one thread only); the same
    /// bytes for any thread count.
    /// tail: the last entry of full_ is the partial last chunk, `tail` bytes zero-padded.
    /// Takes the first kBatch entries of full_ at most (stage_bytes may queue more).
    void flush_full(std::size_t tail = 0);
    std::vector<ChunkBuffer> full_, packed_;   ///< queued whole chunks and their zstd frames
    Handle ds_;
    hid_t type_;
    std::size_t elem_, chunk_elems_;
    ChunkBuffer buf_;  ///< a chunk (its shuffle and zstd frame: h5.cpp's FlushScratch)
    uint64_t count_ = 0, written_ = 0, bytes_ = 0;
    int level_;
    ZstdMatch match_;
    bool shuffle_, direct_;
    bool byte_mode_ = false;
    Xxh3State hash_;
public:
    ~Appender();
};

/// Reads ranges of a 1-D dataset written by Appender, checking element size and count.
class DatasetReader {
public:
    /// Throws std::runtime_error when absent or when its element size differs from elem.
    DatasetReader(hid_t file, const std::string& path, hid_t type, std::size_t elem);
    uint64_t count() const { return count_; }
    /// Read `n` elements starting at element `offset`; throws when out of range.
    void read(uint64_t offset, uint64_t n, void* out) const;
    /// The same elements in place, without a copy, when they lie inside one chunk of the
    /// direct chunk path (valid until this reader's next read), else null (then use
    /// read); hashed on the way as read's. Throws as read.
    const void* view(uint64_t offset, uint64_t n) const;
    /// Length in bytes of a dataset of bytes (Appender::append_bytes): its `bytes`
    /// attribute, which must fit its last element, else count() * elem. Throws otherwise.
    uint64_t bytes() const { return bytes_; }
    /// Read bytes [offset, offset + n) of such a dataset; throws when out of range.
    void read_bytes(uint64_t offset, uint64_t n, void* out) const;
    /// Those bytes in place, without a copy, when they lie inside one chunk of the direct
    /// chunk path (valid until this reader's next read), else null (then use read_bytes);
    /// hashed on the way as read_bytes'. Throws as read_bytes.
    const void* view_bytes(uint64_t offset, uint64_t n) const;
    /// Bytes from `offset` to the end of its chunk (the most view_bytes can return there);
    /// 0 without the direct chunk path.
    uint64_t bytes_to_chunk_end(uint64_t offset) const { return chunk_ ? chunk_ * elem_ - offset % (chunk_ * elem_) : 0; }
    /// Whether the dataset matches its `xxh3` attribute. Reads (read, read_bytes) hash what
    /// they return on the way while they come in order (a re-read of hashed bytes is
    /// skipped, a gap stops it): checksum_ok reads only what they left (after a gap, all).
    /// Throws when the dataset cannot be read.
    bool checksum_ok() const;
    /// The `xxh3` attribute: what checksum_ok compares with. Throws when missing.
    uint64_t stored_xxh3() const;
    const std::string& path() const { return path_; }
    uint64_t stored_bytes() const { return H5Dget_storage_size(ds_.get()); }  ///< compressed

private:
    Handle ds_;
    hid_t type_;
    std::size_t elem_;
    uint64_t count_ = 0, bytes_ = 0;
    std::string path_;
    /// Datasets of Appender's pipelines ([zstd], or [shuffle, zstd] when shuffled_):
    /// elements per chunk, the largest stored chunk allowed, and the last chunk decoded
    /// (chunk_ = 0: libhdf5 reads the dataset).
    uint64_t chunk_ = 0, most_ = 0;
    bool shuffled_ = false;
    mutable uint64_t cached_ = UINT64_MAX;
    mutable ChunkBuffer chunk_buf_;  ///< decoded (as stored, unzstd'ed: h5.cpp's ReadScratch)
    /// Read-ahead of in-order reads with more than one codec thread: the next
    /// min(kReadAhead, threads) chunks read as stored and decoded in the worker pool at once
    /// (read_ahead), each taken by chunk_bytes once; memory: 2 chunks per thread per reader.
    static constexpr std::size_t kReadAhead = 8;
    enum : uint8_t { kAheadNone, kAheadStored, kAheadZero, kAheadReady };
    mutable std::vector<ChunkBuffer> ahead_, ahead_stored_;
    mutable std::vector<uint8_t> ahead_state_;
    mutable uint64_t ahead_first_ = UINT64_MAX, last_chunk_ = UINT64_MAX - 1;
    /// Chunk c as stored into `stored` (its filter mask in `mask`); false for a chunk never
    /// written. Throws when damaged.
    bool read_stored(uint64_t c, ChunkBuffer& stored, uint32_t& mask) const;
    /// Read chunks c, c+1, ... (up to kReadAhead) and decode them in the worker pool.
    void read_ahead(uint64_t c) const;
    /// checksum_ok's running hash of the bytes [0, hashed_) read so far in order; stale
    /// when a read skipped ahead (in_order_ false).
    mutable Xxh3State running_ = make_xxh3();
    mutable uint64_t hashed_ = 0;
    mutable bool in_order_ = true;
    /// Hash what a read returned: bytes [byte_offset, byte_offset + n) at p.
    void note_read(uint64_t byte_offset, const void* p, uint64_t n) const;
    /// Chunk c's elements as bytes (zeros for a chunk never written); throws when damaged.
    const ChunkBuffer& chunk_bytes(uint64_t c) const;
    /// Bytes [byte_offset, byte_offset + n) of a shuffled dataset, chunk by chunk.
    void read_chunked(uint64_t byte_offset, uint64_t n, unsigned char* out) const;
    /// view / view_bytes after their range checks: bytes [b, b + nb) in place, hashed, or
    /// null (no direct chunk path, nothing asked, or across a chunk end).
    const void* view_at(uint64_t b, uint64_t nb) const;
};

}  // namespace ckpt::container
