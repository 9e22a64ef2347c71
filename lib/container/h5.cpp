#include "container/h5.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "codec/codec.h"
#include "common/error.h"
#include "common/file.h"
#include "container/shuffle.h"

namespace ckpt::container {

namespace {
/// One zstd context per thread, reused across chunks: ZSTD_compress / ZSTD_decompress
/// would allocate and clear a fresh one (MiBs of tables) for every 1 MiB chunk.
struct ZstdContexts {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_DCtx* d = ZSTD_createDCtx();
    ~ZstdContexts() {
        ZSTD_freeCCtx(c);
        ZSTD_freeDCtx(d);
    }
};
thread_local ZstdContexts zstd_ctx;

/// An optional zstd filter is a kZstdStore dataset's: it declines, so the chunk is stored
/// as it is, unless the chunk ends in 4 KiB of zeros: as a rule the fill of the dataset's
/// last, partial chunk (up to 1 MiB), which zstd shrinks to a few bytes.
bool store_declines(const void* chunk, std::size_t nbytes) {
    const auto* p = static_cast<const unsigned char*>(chunk);
    std::size_t zeros = 0;
    while (zeros < nbytes && zeros < 4096 && p[nbytes - 1 - zeros] == 0) ++zeros;
    return zeros < 4096;
}

/// Appender's direct chunk writes (enable_direct_chunk_writes).
std::atomic<bool> direct_writes{false};

/// Appender::flush's working buffers, shared by every Appender of a thread (a container has
/// a dozen datasets, most of a few KiB): `pad` holds the one partial chunk of a dataset of
/// less than a chunk zero-filled to a whole one, and is all zeros again after each use, so a
/// small dataset neither zeroes nor pages in a chunk of its own; `shuffled` and `packed` hold
/// its shuffle and zstd frame. (A larger dataset's last chunk is padded in its own buffer and
/// compressed with the last batch: flush_full.)
struct FlushScratch {
    ChunkBuffer pad, shuffled, packed;
};
thread_local FlushScratch flush_scratch;

/// DatasetReader::chunk_bytes's working buffers, shared by every reader of a thread in the
/// same way: a chunk as stored, and its zstd frame decompressed before the unshuffle.
struct ReadScratch {
    ChunkBuffer stored, plain;
};
thread_local ReadScratch read_scratch;

/// log2(c) for an integer c >= 1 in 16-bit fixed point (within 2^-15 of the true value):
/// the bit length, then the fraction bit by bit from repeated squaring of the mantissa
/// (Turner, "Binary logarithm", IEEE Signal Processing Magazine 2010). Integers only, so
/// every machine gets the same value.
constexpr uint32_t log2_q16(uint32_t c) {
    const int e = 31 - __builtin_clz(c);
    uint64_t x = e <= 30 ? uint64_t(c) << (30 - e) : uint64_t(c) >> 1;  // the mantissa in [2^30, 2^31): Q30
    uint32_t r = uint32_t(e) << 16;
    for (int b = 15; b >= 0; --b) {
        x = (x * x) >> 30;  // < 2^62 before the shift
        if (x >= (uint64_t(1) << 31)) {
            x >>= 1;
            r |= uint32_t(1) << b;
        }
    }
    return r;
}
/// log2_q16 of the counts below 1024 (a sample's counts, as a rule), computed once by
/// the compiler.
struct Log2Small {
    uint32_t v[1024] = {};
    constexpr Log2Small() {
        for (uint32_t c = 1; c < 1024; ++c) v[c] = log2_q16(c);
    }
};
constexpr Log2Small kLog2Small{};
/// log2_q16 of a sample's count c >= 1: the table's, or computed.
uint32_t log2_count(uint32_t c) { return c < 1024 ? kLog2Small.v[c] : log2_q16(c); }

/// Whether zstd would store byte plane p[0, n) raw anyway, judged from a sample. Without
/// matches (none in mantissa bytes) zstd's only gain is its Huffman coding of literals,
/// which it keeps only when it saves more than 1/64 of the block (ZSTD_minGain: srcSize >> 6,
/// plus 2 bytes; else the literals, and the block, go raw). A Huffman code is never shorter
/// than the entropy, so a plane of at least 8 - 8/64 = 7.875 bits a byte is stored raw.
/// The entropy is estimated over 256 runs of 64 bytes spread across the plane (N = 16384),
/// plug-in plus the Miller-Madow correction (m - 1) / (2 N ln 2) for its bias (m: the byte
/// values seen), in integers only (log2_count), so every machine gives the same verdict.
/// Planes under 64 KiB are left to zstd.
bool plane_incompressible(const unsigned char* p, std::size_t n) {
    constexpr std::size_t kRuns = 256, kRun = 64, kN = kRuns * kRun;
    static_assert(kN == 1 << 14, "log2(N) = 14 below");
    if (n < 4 * kN) return false;
    uint32_t count[256] = {};
    for (std::size_t r = 0; r < kRuns; ++r)
        for (std::size_t i = 0; i < kRun; ++i) ++count[p[r * (n / kRuns) + i]];
    // N H 2^16 = N log2(N) 2^16 - sum c log2(c) 2^16, plus (m - 1) 2^16 / (2 ln 2)
    uint64_t sum = 0, seen = 0;
    for (const uint32_t c : count) {
        if (c == 0) continue;
        sum += uint64_t(c) * log2_count(c);
        ++seen;
    }
    const uint64_t nh = (uint64_t(kN) * 14 << 16) - sum + (seen - 1) * 47274;  // 2^16 / (2 ln 2) = 47274.7
    return nh >= (uint64_t(kN) * 63 << 16) / 8;  // H >= 63/8 bits
}

/// Size of the zstd frame header at f[0, n) (RFC 8878 3.1.1.1: magic, descriptor, window
/// byte unless single-segment, dictionary id, content size), 0 when n is too short.
std::size_t zstd_header_size(const unsigned char* f, std::size_t n) {
    if (n < 5) return 0;
    const unsigned fhd = f[4], single = (fhd >> 5) & 1;
    static constexpr std::size_t kDid[4] = {0, 1, 2, 4};
    const std::size_t fcs = (fhd >> 6) == 0 ? single : std::size_t(1) << (fhd >> 6);
    const std::size_t h = 5 + (single ? 0 : 1) + kDid[fhd & 3] + fcs;
    return h <= n ? h : 0;
}

/// One zstd frame of src[0, n) into dst (capacity cap) at `level` with `match` (zeros: the
/// level's own), as the filter writes it; returns its size, 0 on failure. With
/// match.planes > 1 the leading planes that plane_incompressible finds go in as raw
/// blocks (a single-segment frame with a 4-byte content size, then raw blocks of <= 128
/// KiB, RFC 8878 3.1.1.2), followed by the blocks of zstd's own frame of the rest (its
/// header dropped, no checksum; its matches and tables refer only to its own blocks, and
/// raw blocks leave the decoder's state as a new frame has it). Where the raw frame does
/// not fit `cap` or zstd fails on the rest, the chunk gets zstd's own frame of it all.
std::size_t zstd_compress_chunk(const void* src, std::size_t n, int level, ZstdMatch match, void* dst, std::size_t cap) {
    ZSTD_CCtx* c = zstd_ctx.c;
    if (!c) return 0;
    ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_hashLog, match.hash_log)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, match.min_match)))
        return 0;
    const auto* s = static_cast<const unsigned char*>(src);
    std::size_t raw = 0;  // bytes of the leading planes stored raw
    if (match.planes > 1 && n % std::size_t(match.planes) == 0 && n <= 0xffffffffu) {
        const std::size_t pn = n / std::size_t(match.planes);
        while (raw < n && plane_incompressible(s + raw, pn)) raw += pn;
    }
    auto whole = [&] {  // zstd's own frame of the whole chunk
        const std::size_t r = ZSTD_compress2(c, dst, cap, src, n);
        return ZSTD_isError(r) ? 0 : r;
    };
    constexpr std::size_t kMaxBlock = 128 * 1024;
    const std::size_t blocks = (raw + kMaxBlock - 1) / kMaxBlock, head = 9 + 3 * blocks + raw;
    if (raw == 0 || cap < head) return whole();
    auto* d = static_cast<unsigned char*>(dst);
    auto le = [](unsigned char* p, uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) p[i] = (unsigned char)(v >> (8 * i));
    };
    le(d, 0xFD2FB528u, 4);  // magic
    d[4] = 0xA0;            // content size in 4 bytes, single segment, no checksum, no dictionary
    le(d + 5, n, 4);
    std::size_t at = 9;
    for (std::size_t b = 0; b < raw; b += kMaxBlock) {
        const std::size_t len = std::min(kMaxBlock, raw - b);
        const bool last = b + len == n;
        le(d + at, uint64_t(len) << 3 | (last ? 1 : 0), 3);  // type 0: raw
        std::memcpy(d + at + 3, s + b, len);
        at += 3 + len;
    }
    if (raw == n) return at;
    const bool set = !ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0)) &&
                     !ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0));
    const std::size_t r = set ? ZSTD_compress2(c, d + at, cap - at, s + raw, n - raw) : 0;
    const std::size_t h = !set || ZSTD_isError(r) ? 0 : zstd_header_size(d + at, r);
    if (h == 0 || h >= r) {
        ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);  // back to the level's frame
        return whole();
    }
    std::memmove(d + at, d + at + h, r - h);
    return at + r - h;
}
}  // namespace

