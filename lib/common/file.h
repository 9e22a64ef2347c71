// Crash-safe outputs (temporary name in the same folder, fsync, rename), the never-clobber
// rule for output paths, and a cheap HDF5 signature test. docs/design.md §6.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

/// A file written under "<dir>/.<name>.tmp-<pid>-<n>" and renamed onto `path` by commit()
/// after fsync (file and folder). Destroying it without commit() removes the temporary.
class AtomicOutput {
public:
    explicit AtomicOutput(std::string path);
    ~AtomicOutput();
    AtomicOutput(const AtomicOutput&) = delete;
    AtomicOutput& operator=(const AtomicOutput&) = delete;
    const std::string& temp_path() const { return temp_; }
    /// fsync the temporary, rename it onto the final path, fsync the folder.
    /// Throws std::runtime_error (message names the path and errno text).
    void commit();

private:
    std::string path_, temp_;
    bool done_ = false;
};

/// Write `text` to `path` crash-safely: an AtomicOutput temporary written by FileWriter
/// (fsync), renamed onto `path`, folder fsynced. Throws std::runtime_error naming the path
/// (the temporary is removed).
void write_text_atomic(const std::string& path, const std::string& text);

/// fsync a path (file or folder). Throws std::runtime_error.
void fsync_path(const std::string& path);

/// The never-clobber rule (as zstd and gzip), checked before any work starts. Throws
/// BadInput(output, reason) when an output is one of the inputs (same device and inode when
/// the output exists, else the same canonical folder + name: symlinks, hard links and ".."
/// all count), when an output is a folder or not a regular file, when one path is given for two outputs, or when
/// an output already exists and `force` is false. Empty paths (an output not asked for)
/// are skipped.
void check_outputs(const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                   bool force);

/// Where HDF5 finds its signature in the open file `fd` of `size` bytes: the first of
/// offsets 0, 512, 1024, 2048, ... that holds it (HDF5 file format spec, "Superblock");
/// nullopt when none does. Throws std::system_error when a read fails.
std::optional<uint64_t> hdf5_signature_at(int fd, uint64_t size);

/// True when `path` is a readable regular file without the HDF5 superblock signature (at
/// offset 0, 512, 1024, 2048, ...): certainly not a container. False when it has one, or
/// cannot be read (the reader then reports why).
bool readable_non_hdf5(const std::string& path);

/// Sequential writer with positional patching, for restore outputs. Throws
/// std::runtime_error on any write failure (disk full, file-size limit). Small sequential
/// pieces (writes and skips under 64 KiB, skips as zeros) are gathered in a 1 MiB buffer
/// that reaches the file at the next large piece, pwrite, or close: a file of 10^5 small tensors is then
/// written in few system calls. Data not closed is lost (callers close, or discard the file).
class FileWriter {
public:
    explicit FileWriter(const std::string& path);
    /// A writer into the open descriptor `fd` (a duplicate of it; the package's memfd),
    /// truncated to `size` bytes first, so that skipped bytes read as zeros; `name` names it
    /// in errors.
    FileWriter(int fd, uint64_t size, std::string name);
    ~FileWriter();
    void write(const void* data, uint64_t n);
    /// After the buffered bytes. Several threads may pwrite at once (disjoint ranges) once
    /// nothing is buffered (flush_buffered, and no write / skip since).
    void pwrite(uint64_t offset, const void* data, uint64_t n);
    /// Write the buffered bytes now.
    void flush_buffered() { flush(); }
    void skip(uint64_t n);   ///< leave n bytes to be filled by pwrite (zeros until then)
    void close();   ///< flush, fsync and close
    uint64_t offset() const { return off_; }

private:
    void flush();
    void pwrite_now(uint64_t offset, const char* p, uint64_t n);
    static constexpr std::size_t kBuffer = 1 << 20, kZeroSkip = 64 * 1024;  ///< kZeroSkip: the small-piece bound
    std::string path_;
    int fd_ = -1;
    uint64_t off_ = 0;           ///< logical end: buffered bytes included
    std::vector<char> buf_;      ///< bytes [off_ - buf_.size(), off_)
};

}  // namespace ckpt