/// Filter callback: the HDF5Plugin-Zstandard chunk format (one zstd frame per chunk).
size_t zstd_filter(unsigned flags, size_t nelmts, const unsigned cd[], size_t nbytes,
                   size_t* buf_size, void** buf) {
    if (flags & H5Z_FLAG_REVERSE) {
        const unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
        if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n > (1ull << 28))
            return 0;  // our chunks are <= 1 MiB; refuse absurd sizes from damaged files
        void* out = H5allocate_memory(n ? n : 1, false);
        if (!out) return 0;
        const size_t r = zstd_ctx.d ? ZSTD_decompressDCtx(zstd_ctx.d, out, n, *buf, nbytes) : ZSTD_decompress(out, n, *buf, nbytes);
        if (ZSTD_isError(r) || r != n) { H5free_memory(out); return 0; }
        H5free_memory(*buf);
        *buf = out;
        *buf_size = n;
        return n;
    }
    if ((flags & H5Z_FLAG_OPTIONAL) && store_declines(*buf, nbytes)) return 0;
    // cd: the level, then optionally zstd's hashLog and minMatch (0: the level's own) and
    // the byte planes (ZstdMatch::planes)
    const int level = nelmts > 0 ? int(cd[0]) : 3;
    const ZstdMatch match{nelmts > 2 ? int(cd[1]) : 0, nelmts > 2 ? int(cd[2]) : 0, nelmts > 3 ? int(cd[3]) : 0};
    const size_t cap = ZSTD_compressBound(nbytes);
    void* out = H5allocate_memory(cap, false);
    if (!out) return 0;
    const size_t r = zstd_compress_chunk(*buf, nbytes, level, match, out, cap);
    if (r == 0) { H5free_memory(out); return 0; }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = cap;
    return r;
}

const H5Z_class2_t kZstdClass = {H5Z_CLASS_T_VERS, kZstdFilter, 1, 1, "zstd", nullptr, nullptr, zstd_filter};

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

/// n with a comma every three digits ("308,449").
std::string grouped(uint64_t n) {
    std::string d = std::to_string(n), out;
    for (std::size_t i = 0; i < d.size(); ++i) {
        if (i && (d.size() - i) % 3 == 0) out += ',';
        out += d[i];
    }
    return out;
}

}  // namespace

bool enable_direct_chunk_writes() {
    // H5dont_atexit fails once libhdf5 is initialised (it registers its handler then), or
    // when called before: direct writes then stay as they are
    if (H5dont_atexit() >= 0) direct_writes = true;
    return direct_writes;
}

void set_direct_chunk_writes(bool on) { direct_writes = on; }

void register_zstd_filter() {
    // errors become exceptions, not prints: in every thread that opens a file (a thread-safe
    // libhdf5 keeps the automatic error printing per thread: a background save's thread
    // printed HDF5-DIAG stacks while the main thread was quiet)
    thread_local bool quiet = false;
    if (!quiet) {
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
        quiet = true;
    }
    static std::once_flag once;
    std::call_once(once, [] {
        if (H5Zregister(&kZstdClass) < 0) fail("cannot register the HDF5 zstd filter");
    });
}

Handle& Handle::operator=(Handle&& o) noexcept {
    if (this != &o) {
        if (id_ >= 0 && close_) close_(id_);
        id_ = o.id_;
        close_ = o.close_;
        o.id_ = -1;
    }
    return *this;
}
void Handle::close_checked() {
    if (id_ < 0) return;
    const bool flushed = H5Fflush(id_, H5F_SCOPE_GLOBAL) >= 0;
    const bool closed = close_(id_) >= 0;
    id_ = -1;
    if (!flushed || !closed) fail("cannot write the container (disk full or file-size limit?)");
}

Handle::~Handle() {
    if (id_ >= 0 && close_) close_(id_);
}

Handle create_file(const std::string& path) {
    register_zstd_filter();
    errno = 0;
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    // the reason: errno of the failed open(2) in libhdf5's file driver, when it set one
    if (f < 0) fail(path + ": cannot create HDF5 file" + (errno ? std::string(": ") + std::strerror(errno) : ""));
    return Handle(f, H5Fclose);
}

std::optional<Hdf5Extent> hdf5_extent(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), path);
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw std::system_error(errno, std::generic_category(), path);
    Hdf5Extent x;
    x.size = uint64_t(st.st_size);
    const std::optional<uint64_t> at_sig = hdf5_signature_at(fd, x.size);
    if (!at_sig) return std::nullopt;
    const uint64_t off = *at_sig;
    unsigned char head[64];
    const ssize_t n = ::pread(fd, head, sizeof head, off_t(off));
    if (n < 0) throw std::system_error(errno, std::generic_category(), path);
    if (n < 16) return x;
    const int version = head[8];
    unsigned o = 0, at = 0;
    if (version == 0 || version == 1) o = head[13], at = 24 + (version == 1 ? 4 : 0) + 2 * o;   // base, free space, eof
    else if (version == 2 || version == 3) o = head[9], at = 12 + 2 * o;                        // base, extension, eof
    if ((o != 2 && o != 4 && o != 8) || uint64_t(n) < at + o) return x;
    uint64_t eof = 0;
    for (unsigned i = 0; i < o; ++i) eof |= uint64_t(head[at + i]) << (8 * i);
    x.eof = off + eof;
    return x;
}

Handle open_file(const std::string& path) {
    register_zstd_filter();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int e = errno;
        throw BadInput(path, e == ENOENT ? std::string("no such file (") + std::strerror(e) + ")"
                                         : std::string("cannot read: ") + std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) throw BadInput(path, "is a folder, not a container file");
    std::optional<Hdf5Extent> x;
    try {
        x = hdf5_extent(path);
    } catch (const std::system_error& e) {
        throw BadInput(path, std::string("cannot read: ") + std::strerror(e.code().value()));
    }
    if (!x) fail("not an HDF5 file");
    if (x->eof && x->size < x->eof)
        throw BadInput(path, "truncated (" + grouped(x->size) + " of " + grouped(x->eof) + " bytes): a copy or a download cut short");
    if (H5Fis_hdf5(path.c_str()) <= 0) fail("not an HDF5 file");
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) fail("cannot open HDF5 file");
    return Handle(f, H5Fclose);
}

bool exists(hid_t file, const std::string& path) {
    std::size_t pos = 0;
    while ((pos = path.find('/', pos + 1)) != std::string::npos)
        if (H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
    return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
}

void make_groups(hid_t file, const std::string& path) {
    std::size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        const std::string p = path.substr(0, pos);
        if (H5Lexists(file, p.c_str(), H5P_DEFAULT) > 0) continue;
        const hid_t g = H5Gcreate2(file, p.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0) fail("cannot create group " + p);
        H5Gclose(g);
    }
}

namespace {
void write_attr(hid_t obj, const std::string& name, hid_t type, const void* v) {
    Handle sp(H5Screate(H5S_SCALAR), H5Sclose);
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    Handle a(H5Acreate2(obj, name.c_str(), type, sp.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a || H5Awrite(a.get(), type, v) < 0) fail("cannot write attribute " + name);
}
Handle open_attr(hid_t obj, const std::string& name) {
    if (H5Aexists(obj, name.c_str()) <= 0) fail("attribute '" + name + "' is missing");
    Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
    if (!a) fail("attribute '" + name + "' cannot be opened");
    Handle sp(H5Aget_space(a.get()), H5Sclose);
    if (H5Sget_simple_extent_type(sp.get()) != H5S_SCALAR) fail("attribute '" + name + "' is not a scalar");
    return a;
}
}  // namespace

void set_attr(hid_t obj, const std::string& name, const std::string& value) {
    Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), value.empty() ? 1 : value.size());
    H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
    write_attr(obj, name, t.get(), value.empty() ? "" : value.data());
}
void set_attr(hid_t obj, const std::string& name, double v) { write_attr(obj, name, H5T_NATIVE_DOUBLE, &v); }
void set_attr(hid_t obj, const std::string& name, uint64_t v) { write_attr(obj, name, H5T_NATIVE_UINT64, &v); }

std::string get_attr_string(hid_t obj, const std::string& name) {
    Handle a = open_attr(obj, name);
    Handle t(H5Aget_type(a.get()), H5Tclose);
    if (H5Tget_class(t.get()) != H5T_STRING || H5Tis_variable_str(t.get()) > 0)
        fail("attribute '" + name + "' is not a fixed-length string");
    const size_t n = H5Tget_size(t.get());
    if (n > (64u << 20)) fail("attribute '" + name + "' is too large");
    std::string s(n, '\0');
    if (H5Aread(a.get(), t.get(), s.data()) < 0) fail("attribute '" + name + "' cannot be read");
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
}
namespace {
/// A numeric scalar attribute of class `cls`, converted to `mem` (HDF5 converts).
template <class T>
T get_attr_number(hid_t obj, const std::string& name, H5T_class_t cls, hid_t mem, const char* what) {
    Handle a = open_attr(obj, name);
    Handle t(H5Aget_type(a.get()), H5Tclose);
    if (H5Tget_class(t.get()) != cls) fail("attribute '" + name + "' is not " + what);
    T v{};
    if (H5Aread(a.get(), mem, &v) < 0) fail("attribute '" + name + "' cannot be read");
    return v;
}
}  // namespace

double get_attr_double(hid_t obj, const std::string& name) {
    return get_attr_number<double>(obj, name, H5T_FLOAT, H5T_NATIVE_DOUBLE, "a float");
}
uint64_t get_attr_u64(hid_t obj, const std::string& name) {
    return get_attr_number<uint64_t>(obj, name, H5T_INTEGER, H5T_NATIVE_UINT64, "an integer");
}

Appender::Appender(hid_t file, const std::string& path, hid_t type, std::size_t elem,
                   std::size_t chunk_bytes, int level, bool shuffle, ZstdMatch match)
    : type_(type), elem_(elem), chunk_elems_(std::max<std::size_t>(1, chunk_bytes / elem)), level_(level),
      match_(match), shuffle_(shuffle), direct_(direct_writes && !(shuffle && level == kZstdStore)) {
    const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = chunk_elems_;
    Handle sp(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.get(), 1, &chunk);
    H5Pset_obj_track_times(dcpl.get(), false);  // same input, same container bytes
    if (shuffle && H5Pset_shuffle(dcpl.get()) < 0) fail("cannot set the shuffle filter on " + path);
    const unsigned cd[4] = {unsigned(level), unsigned(match.hash_log), unsigned(match.min_match), unsigned(match.planes)};
    const bool tuned = match.hash_log != 0 || match.min_match != 0;  // else the level alone, as before
    const std::size_t ncd = match.planes ? 4 : tuned ? 3 : 1;
    if (H5Pset_filter(dcpl.get(), kZstdFilter, level == kZstdStore ? H5Z_FLAG_OPTIONAL : H5Z_FLAG_MANDATORY, ncd, cd) < 0)
        fail("cannot set zstd filter on " + path);
    const auto slash = path.rfind('/');
    if (slash > 0) make_groups(file, path.substr(0, slash));
    ds_ = Handle(H5Dcreate2(file, path.c_str(), type, sp.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
    if (!ds_) fail("cannot create dataset " + path);
    hash_ = make_xxh3();
}

Appender::~Appender() = default;

void Appender::append(const void* data, std::size_t count) {
    push(data, count * elem_);
    count_ += count;
}

void Appender::append_bytes(const void* data, std::size_t n) {
    push(data, n);
    count_bytes(n);
}

void Appender::count_bytes(std::size_t n) {
    byte_mode_ = true;
    bytes_ += n;
    count_ = (bytes_ + elem_ - 1) / elem_;
}

/// Appender's buffer before its dataset outgrows it (then a whole chunk).
constexpr std::size_t kFirstBuffer = 1 << 16;
/// Whole chunks compressed at once (one per worker; 2 x 1 MiB of buffers each). Fixed, not
/// the thread count: where libhdf5 places each dataset's chunks follows the order of the
/// writes, so the same batches give the same file bytes for any --threads.
constexpr std::size_t kBatch = 8;

void Appender::push(const void* data, std::size_t n, bool write) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) {  // one chunk buffered at a time (whole elements: appends come in elements or bytes, never both)
        std::size_t take = n;
        unsigned char* dst = room_bytes(take);
        std::memcpy(dst, p, take);
        commit(take, write);
        p += take;
        n -= take;
    }
}

unsigned char* Appender::room_bytes(std::size_t& n) {
    const std::size_t chunk_bytes = chunk_elems_ * elem_;
    n = std::min(chunk_bytes - buf_.size(), n);
    if (buf_.capacity() < buf_.size() + n)  // 64 KiB first: a small dataset holds no whole chunk
        buf_.reserve(buf_.size() + n <= kFirstBuffer ? kFirstBuffer : chunk_bytes);
    return buf_.data() + buf_.size();
}

void Appender::commit(std::size_t n, bool write) {
    const std::size_t at = buf_.size();
    buf_.resize(at + n);  // within the room reserved: the bytes stay
    if (!direct_) XXH3_64bits_update(hash_.get(), buf_.data() + at, n);  // direct: hashed by chunk as flushed, in the same order
    if (buf_.size() < chunk_elems_ * elem_) return;
    if (!direct_) return flush();
    full_.push_back(std::move(buf_));   // compressed in a batch, one chunk per worker
    buf_.clear();
    if (write && full_.size() >= kBatch) flush_full();
}

void Appender::commit_bytes(std::size_t n) {
    commit(n);
    count_bytes(n);
}

void Appender::stage_bytes(const void* data, std::size_t n) {
    if (!direct_) throw std::logic_error("Appender::stage_bytes on a dataset written through libhdf5's pipeline");
    push(data, n, false);
    count_bytes(n);
}

void Appender::settle() {
    while (full_.size() >= kBatch) flush_full();
}

void Appender::flush_full(std::size_t tail) {
    if (full_.empty()) return;
    const std::size_t chunk_bytes = chunk_elems_ * elem_, count = std::min(full_.size(), kBatch);
    if (tail && count != full_.size()) throw std::logic_error("Appender: a partial chunk behind more than a batch");
    if (packed_.size() < count) packed_.resize(count);
    std::vector<std::size_t> size(count, chunk_bytes);
    std::vector<uint32_t> mask(count, 0);
    // item `count`, the last range's (a worker's when there are two or more): the batch's
    // xxh3, in order (a tail: its `tail` bytes, not the padding), beside the compression of
    // the others
    codec::parallel_items(count + 1, [&](unsigned, std::size_t i0, std::size_t i1) {
        FlushScratch& s = flush_scratch;   // this worker's
        for (std::size_t i = i0; i < i1; ++i) {
            if (i == count) {
                for (std::size_t c = 0; c < count; ++c)
                    XXH3_64bits_update(hash_.get(), full_[c].data(), tail && c + 1 == count ? tail : chunk_bytes);
                continue;
            }
            const unsigned char* data = full_[i].data();
            if (level_ == kZstdStore && store_declines(data, chunk_bytes)) {
                mask[i] = 1;   // the optional zstd filter (the only one) skipped, as libhdf5 marks it
                continue;
            }
            if (shuffle_) {
                if (s.shuffled.size() < chunk_bytes) s.shuffled.resize(chunk_bytes);
                shuffle_bytes(data, s.shuffled.data(), chunk_bytes, elem_);
                data = s.shuffled.data();
            }
            ChunkBuffer& out = packed_[i];
            if (out.size() < ZSTD_compressBound(chunk_bytes)) out.resize(ZSTD_compressBound(chunk_bytes));
            size[i] = zstd_compress_chunk(data, chunk_bytes, level_, match_, out.data(), out.size());
            if (size[i] == 0) fail("cannot compress a chunk of dataset");
        }
    });
    for (std::size_t i = 0; i < count; ++i) {
        const hsize_t start = written_, total = written_ + (tail && i + 1 == count ? tail / elem_ : chunk_elems_);
        if (H5Dset_extent(ds_.get(), &total) < 0) fail("cannot extend dataset");
        const void* data = mask[i] ? static_cast<const void*>(full_[i].data()) : packed_[i].data();
        if (H5Dwrite_chunk(ds_.get(), H5P_DEFAULT, mask[i], &start, size[i], data) < 0)
            fail("cannot write dataset (disk full or file-size limit?)");
        written_ = total;
    }
    full_.erase(full_.begin(), full_.begin() + std::ptrdiff_t(count));  // the buffers back to the chunk-block pool
    packed_.clear();   // (common/chunk_buffer.h), for whichever dataset fills a batch next
}

void Appender::flush() {
    settle();
    const std::size_t chunk_bytes = chunk_elems_ * elem_, used = buf_.size();
    if (direct_ && used && !full_.empty()) {  // the partial last chunk zero-filled past the data
        buf_.resize(chunk_bytes);             // (filtered whole, as libhdf5's pipeline does),
        std::memset(buf_.data() + used, 0, chunk_bytes - used);  // compressed with the batch
        full_.push_back(std::move(buf_));
        buf_.clear();
        flush_full(used);
        return;
    }
    flush_full();
    if (buf_.empty()) return;
    const hsize_t n = used / elem_, start = written_, total = written_ + n;
    if (H5Dset_extent(ds_.get(), &total) < 0) fail("cannot extend dataset");
    if (direct_) {  // a dataset of less than a chunk: padded in the thread's shared zeros
        XXH3_64bits_update(hash_.get(), buf_.data(), used);
        FlushScratch& s = flush_scratch;
        if (s.pad.size() < chunk_bytes) {  // zeros past what it held
            const std::size_t had = s.pad.size();
            s.pad.resize(chunk_bytes);
            std::memset(s.pad.data() + had, 0, chunk_bytes - had);
        }
        std::memcpy(s.pad.data(), buf_.data(), used);
        const unsigned char* data = s.pad.data();
        struct Rezero {  // pad is all zeros again on every way out, a throw included
            ChunkBuffer& pad;
            std::size_t n;
            ~Rezero() { std::memset(pad.data(), 0, n); }
        } rezero{s.pad, used};
        std::size_t size = chunk_bytes;
        uint32_t mask = 0;
        if (level_ == kZstdStore && store_declines(data, size)) {
            mask = 1;  // the optional zstd filter (the only one) skipped, as libhdf5 marks it
        } else {
            if (shuffle_) {
                if (s.shuffled.size() < chunk_bytes) s.shuffled.resize(chunk_bytes);
                shuffle_bytes(data, s.shuffled.data(), chunk_bytes, elem_);
                data = s.shuffled.data();
            }
            if (s.packed.size() < ZSTD_compressBound(chunk_bytes)) s.packed.resize(ZSTD_compressBound(chunk_bytes));
            size = zstd_compress_chunk(data, chunk_bytes, level_, match_, s.packed.data(), s.packed.size());
            if (size == 0) fail("cannot compress a chunk of dataset");
            data = s.packed.data();
        }
        if (H5Dwrite_chunk(ds_.get(), H5P_DEFAULT, mask, &start, size, data) < 0)
            fail("cannot write dataset (disk full or file-size limit?)");
        written_ = total;
        buf_.clear();
        return;
    }
    Handle fs(H5Dget_space(ds_.get()), H5Sclose);
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr);
    Handle ms(H5Screate_simple(1, &n, nullptr), H5Sclose);
    if (H5Dwrite(ds_.get(), type_, ms.get(), fs.get(), H5P_DEFAULT, buf_.data()) < 0)
        fail("cannot write dataset (disk full or file-size limit?)");
    written_ = total;
    buf_.clear();
}

uint64_t Appender::finish() {
    if (byte_mode_ && buf_.size() % elem_) {  // zero-pad the last element (hashed as stored)
        static constexpr unsigned char zeros[16] = {};
        const std::size_t pad = elem_ - buf_.size() % elem_;
        buf_.append(zeros, pad);
        if (!direct_) XXH3_64bits_update(hash_.get(), zeros, pad);  // direct: hashed with the chunk
    }
    flush();
    if (byte_mode_) set_attr(ds_.get(), "bytes", bytes_);
    set_attr(ds_.get(), "xxh3", uint64_t(XXH3_64bits_digest(hash_.get())));
    set_attr(ds_.get(), "count", count_);
    return H5Dget_storage_size(ds_.get());
}

DatasetReader::DatasetReader(hid_t file, const std::string& path, hid_t type, std::size_t elem)
    : type_(type), elem_(elem), path_(path) {
    if (!exists(file, path)) fail("dataset " + path + " is missing");
    ds_ = Handle(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds_) fail("dataset " + path + " cannot be opened");
    Handle t(H5Dget_type(ds_.get()), H5Tclose);
    if (H5Tget_size(t.get()) != elem || H5Tget_class(t.get()) != H5Tget_class(type))
        fail("dataset " + path + " has the wrong element type");
    Handle sp(H5Dget_space(ds_.get()), H5Sclose);
    if (H5Sget_simple_extent_ndims(sp.get()) != 1) fail("dataset " + path + " is not 1-D");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(sp.get(), &n, nullptr);
    count_ = n;
    if (get_attr_u64(ds_.get(), "count") != count_) fail("dataset " + path + " count attribute disagrees with its size");
    bytes_ = count_ * elem;
    if (H5Aexists(ds_.get(), "bytes") > 0) {
        bytes_ = get_attr_u64(ds_.get(), "bytes");
        if (bytes_ > count_ * elem || (count_ > 0 && bytes_ <= (count_ - 1) * elem))
            fail("dataset " + path + " bytes attribute disagrees with its size");
    }
    // Every stored chunk must be of a size a 1-D chunk of this dataset can have (zstd's
    // worst case included): HDF5 allocates a chunk's stored size before reading it, so a
    // damaged chunk index would otherwise ask for gigabytes (found by fuzz_container).
    Handle dcpl(H5Dget_create_plist(ds_.get()), H5Pclose);
    if (dcpl && H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
        hsize_t chunk = 0;
        if (H5Pget_chunk(dcpl.get(), 1, &chunk) != 1 || chunk == 0 || chunk > (hsize_t(64) << 20) / elem)
            fail("dataset " + path + " has a malformed chunk size");
        const hsize_t chunk_bytes = chunk * elem, most = chunk_bytes + chunk_bytes / 128 + 65536;
        hsize_t nchunks = 0;
        if (H5Dget_num_chunks(ds_.get(), sp.get(), &nchunks) < 0 || nchunks > count_ / chunk + 1)
            fail("dataset " + path + " has a malformed chunk index");
        for (hsize_t c = 0; c < nchunks; ++c) {
            hsize_t off = 0, size = 0;
            unsigned mask = 0;
            haddr_t addr = 0;
            if (H5Dget_chunk_info(ds_.get(), sp.get(), c, &off, &mask, &addr, &size) < 0 || size > most)
                fail("dataset " + path + " has a damaged chunk (stored size " + std::to_string(size) + ")");
        }
        // exactly [zstd] or [shuffle of elem-byte elements, zstd] (Appender's datasets), with
        // the memory type as the file's (no conversion to do): read whole chunks and run the
        // pipeline here (shuffle.h; a decoded chunk serves every read inside it, where
        // libhdf5 sets up each read anew); anything else: libhdf5's
        unsigned flags = 0, cd[4] = {};
        size_t nc = 4;
        char name[16];
        const int nf = H5Pget_nfilters(dcpl.get());
        const H5Z_filter_t f0 = nf >= 1 ? H5Pget_filter2(dcpl.get(), 0, &flags, &nc, cd, sizeof name, name, nullptr) : -1;
        const bool shuffle = nf == 2 && f0 == H5Z_FILTER_SHUFFLE && nc == 1 && cd[0] == elem &&
                             (nc = 4, H5Pget_filter2(dcpl.get(), 1, &flags, &nc, cd, sizeof name, name, nullptr)) == kZstdFilter;
        if ((shuffle || (nf == 1 && f0 == kZstdFilter)) && H5Tequal(t.get(), type) > 0) {
            chunk_ = chunk;
            most_ = most;
            shuffled_ = shuffle;
        }
    }
}

namespace {
/// A chunk as H5Dread_chunk gave it (`stored`, its filter mask) decoded into `out` (nbytes:
/// zstd undone, then the byte shuffle where it was applied; a stored-as-is chunk trades
/// buffers with `stored`). False when damaged. Runs on any thread (its scratch is the
/// thread's).
bool decode_stored(ChunkBuffer& stored, uint32_t mask, bool shuffled, std::size_t elem, std::size_t nbytes,
                   ChunkBuffer& out) {
    out.resize(nbytes);
    const bool unshuffle = shuffled && !(mask & 1);  // shuffle applied (filter 0)
    const unsigned char* p = stored.data();
    if (!(mask & (shuffled ? 2u : 1u))) {  // zstd applied (the last filter): into out unless unshuffled after
        if (unshuffle) read_scratch.plain.resize(nbytes);
        unsigned char* dst = unshuffle ? read_scratch.plain.data() : out.data();
        const unsigned long long n = ZSTD_getFrameContentSize(stored.data(), stored.size());
        if (n != nbytes || ZSTD_decompressDCtx(zstd_ctx.d, dst, nbytes, stored.data(), stored.size()) != nbytes) return false;
        p = dst;
    } else if (stored.size() != nbytes) {
        return false;
    }
    if (unshuffle) unshuffle_bytes(p, out.data(), nbytes, elem);
    else if (p != out.data()) out.swap(stored);  // stored as it is: the buffers trade places, no copy
    return true;
}
}  // namespace

bool DatasetReader::read_stored(uint64_t c, ChunkBuffer& stored, uint32_t& mask) const {
    const hsize_t off = c * chunk_;
    hsize_t size = 0;
    if (H5Dget_chunk_storage_size(ds_.get(), &off, &size) < 0 || size == 0) return false;  // never written
    if (size > most_) fail("dataset " + path_ + " has a damaged chunk");
    stored.resize(std::size_t(size));
    mask = 0;
    if (H5Dread_chunk(ds_.get(), H5P_DEFAULT, &off, &mask, stored.data()) < 0)
        fail("dataset " + path_ + " cannot be read (damaged chunk?)");
    return true;
}

void DatasetReader::read_ahead(uint64_t c) const {
    const uint64_t chunks = (count_ + chunk_ - 1) / chunk_;
    // as many chunks as the pool has threads (memory: 2 chunks each, kept by this reader)
    const std::size_t k = std::size_t(std::min<uint64_t>(std::min<uint64_t>(kReadAhead, codec::cpu_threads()), chunks - c));
    const std::size_t nbytes = std::size_t(chunk_ * elem_);
    ahead_.resize(kReadAhead);
    ahead_stored_.resize(kReadAhead);
    ahead_state_.assign(kReadAhead, kAheadNone);
    ahead_first_ = c;
    std::vector<uint32_t> masks(k, 0);
    for (std::size_t i = 0; i < k; ++i) {  // libhdf5 from this thread only
        try {
            ahead_state_[i] = read_stored(c + i, ahead_stored_[i], masks[i]) ? kAheadStored : kAheadZero;
        } catch (const std::exception&) {
            break;  // left to chunk_bytes' own read, which throws when that chunk is asked for
        }
    }
    codec::parallel_items(k, [&](unsigned, std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i)
            if (ahead_state_[i] == kAheadStored)
                ahead_state_[i] = decode_stored(ahead_stored_[i], masks[i], shuffled_, elem_, nbytes, ahead_[i]) ? kAheadReady
                                                                                                                : kAheadNone;
    });
}

const ChunkBuffer& DatasetReader::chunk_bytes(uint64_t c) const {
    if (c == cached_) return chunk_buf_;
    const std::size_t nbytes = std::size_t(chunk_ * elem_);
    cached_ = UINT64_MAX;
    const bool in_order = c == last_chunk_ + 1;
    last_chunk_ = c;
    // in-order reads decode the next kReadAhead chunks at once in the worker pool; chunks
    // are read (H5Dread_chunk) on this thread, in order
    if (in_order && codec::cpu_threads() > 1 && (c < ahead_first_ || c >= ahead_first_ + kReadAhead || ahead_state_[c - ahead_first_] == kAheadNone))
        read_ahead(c);
    if (c >= ahead_first_ && c < ahead_first_ + kReadAhead) {
        const uint8_t st = ahead_state_[c - ahead_first_];
        ahead_state_[c - ahead_first_] = kAheadNone;  // taken
        if (st == kAheadReady) {
            chunk_buf_.swap(ahead_[c - ahead_first_]);
            cached_ = c;
            return chunk_buf_;
        }
        if (st == kAheadZero) {
            chunk_buf_.resize(nbytes);
            std::memset(chunk_buf_.data(), 0, nbytes);  // never written: the fill value, as in libhdf5
            cached_ = c;
            return chunk_buf_;
        }
    }
    ChunkBuffer& stored = read_scratch.stored;  // grown once per thread: no allocation per chunk
    uint32_t mask = 0;
    if (!read_stored(c, stored, mask)) {
        chunk_buf_.resize(nbytes);
        std::memset(chunk_buf_.data(), 0, nbytes);  // never written: the fill value, as in libhdf5
    } else if (!decode_stored(stored, mask, shuffled_, elem_, nbytes, chunk_buf_)) {
        fail("dataset " + path_ + " cannot be read (damaged chunk?)");
    }
    cached_ = c;
    return chunk_buf_;
}

void DatasetReader::read_chunked(uint64_t byte_offset, uint64_t n, unsigned char* out) const {
    const uint64_t cb = chunk_ * elem_;
    for (uint64_t b = byte_offset; b < byte_offset + n;) {
        const uint64_t c = b / cb, in = b - c * cb, take = std::min(cb - in, byte_offset + n - b);
        std::memcpy(out, chunk_bytes(c).data() + in, std::size_t(take));
        out += take;
        b += take;
    }
}

void DatasetReader::note_read(uint64_t byte_offset, const void* p, uint64_t n) const {
    if (!in_order_ || byte_offset + n <= hashed_) return;  // stale, or bytes already hashed
    if (byte_offset > hashed_) {  // a gap: checksum_ok reads everything again
        in_order_ = false;
        return;
    }
    const uint64_t skip = hashed_ - byte_offset;
    XXH3_64bits_update(running_.get(), static_cast<const unsigned char*>(p) + skip, std::size_t(n - skip));
    hashed_ = byte_offset + n;
}

void DatasetReader::read(uint64_t offset, uint64_t n, void* out) const {
    if (offset > count_ || n > count_ - offset) fail("read past the end of dataset " + path_);
    if (n == 0) return;
    if (chunk_) {
        read_chunked(offset * elem_, n * elem_, static_cast<unsigned char*>(out));
    } else {
        const hsize_t start = offset, cnt = n;
        Handle fs(H5Dget_space(ds_.get()), H5Sclose);
        H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
        Handle ms(H5Screate_simple(1, &cnt, nullptr), H5Sclose);
        if (H5Dread(ds_.get(), type_, ms.get(), fs.get(), H5P_DEFAULT, out) < 0)
            fail("dataset " + path_ + " cannot be read (damaged chunk?)");
    }
    note_read(offset * elem_, out, n * elem_);
}

const void* DatasetReader::view_at(uint64_t b, uint64_t nb) const {
    if (!chunk_ || nb == 0) return nullptr;
    const uint64_t cb = chunk_ * elem_, c = b / cb;
    if ((b + nb - 1) / cb != c) return nullptr;  // across a chunk end
    const unsigned char* p = chunk_bytes(c).data() + (b - c * cb);
    note_read(b, p, nb);
    return p;
}

const void* DatasetReader::view(uint64_t offset, uint64_t n) const {
    if (offset > count_ || n > count_ - offset) fail("read past the end of dataset " + path_);
    return view_at(offset * elem_, n * elem_);
}

const void* DatasetReader::view_bytes(uint64_t offset, uint64_t n) const {
    if (offset > bytes_ || n > bytes_ - offset) fail("read past the end of dataset " + path_);
    return view_at(offset, n);
}

void DatasetReader::read_bytes(uint64_t offset, uint64_t n, void* out) const {
    if (offset > bytes_ || n > bytes_ - offset) fail("read past the end of dataset " + path_);
    if (n == 0) return;
    if (elem_ == 1) return read(offset, n, out);
    if (chunk_) {  // straight from the decoded chunk
        read_chunked(offset, n, static_cast<unsigned char*>(out));
        return note_read(offset, out, n);
    }
    const uint64_t e0 = offset / elem_, e1 = (offset + n + elem_ - 1) / elem_;
    auto* o = static_cast<unsigned char*>(out);
    if (offset % elem_ == 0 && n % elem_ == 0) return read(e0, e1 - e0, o);  // whole elements: no copy
    thread_local std::vector<unsigned char> tmp;
    tmp.resize((e1 - e0) * elem_);
    read(e0, e1 - e0, tmp.data());
    std::memcpy(o, tmp.data() + (offset - e0 * elem_), n);
}

bool DatasetReader::checksum_ok() const {
    if (!in_order_) {  // a read skipped ahead: hash from the start
        XXH3_64bits_reset(running_.get());
        hashed_ = 0;
        in_order_ = true;
    }
    // read what the reads so far left (note_read hashes it; for a dataset of bytes, at
    // least the padding as stored)
    const uint64_t step = std::max<uint64_t>(1, (1u << 20) / elem_);
    std::vector<unsigned char> buf;
    for (uint64_t off = hashed_ / elem_; off < count_; off += step) {
        const uint64_t n = std::min(step, count_ - off);
        buf.resize(std::size_t(n * elem_));
        read(off, n, buf.data());
    }
    return XXH3_64bits_digest(running_.get()) == stored_xxh3();
}

uint64_t DatasetReader::stored_xxh3() const {
    return get_attr_u64(ds_.get(), "xxh3");
}

}  // namespace ckpt::container
